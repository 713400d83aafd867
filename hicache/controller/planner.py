"""`BatchPlanner`: a queued batch's copy plan, with what depends only on its pools built once.

A batch's jobs, their order, tables and layers, and the pools of its load groups depend only
on which root pools it touches (a *shape*: ``("kv", "swa")``), never on its slots; the
planner computes them once per shape and per batch derives only the rows (one slice per
(root, rows-per-token class) and tier), then builds the plan without a check: the slots
were validated (or allocated by the controller) at ``write``/``load``.

The destination rows come from the pages the controller's allocator handed out (an op's
``stamps``) when a page is one row (``tokens_per_row == page_size``: DeepSeek-V4's pools):
no slot array is read. The jobs, their order and their rows are exactly those of the
general form (``tests/hicache/controller/oracles.py``: ``plan_jobs`` + ``trusted_plan``).

The row tables are fixed when the controller is built (`planners`): each data pool's
device and host table, oriented per direction, and the device the plans execute on.
"""
from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np
import torch

from hicache.controller import batch
from hicache.controller.batch import DIRECTIONS, Op
from hicache.device_pool import DevicePool
from hicache.host_dtype import codec_of
from host_pools.group import HostPoolGroup
from host_pools.spec import Stack
from transfer_kernels import CopyPlan, RowTable
from transfer_kernels.rows import PlannedJob, exec_device
from transfer_kernels.rows import first_duplicate


def planners(device_pools: Mapping[str, DevicePool], host_group: HostPoolGroup) -> dict[str, BatchPlanner]:
    """Per direction, the planner of a controller's batches over these pools' row tables
    (one table per pool and tier, shared by both directions).

    Args:
        device_pools: every pool of ``host_group``'s stack, keyed by name.
        host_group: the host pools (their pinned chunks and host formats).
    """
    stack = host_group.stack
    tables = {}
    for p in stack.data_pools():
        host = host_group.pools[p.name]
        tables[p.name] = (device_pools[p.name].row_table(),
                          RowTable.from_views(host.row_views(), name=p.name,
                                              chunk_starts=host_group.pin_chunks(p.name),
                                              codec=codec_of(device_pools[p.name].spec, host.spec)))
    own = [p.name for p in stack.own_indexed]
    dst_pages = {"d2h": {n: host_group.pools[n].allocator.page_size for n in own},
                 "h2d": {n: device_pools[n].allocator.page_size for n in own}}
    first = next(iter(tables.values()), None)
    device = exec_device(*first) if first else torch.device("cpu")
    oriented = {"d2h": {n: (dev, host) for n, (dev, host) in tables.items()},
                "h2d": {n: (host, dev) for n, (dev, host) in tables.items()}}
    return {d: BatchPlanner(stack, oriented[d], dst_pages[d], device) for d in DIRECTIONS}


class _Group(NamedTuple):
    """The data pools of one root sharing a row size: one rows tensor per tier for all."""

    root: str
    tokens_per_row: int
    jobs: tuple[tuple[RowTable, RowTable, tuple[int, ...]], ...]  # (src, dst, layers) per pool


class _Shape(NamedTuple):
    """What a batch touching a given set of roots launches, its rows aside."""

    groups: tuple[_Group, ...]
    pools: tuple[str, ...]  # job j copies pool pools[j] (the load groups' pools)


