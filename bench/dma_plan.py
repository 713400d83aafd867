"""What the ``"dma"`` backend issues for one load of a real model: pieces and calls (CPU).

Question answered: with the host layout as it is (``page_first``: one row holds every layer
of one pool), how big are the DMA pieces of a load, per pool, if each launch group copied
its own layers (a piece per page x pool x group), and how big are they with the backend's
chunks (>= ``tuning.DMA_PIECE_BYTES`` of consecutive layers, or the whole row)? And how
many runtime calls does each launch group make? The load runs behind the controller on the
CPU with the DMA stand-in (a memmove per piece) and no kernel (``NullBackend``): the counts
are those the CUDA path makes; no device is needed and no time is measured but the host's
preparation.

    python bench/dma_plan.py                                   # DeepSeek-V4-Pro, 16 pages
    python bench/dma_plan.py --model deepseek-v4-flash --pages 64 --out x.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit
from pathlib import Path
from typing import Sequence

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hicache import HiCacheConfig, build  # noqa: E402
from hicache.models import preset  # noqa: E402
from host_pools.memory import HostBudget  # noqa: E402
from transfer_kernels import NullBackend, StagedBackend  # noqa: E402

BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)


class _Recording(StagedBackend):
    """Keeps the last size class laid out: its plan, groups and prepared object."""

    def lay_out(self, plan, groups, decided=None, keep=False, like=None):
        prepared = super().lay_out(plan, groups, decided, keep, like)
        self.last = (plan, groups, prepared)
        return prepared


def replay_per_group(staged: _Recording) -> list[list[int]]:
    """Another load of the last size class, group by group: per group the (DMA calls,
    event records, stream waits, kernel launches, pieces) it issued."""
    plan, groups, prepared = staged.last
    jobs = plan.jobs
    launches = prepared.start(jobs, [j.src_rows for j in jobs], [j.dst_rows for j in jobs])
    log = []
    for g in range(launches.num_groups):
        before = (staged.copies, staged.records, staged.waits, staged.kernel.launches, staged.pieces)
        launches.launch(g)
        after = (staged.copies, staged.records, staged.waits, staged.kernel.launches, staged.pieces)
        log.append([b - a for a, b in zip(before, after)])
    return log


def _load(model: str, pages: int) -> _Recording:
    stack = preset(model)
    staged = _Recording(NullBackend())
    config = HiCacheConfig(mem_layout="page_first", io_backend="torch", hicache_ratio=2.0,
                           swa_full_tokens_ratio=0.5)
    cache = build(stack, (2 * pages + 2) * stack.page_size, config, device="cpu", budget=BIG,
                  backend=staged)
    ctrl = cache.controller
    extra = {"swa": cache.device_pools["swa"].alloc(128)} if "swa" in cache.device_pools else {}
    host = ctrl.write(cache.device_pools[stack.anchor.name].alloc(pages * stack.page_size), extra)
    ctrl.start_writing()
    ctrl.poll()
    ctrl.load(host[stack.anchor.name], {k: host[k] for k in extra})
    ctrl.start_loading()
    if not all(a.success for a in ctrl.poll()):
        raise SystemExit("dma_plan: the load failed")
    staged.stack = stack
    return staged


def pieces_table(staged: _Recording) -> list[dict]:
    """Per pool: rows, row bytes, the per-group piece sizes and the backend's chunks."""
    plan, groups, prepared = staged.last
    layouts = {st.job: st for st in prepared.stages}
    out = []
    for j, job in enumerate(plan.jobs):
        rb = sum(job.src.row_bytes)
        per_group = [sum(1 for jj, _ in g if jj == j) * rb for g in groups]
        per_group = [b for b in per_group if b]
        st = layouts.get(j)
        out.append({
            "pool": job.src.name.split(".")[0], "rows": job.num_rows, "row_B": rb,
            "layers": job.src.num_layers, "span_B": rb * job.src.num_layers,
            "group_piece_min_B": min(per_group), "group_piece_med_B": int(statistics.median(per_group)),
            "group_piece_max_B": max(per_group), "group_pieces": len(per_group) * job.num_rows,
            "chunk_layers": None if st is None else f"{st.count.min()}-{st.count.max()}",
            "dma_piece_B": None if st is None else f"{st.count.min() * rb}-{st.count.max() * rb}",
            "chunks": None if st is None else int(st.first.size),
            "whole_rows": None if st is None else st.whole,
            "MB": round(job.num_bytes / 1e6, 2)})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/dma_plan.py", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="deepseek-v4-pro")
    p.add_argument("--pages", type=int, default=16)
    p.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    if args.pages < 1:
        p.error(f"--pages: must be >= 1, got {args.pages}")
    try:
        staged = _load(args.model, args.pages)
    except ValueError as exc:
        p.error(str(exc))
    plan, groups, prepared = staged.last
    jobs = plan.jobs
    rows = [j.src_rows for j in jobs], [j.dst_rows for j in jobs]
    prepare_us = min(timeit.repeat(lambda: prepared.start(jobs, *rows), number=20,
                                   repeat=5)) / 20 * 1e6
    log = replay_per_group(staged)
    table = pieces_table(staged)
    cols = list(table[0])
    print(f"{args.model}, {args.pages} pages, {len(groups)} launch groups, "
          f"{plan.num_bytes / 1e6:.1f} MB")
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for row in table:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")
    print("\nper group: DMA calls, event records, stream waits, kernel launches, pieces")
    for g, calls in enumerate(log):
        print(f"  {g:3d}: {calls}")
    print(f"\ndma preparation of a load of this size class (CPU, prepared): {prepare_us:.0f} us")
    if args.out is not None:
        args.out.write_text(json.dumps({"model": args.model, "pages": args.pages,
                                        "pools": table, "per_group": log,
                                        "prepare_us": prepare_us}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
