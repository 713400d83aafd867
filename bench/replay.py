"""Hit rate vs host ratio on a trace: a thin wrapper around ``hicache replay``.

    python bench/replay.py                                    # built-in chat workload
    python bench/replay.py --trace ../shared/data/mooncake_synthetic_trace.jsonl \
        --model deepseek-v4-flash --layers 4 --hicache-ratio 1,2,4

Same flags as ``hicache replay``; unless ``--plot`` is given, the plot goes to the
git-ignored results folder, bench/results/local/replay_hit_rate.png (its path is printed),
never over the tracked bench/results/replay_hit_rate.png.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import RESULTS_DIR  # noqa: E402
from hicache.cli import main  # noqa: E402

PLOT = RESULTS_DIR / "replay_hit_rate.png"

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a == "--plot" or a.startswith("--plot=") for a in argv):
        argv += ["--plot", str(PLOT)]
    sys.exit(main(["replay", *argv]))
