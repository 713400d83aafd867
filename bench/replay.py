"""Hit rate vs host ratio on a trace: a thin wrapper around ``hicache replay``.

    python bench/replay.py                                    # built-in chat workload
    python bench/replay.py --trace data/mooncake_synthetic_trace.jsonl.xz \
        --model deepseek-v4-flash --layers 4 --hicache-ratio 1,2,4 [--out PNG]

Same flags as ``hicache replay``, plus ``--out`` (the plot's path, like ``--plot``); unless
one is given, the plot goes to the git-ignored results folder,
bench/results/local/replay_hit_rate.png (its path is printed), never over the tracked
bench/results/replay_hit_rate.png.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import RESULTS_DIR  # noqa: E402
from hicache.cli import main  # noqa: E402

PLOT = RESULTS_DIR / "replay_hit_rate.png"


def replay_argv(argv: list[str]) -> list[str]:
    """``hicache replay``'s arguments: ``--out X`` becomes ``--plot X``; no plot flag: `PLOT`."""
    out = []
    for a in argv:  # every bench takes --out; for this one it names the plot
        out.append("--plot" if a == "--out" else "--plot=" + a[6:] if a.startswith("--out=") else a)
    if not any(a == "--plot" or a.startswith("--plot=") for a in out):
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)  # the default folder, ours to create
        out += ["--plot", str(PLOT)]
    return ["replay", *out]


if __name__ == "__main__":
    sys.exit(main(replay_argv(sys.argv[1:])))
