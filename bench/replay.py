"""Hit rate vs host ratio on a request trace: a thin wrapper around ``hicache replay``.

    python bench/replay.py                                    # built-in chat workload
    python bench/replay.py --trace ../shared/data/mooncake_synthetic_trace.jsonl \
        --model deepseek-v4-flash --layers 4 --hicache-ratio 1,2,4

Same flags as ``python -m hicache.cli replay``; unless ``--plot`` is given, the plot goes
next to the other results, bench/results/replay_hit_rate.png (its path is printed).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hicache.cli import main  # noqa: E402

PLOT = Path(__file__).resolve().parent / "results" / "replay_hit_rate.png"

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a == "--plot" or a.startswith("--plot=") for a in argv):
        argv += ["--plot", str(PLOT)]
    sys.exit(main(["replay", *argv]))
