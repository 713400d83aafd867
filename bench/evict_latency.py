"""What write-back moves onto eviction: the device -> host copy before a device page is freed.

    python bench/evict_latency.py                       # DeepSeek-V4 Flash, 43 layers, leaves of 4 and 16 pages
    python bench/evict_latency.py --layers 4 --leaves 8 --pages 1,4   # smaller
    python bench/evict_latency.py --device cuda         # on a GPU: the copy is timed there

Under ``write_through`` a page was copied to the host when it was inserted, so evicting it
from the device only gives its slots back. Under ``write_back`` the device holds the only
copy: `HiRadixCache.evict` backs the leaf up (history and DeepSeek-V4 snapshot) and waits
for the ack before it frees the slots, so a request short of device room waits for that
copy. Per policy and leaf size this bench fills the device with leaves of the same size,
each with its snapshot (as a prompt's end leaves it), then evicts them one leaf per
``evict`` call (the request that needs room for one leaf), and reports per eviction:
bytes copied D2H, backup ops and copy batches launched, and the call's wall time p50 /
p99. It also reports the insert side: the D2H bytes write-through spends at insert time
for pages it will evict anyway, and for those it never evicts.

On the CPU the copies are memcpys inside ``start_writing``: the time is labelled CPU.
The GPU estimate beside it is the bytes at the D2H rate measured on an H100
(`H100_D2H_GBPS`: DeepSeek-V4-Pro, 16 pages, GPU span 0.90 of the 55 GB/s pinned copy) plus
that machine's host work of one backup launch and poll (`H100_BACKUP_HOST_US`), both from
docs/RESULTS.md, since the eviction waits for the ack. JSON:
bench/results/local/evict_latency_<device>.json (``--out`` names another path).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.harness import RESULTS_DIR, device_slug, format_table, write_json  # noqa: E402
from hicache import HiCacheConfig, build  # noqa: E402
from hicache.cli.checks import stack_from_flags  # noqa: E402
from hicache.radix import HiRadixCache  # noqa: E402

H100_D2H_GBPS = 0.90 * 55.0  # docs/RESULTS.md, "Whole loads on an H100": D2H GPU span 0.90 of the limit
H100_BACKUP_HOST_US = 300.0  # same machine, `bench/controller.py`: tree step start_writing 300 us


class Counted:
    """The controller's D2H launches (``start_writing`` calls with ops not yet acked)."""

    def __init__(self, ctrl) -> None:
        self.batches, start = 0, ctrl.start_writing

        def counted():
            self.batches += ctrl.pending() > 0
            return start()
        ctrl.start_writing = counted


def _d2h(ctrl) -> tuple[int, int]:
    d2h = ctrl.stats()["d2h"]
    return sum(d2h["bytes"].values()), d2h["ops"]


def fill(tree: HiRadixCache, cache, pages: int, first: int) -> tuple[int, int]:
    """Insert leaves of ``pages`` pages (each with its snapshot) until the device is full;
    every leaf a different first page. Returns (leaves, next first token id)."""
    page, anchor = tree.page_size, cache.device_pools[tree.anchor]
    leaves = 0
    while True:
        slots = anchor.alloc(pages * page)
        snap = {root: cache.device_pools[root].alloc(size) for root, size in tree.state_sizes.items()}
        if slots is None or any(s is None for s in snap.values()):
            for root, s in snap.items():
                if s is not None:
                    cache.device_pools[root].free(s)
            if slots is not None:
                anchor.free(slots)
            return leaves, first
        tokens = torch.arange(first, first + pages * page, dtype=torch.int64)
        tree.insert(tokens, slots, extra=snap or None)
        tree.ctrl.start_writing()
        tree.poll()
        tree.wait()
        leaves, first = leaves + 1, first + pages * page


def measure(args, policy: str, pages: int) -> dict:
    stack = stack_from_flags(args.model, args.layers)
    config = HiCacheConfig(hicache_ratio=args.ratio, write_policy=policy, io_backend="auto",
                           host_headroom_gb=args.headroom)
    cache = build(stack, args.device_tokens, config, device=args.device)
    try:
        tree = HiRadixCache(cache, storage=None)
        counted = Counted(cache.controller)
        leaves, _ = fill(tree, cache, pages, 0)
        insert_bytes, _ = _d2h(cache.controller)
        times, per_bytes, per_ops, per_batches = [], [], [], []
        for _ in range(min(leaves, args.leaves)):
            b0, o0, k0 = *_d2h(cache.controller), counted.batches
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            freed = tree.evict(pages * stack.page_size)
            times.append((time.perf_counter() - t0) * 1e6)
            b1, o1 = _d2h(cache.controller)
            per_bytes.append(b1 - b0)
            per_ops.append(o1 - o0)
            per_batches.append(counted.batches - k0)
            assert freed >= pages * stack.page_size, (policy, freed)
        tree.check_integrity()
    finally:
        cache.close()
    mb = float(np.mean(per_bytes)) / 1e6
    return {"policy": policy, "pages_per_leaf": pages, "leaves_evicted": len(times),
            "mb_d2h_per_eviction": round(mb, 3), "backup_ops_per_eviction": float(np.mean(per_ops)),
            "batches_per_eviction": float(np.mean(per_batches)),
            f"{args.device}_p50_us": round(float(np.percentile(times, 50)), 1),
            f"{args.device}_p99_us": round(float(np.percentile(times, 99)), 1),
            "h100_estimate_us": round(mb * 1e6 / (H100_D2H_GBPS * 1e3) + (H100_BACKUP_HOST_US if mb else 0), 1),
            "mb_d2h_at_insert_per_leaf": round(insert_bytes / max(leaves, 1) / 1e6, 3)}


def page_counts(text: str) -> list[int]:
    """``--pages``: positive integers, comma-separated."""
    counts = [int(x) for x in text.split(",")]
    if min(counts) < 1:
        raise ValueError(text)
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v4-flash")
    p.add_argument("--layers", type=int, default=None, help="default: every layer of the preset")
    p.add_argument("--device-tokens", type=int, default=32768)
    p.add_argument("--ratio", type=float, default=2.0)
    p.add_argument("--pages", type=page_counts, default=[4, 16], help="pages per leaf, comma-separated")
    p.add_argument("--leaves", type=int, default=24, help="evictions timed per case (at most the leaves that fit)")
    p.add_argument("--headroom", type=float, default=0.25, help="GiB of host memory left free")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = [measure(args, policy, n) for n in args.pages
            for policy in ("write_through", "write_back")]
    print(format_table(rows, list(rows[0])))
    out = Path(args.out) if args.out else RESULTS_DIR / f"evict_latency_{device_slug(torch.device(args.device))}.json"
    print(f"json: {write_json(out, rows, vars(args), torch.device(args.device))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
