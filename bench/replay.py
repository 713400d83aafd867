"""Hit rate vs host ratio on a trace: a thin wrapper around ``hicache replay``; and the cost
of the replay's bounds alone.

    python bench/replay.py                                    # built-in chat workload
    python bench/replay.py --trace data/mooncake_synthetic_trace.jsonl.xz \\
        --model deepseek-v4-flash --layers 4 --hicache-ratio 1,2,4 [--out PNG]
    python bench/replay.py --bounds [--copies 3]              # time the bounds (no replay)

Same flags as ``hicache replay``, plus ``--out`` (the plot's path, like ``--plot``); unless
one is given, the plot goes to the git-ignored results folder,
bench/results/local/replay_hit_rate.png (its path is printed), never over the tracked
bench/results/replay_hit_rate.png.

``--bounds`` times `hicache.replay.bounds` on the shipped trace repeated ``--copies``
times (3: a 12k-request trace; each copy with its own block ids, so the copies share
nothing), at pages of 64 and 256 tokens and four capacities: the set-up (naming the
blocks, their runs and next accesses) and each capacity's LRU and Belady, wall-clock
seconds on this machine (one run each: a shared machine makes them noisy). JSON to
bench/results/local/replay_bounds.json.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.harness import RESULTS_DIR, format_table, write_json  # noqa: E402
from hicache.cli import main  # noqa: E402

PLOT = RESULTS_DIR / "replay_hit_rate.png"
TRACE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic_trace.jsonl.xz"
CAPACITIES = (262144, 524288, 1048576, 1310720)  # device tokens x (1, 2, 4, 5): ratio 0, 1, 3, 4 of 262,144


def replay_argv(argv: list[str]) -> list[str]:
    """``hicache replay``'s arguments: ``--out X`` becomes ``--plot X``; no plot flag: `PLOT`."""
    out = []
    for a in argv:  # every bench takes --out; for this one it names the plot
        out.append("--plot" if a == "--out" else "--plot=" + a[6:] if a.startswith("--out=") else a)
    if not any(a == "--plot" or a.startswith("--plot=") for a in out):
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)  # the default folder, ours to create
        out += ["--plot", str(PLOT)]
    return ["replay", *out]


def repeated_trace(copies: int) -> list:
    """The shipped trace ``copies`` times over, each copy's block ids shifted past the last's."""
    from hicache.replay.workload import load_trace
    base = load_trace(TRACE)
    shift = 1 + max(h for r in base for h in r.hash_ids)
    return [r._replace(hash_ids=tuple(h + c * shift for h in r.hash_ids)) for c in range(copies) for r in base]


def time_bounds(copies: int) -> list[dict]:
    """One row per (page size, capacity): the bounds and the seconds they took."""
    from hicache.replay.bounds import TraceBounds
    trace = repeated_trace(copies)
    rows = []
    for page in (64, 256):
        t0 = time.perf_counter()
        bounds = TraceBounds(trace, page)
        setup = time.perf_counter() - t0
        for capacity in CAPACITIES:
            t0 = time.perf_counter()
            b = bounds.at(capacity)
            rows.append({"requests": len(trace), "page": page, "capacity_tokens": capacity,
                         "setup_s": round(setup, 3), "capacity_s": round(time.perf_counter() - t0, 3),
                         "ideal_lru": round(b.lru, 4), "belady": round(b.belady, 4), "infinite": round(b.infinite, 4)})
    return rows


def bounds_main(argv: list[str]) -> int:
    copies = int(argv[argv.index("--copies") + 1]) if "--copies" in argv else 3
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else RESULTS_DIR / "replay_bounds.json"
    rows = time_bounds(copies)
    print(format_table(rows, list(rows[0])))
    print(f"json: {write_json(out, rows, {'trace': TRACE.name, 'copies': copies}, torch.device('cpu'))}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(bounds_main(args) if "--bounds" in args else main(replay_argv(args)))
