"""Benchmark: does `PageAllocator` alloc + free of 4096 slots cost the same at any pool size?

Question (the issue's target): a 10-million-slot pool allocates and frees 4096 slots in
well under a millisecond, at a cost independent of the pool size.

Method: for each pool, warm up, then time ``alloc(4096)`` followed by ``free(slots)``
(one pair per repetition, ``time.perf_counter_ns``) and report p20/p50/p80 in µs. The pool
is half full during timing so the free list is neither empty nor pristine. CPU only:
the allocator is host code, so no device timing applies.

    python bench/allocator.py [--reps 200] [--warmup 20] [--out bench/results/local/allocator_cpu.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from bench import harness  # noqa: E402
from host_pools.allocator import PageAllocator  # noqa: E402

ALLOC_SLOTS = 4096
# (num_slots, page_size): row allocators of growing size, and a paged pool of exactly 64 pages
CASES = ((10_000, 1), (1_000_000, 1), (10_000_000, 1), (4096, 64))
DEFAULT_OUT = harness.RESULTS_DIR / "allocator_cpu.json"


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux), and the core count."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"cpu ({name}, {os.cpu_count()} cores)"


def time_case(num_slots: int, page_size: int, reps: int, warmup: int) -> dict:
    """p20/p50/p80 (µs) of one ``alloc(4096)`` + ``free`` pair on a half-full pool."""
    alloc = PageAllocator(num_slots, page_size)
    # hold half the pool (but leave room for the timed call) so the free list is mid-stack
    held = alloc.alloc(max(0, (num_slots // 2 - ALLOC_SLOTS) // page_size * page_size))
    samples = np.empty(reps, dtype=np.int64)
    for i in range(warmup + reps):
        t0 = time.perf_counter_ns()
        slots = alloc.alloc(ALLOC_SLOTS)
        alloc.free(slots)
        t1 = time.perf_counter_ns()
        if i >= warmup:
            samples[i - warmup] = t1 - t0
    if held is not None:
        alloc.free(held)
    alloc.check_integrity()
    p20, p50, p80 = np.percentile(samples, [20, 50, 80]) / 1e3
    return {"num_slots": num_slots, "page_size": page_size, "alloc_slots": ALLOC_SLOTS,
            "p20_us": round(float(p20), 2), "p50_us": round(float(p50), 2), "p80_us": round(float(p80), 2)}


def format_table(rows: list[dict]) -> str:
    head = f"{'num_slots':>12}{'page_size':>11}{'alloc_slots':>13}{'p20 µs':>10}{'p50 µs':>10}{'p80 µs':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['num_slots']:>12,}{r['page_size']:>11}{r['alloc_slots']:>13}"
                     f"{r['p20_us']:>10.1f}{r['p50_us']:>10.1f}{r['p80_us']:>10.1f}")
    return "\n".join(lines)


def run(argv: list[str] | None = None) -> int:
    """Run every case, print the table and write the JSON result; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--reps", type=int, default=200, help="timed repetitions per case")
    p.add_argument("--warmup", type=int, default=20, help="untimed repetitions first")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON result path")
    args = p.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    rows = [time_case(n, ps, args.reps, args.warmup) for n, ps in CASES]
    result = {
        "bench": "allocator",
        "device": cpu_name(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__},
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {"reps": args.reps, "warmup": args.warmup, "timed": "alloc + free, perf_counter_ns"},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"PageAllocator alloc({ALLOC_SLOTS}) + free, {result['device']}")
    print(format_table(rows))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
