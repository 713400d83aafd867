"""Destination slots of queued ops: all-or-nothing allocation that survives a raising
allocator, and give-back that frees everything it can.

The controller's own allocators hand out whole pages (`alloc_pages_many`: one call per
pool for several ops); a server's allocator is called per pool and its slots coerced
(`alloc_all`).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Container, Mapping, NamedTuple, Sequence

import numpy as np
import torch

from hicache.controller.edge import as_slots
from host_pools.allocator import PageAllocator

log = logging.getLogger(__name__)


def alloc_all(src: Mapping[str, torch.Tensor], alloc: Callable, free: Callable,
              coerce: Container[str] | None = None) -> dict[str, torch.Tensor] | None:
    """``alloc(name, n)`` for every pool of ``src``, all or nothing.

    Args:
        coerce: pools whose allocator is not trusted to return int64 CPU tensors: their
            slots go through :func:`as_slots`; ``None`` means every pool.
    Returns:
        The slots per pool (int64 CPU tensors), or ``None`` when one allocator is short
        (everything taken so far is given back first).
    Raises:
        Whatever an allocator raises, or ValueError for slots of a bad type it handed out;
        everything taken so far is given back first.
    """
    taken: dict[str, Any] = {}
    try:
        for name, slots in src.items():
            got = alloc(name, slots.numel())
            if got is None:
                free_all(taken, free)
                return None
            taken[name] = got
        for name in [n for n in taken if coerce is None or n in coerce]:
            taken[name] = as_slots(taken[name], f"allocated slots of {name!r}")
        return taken
    except BaseException:  # an allocator raised (or returned junk): give back the rest
        free_all(taken, free)
        raise


def free_all(taken: Mapping[str, Any], free: Callable) -> list[str]:
    """``free(name, slots)`` for every entry even if some raise; returns those errors
    (each also logged): a rollback must give back everything it can."""
    errors = []
    for name, slots in taken.items():
        try:
            free(name, slots)
        except Exception as exc:  # keep freeing the others; the caller reports these
            errors.append(f"free of {name!r} raised {type(exc).__name__}: {exc}")
            log.error("hicache: %s", errors[-1])
    return errors


class OwnPages(NamedTuple):
    """Destination pages of several ops taken with one allocator call per pool."""

    slots: list[dict[str, torch.Tensor]]  # per op: its slots per pool (views of ``merged``)
    stamps: list[dict[str, tuple[np.ndarray, np.ndarray]]]  # per op: (pages, generations)
    merged: dict[str, torch.Tensor]  # per pool: every op's slots, op after op


def alloc_pages_many(allocators: Mapping[str, PageAllocator], srcs: Sequence[Mapping[str, torch.Tensor]],
                     label: Callable[[int, str], str], tier: str) -> OwnPages | None:
    """Whole pages for every op of ``srcs`` (source slots per pool): ONE ``alloc_pages``
    per pool for all ops together, split op after op, all or nothing.

    The pages of one call ascend, so every op's share ascends too, and its slots are a
    view of the pool's merged slots (the batch needs no further merge of them).

    Args:
        label: ``(op index, pool) -> argument name`` for errors.
        tier: ``"host"`` or ``"device"`` (for errors).
    Returns:
        The pages, or ``None`` when one pool is short (everything taken is given back).
    Raises:
        ValueError: an op's slots are not whole pages of the destination's page size
            (checked before anything is taken).
        Whatever an allocator raises, after everything taken so far is given back.
    """
    if len(srcs) == 1:
        return _alloc_one(allocators, srcs[0], label, tier)
    counts, totals = [], {}
    for i, src in enumerate(srcs):
        per = {}
        for name, slots in src.items():
            page = allocators[name].page_size
            per[name], rest = divmod(slots.numel(), page)
            if rest:
                raise ValueError(f"{label(i, name)}: {slots.numel()} slots are not whole {tier} "
                                 f"pages of {page}")
            totals[name] = totals.get(name, 0) + per[name]
        counts.append(per)
    taken: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    give_back = lambda n, got: allocators[n].free_pages(got[0])  # noqa: E731
    try:
        for name, total in totals.items():
            got = allocators[name].alloc_pages(total)
            if got is None:
                free_all(taken, give_back)
                return None
            taken[name] = got
    except BaseException:  # an allocator raised: give back what the others handed out
        free_all(taken, give_back)
        raise
    return _split(allocators, taken, counts)


def _alloc_one(allocators: Mapping[str, PageAllocator], src: Mapping[str, torch.Tensor],
               label: Callable[[int, str], str], tier: str) -> OwnPages | None:
    """:func:`alloc_pages_many` for one op (``write`` / ``load``: the hot path, lean)."""
    slots, taken = {}, {}
    try:
        for name, wanted in src.items():
            alloc = allocators[name]
            count, rest = divmod(wanted.numel(), alloc.page_size)
            got = None if rest else alloc.alloc_page_slots(count)
            if got is None:
                free_all(taken, lambda n, g: allocators[n].free_pages(g[0]))
                taken.clear()  # given back: the handler below must not free them again
                if rest:
                    raise ValueError(f"{label(0, name)}: {wanted.numel()} slots are not whole "
                                     f"{tier} pages of {alloc.page_size}")
                return None
            taken[name] = got[:2]
            slots[name] = torch.from_numpy(got[2])
    except BaseException:  # an allocator raised: give back what the others handed out
        free_all(taken, lambda n, g: allocators[n].free_pages(g[0]))
        raise
    return OwnPages([slots], [taken], slots)


def _split(allocators: Mapping[str, PageAllocator], taken: Mapping[str, tuple[np.ndarray, np.ndarray]],
           counts: list[dict[str, int]]) -> OwnPages:
    """Each op's consecutive share of the pages taken per pool."""
    merged = {n: torch.from_numpy(allocators[n].page_slots(p, ascending=True)) for n, (p, _) in taken.items()}
    at = dict.fromkeys(taken, 0)
    slots, stamps = [], []
    for per in counts:
        op_slots, op_stamps = {}, {}
        for name, k in per.items():
            a, page = at[name], allocators[name].page_size
            pages, gens = taken[name]
            op_slots[name] = merged[name][a * page:(a + k) * page]
            op_stamps[name] = (pages[a:a + k], gens[a:a + k])
            at[name] = a + k
        slots.append(op_slots)
        stamps.append(op_stamps)
    return OwnPages(slots, stamps, merged)
