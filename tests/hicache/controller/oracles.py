"""Test-only oracles of the controller: the general form of a batch's jobs.

`plan_jobs` builds a batch's transfers keyed by (pool name, source pool) from the merged
slots, the obvious way; the controller's `BatchPlanner` must build exactly these jobs
(``tests/hicache/controller/test_planner.py``). It lived in the library until the library
stopped calling it.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from hicache.controller.batch import Op, merge, merged_once
from host_pools.spec import Stack
from transfer_kernels import CopyJob
from transfer_kernels.rows import first_duplicate


def plan_jobs(stack: Stack, ops: list[Op], tables: Callable[[str], tuple[Any, Any]],
              dst_pages: Mapping[str, int] | None = None) -> dict[tuple, CopyJob]:
    """Transfers of a batch keyed by (pool name, source pool), rows resolved from merged slots.

    Every op's slots were validated for their root's page when it was queued, and each
    op's destination slots were allocated distinct; so the rows are derived unchecked.

    Args:
        tables: pool name -> (source-tier table, destination-tier table).
        dst_pages: root pool -> destination page size; when given, slots handed out to
            two ops of the batch (freed and reallocated while queued) are refused.
    Raises:
        ValueError: a destination page twice in the batch (only with ``dst_pages``).
    """
    dst = merge(ops, "dst")
    # one call's pages come from one allocation per pool: distinct by construction
    if dst_pages is not None and len(ops) > 1 and merged_once(ops) is None:
        for root, slots in dst.items():
            _check_distinct(slots, dst_pages[root], root)
    src_rows = stack.derive_rows(merge(ops, "src"), check=False)
    dst_rows = stack.derive_rows(dst, check=False)
    jobs = {}
    for name, rows in src_rows.items():
        src_table, dst_table = tables(name)
        jobs[(name, stack.pool(name).indices_from or name)] = CopyJob(src_table, dst_table, rows,
                                                                       dst_rows[name])
    return jobs


def _check_distinct(slots: torch.Tensor, page_size: int, root: str) -> None:
    twice = first_duplicate(slots[::page_size])
    if twice is not None:
        raise ValueError(f"destination slots of pool {root!r}: page {twice} belongs to two "
                         f"ops of one batch (freed and allocated again while queued)")