class BatchPlanner:
    """One direction's plans (see the module docstring).

    Args:
        stack: the pools.
        tables: data pool -> (source-tier table, destination-tier table).
        dst_pages: own-indexed pool -> page size of its destination tier's allocator.
        device: the device the plans execute on.
    Attributes (read-only): ``tables``, ``dst_pages`` and ``device`` as given.
    """

    def __init__(self, stack: Stack, tables: Mapping[str, tuple[RowTable, RowTable]],
                 dst_pages: Mapping[str, int], device: torch.device) -> None:
        self.tables, self.device = dict(tables), device
        self.dst_pages = dict(dst_pages)
        # root -> its data pools grouped by rows-per-token class, in the general form's job order
        self._by_root: dict[str, list[_Group]] = {}
        order: dict[str, dict[int, list[str]]] = {}
        for p in stack.data_pools():
            order.setdefault(stack.root_of(p.name).name, {}).setdefault(p.tokens_per_row, []).append(p.name)
        for root, by_rows in order.items():
            self._by_root[root] = [
                _Group(root, tpr, tuple((*tables[n], tuple(range(stack.pool(n).num_layers))) for n in names))
                for tpr, names in by_rows.items()]
        self._names = {(root, tpr): tuple(names) for root, by in order.items() for tpr, names in by.items()}
        self._shapes: dict[tuple[str, ...], _Shape] = {}

    def _shape(self, roots: tuple[str, ...]) -> _Shape:
        got = self._shapes.get(roots)
        if got is None:
            groups = tuple(g for root, gs in self._by_root.items() if root in roots for g in gs)
            pools = tuple(n for g in groups for n in self._names[(g.root, g.tokens_per_row)])
            got = self._shapes[roots] = _Shape(groups, pools)
        return got

    def plan(self, ops: Sequence[Op]) -> tuple[CopyPlan, tuple[str, ...], tuple[int, ...]]:
        """The plan of a batch of ``ops`` (queued by the controller: slots checked or its own).

        Returns:
            ``(plan, pools, rows)``: job ``j`` copies ``rows[j]`` rows of pool ``pools[j]``
            (all its layers), for ``LoadGrouper.groups``.
        Raises:
            ValueError: a destination page in two ops of the batch (freed and allocated
                again while queued); nothing is launched.
        """
        src = batch.merge(ops, "src")
        pages = self._dst_page_arrays(ops, src.keys())
        shape = self._shape(tuple(src))
        jobs, rows, dst = [], [], None
        for group in shape.groups:
            root, tpr = group.root, group.tokens_per_row
            src_rows = torch.from_numpy(src[root].numpy()[::tpr] // tpr)
            if pages is not None and tpr == self.dst_pages[root]:  # a page is one row
                dst_rows = torch.from_numpy(pages[root])
            else:
                dst = batch.merge(ops, "dst") if dst is None else dst
                dst_rows = torch.from_numpy(dst[root].numpy()[::tpr] // tpr)
            n = src_rows.numel()
            for src_table, dst_table, layers in group.jobs:
                jobs.append(PlannedJob(src_table, dst_table, src_rows, dst_rows, layers))
                rows.append(n)
        return CopyPlan(tuple(jobs), self.device), shape.pools, tuple(rows)

    def _dst_page_arrays(self, ops: Sequence[Op], roots: Iterable[str]) -> dict[str, np.ndarray] | None:
        """Per root, the batch's destination pages op after op when every op keeps them
        (allocated by the controller), else ``None``; refuses a page handed out to two
        ops of the batch (``load_many``'s ops come from one allocator call: distinct)."""
        if len(ops) == 1:
            stamps = ops[0].stamps
            return None if stamps is None else {root: got[0] for root, got in stamps.items()}
        if batch.merged_once(ops) is not None:  # its merged slots: no concatenation
            return None
        if any(op.stamps is None for op in ops):
            _refuse_shared(batch.merge_slots([op.dst for op in ops]), self.dst_pages)
            return None
        parts: dict[str, list[np.ndarray]] = {root: [] for root in roots}
        for op in ops:
            for root, got in op.stamps.items():
                parts[root].append(got[0])
        pages = {root: np.concatenate(p) for root, p in parts.items()}
        for root, p in pages.items():
            s = np.sort(p)
            dup = np.flatnonzero(s[1:] == s[:-1])
            if dup.size:  # named by its first slot, as the slots' check names it
                _shared(root, int(s[dup[0]]) * self.dst_pages[root])
        return pages


def _refuse_shared(per_root: Mapping[str, torch.Tensor], page_sizes: Mapping[str, int]) -> None:
    """``ValueError`` when a destination page (its first slot in ``per_root``) appears twice."""
    for root, slots in per_root.items():
        twice = first_duplicate(slots[::page_sizes[root]])
        if twice is not None:
            _shared(root, twice)


def _shared(root: str, first_slot: int) -> None:
    raise ValueError(f"destination slots of pool {root!r}: page {first_slot} belongs to two ops of "
                     f"one batch (freed and allocated again while queued)")
