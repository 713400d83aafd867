"""`BatchPlanner`: what a batch of each pool set moves, decided when the controller is
built, and each batch's rows, derived when it launches.

A batch moves every data pool rooted at the root pools its ops touch: its *pool set*
(``{"kv", "swa"}``, ``{"kv"}``...). Its jobs, their order, tables and layers, how each job's
rows follow from its root's merged slots (a rows-per-token class), and the pools of its
load groups depend on the pool set alone, never on the slots; the planner fixes them per
direction for every pool set at construction (`PoolSet`). At launch it derives a batch's
rows (`BatchPlanner.rows`), unchecked: the slots were validated (or allocated by the
controller) at ``write``/``load``; the launcher then only launches them.

The row tables are fixed when the controller is built (`planners`): each data pool's
device and host table, oriented per direction, and the device the copies execute on.
"""
from __future__ import annotations

from itertools import combinations
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import torch

from hicache import slot_arrays
from hicache.controller.batch import DIRECTIONS, Op, merge, merge_slots, merged_once
from hicache.device_pool import DevicePool
from hicache.host_dtype import codec_of
from host_pools.group import HostPoolGroup
from host_pools.spec import Stack
from transfer_kernels import RowTable
from transfer_kernels.rows import Lane, exec_device, first_duplicate

Rows = list  # per job of a pool set, its rows (int64 CPU tensors)


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


class RowClass(NamedTuple):
    """The jobs of one root sharing a rows-per-token class: one rows tensor per tier for all."""

    root: str
    tokens_per_row: int
    jobs: tuple[int, ...]  # their indices in the pool set's lanes


class PoolSet(NamedTuple):
    """What a batch touching ``roots`` moves, its rows aside: job ``j`` copies every layer
    of pool ``pools[j]`` from ``lanes[j].src`` to ``lanes[j].dst``."""

    roots: frozenset[str]
    lanes: tuple[Lane, ...]
    pools: tuple[str, ...]
    classes: tuple[RowClass, ...]  # how the jobs' rows follow from their roots' slots
    pairs: tuple[tuple[int, int], ...]  # every (job, layer): a backup's one launch group


class BatchPlanner:
    """One direction's pool sets (see the module docstring).

    Args:
        stack: the pools.
        tables: data pool -> (source-tier table, destination-tier table).
        dst_pages: own-indexed pool -> page size of its destination tier's allocator.
        device: the device the copies execute on.
    Attributes (read-only): ``tables``, ``dst_pages`` and ``device`` as given; ``pool_sets``:
        every pool set by the own-indexed pools a batch's ops name (all non-empty sets),
        ``one_root`` the sets of one pool by its name;
        an own-indexed pool without data pools (a DeepSeek-V4 anchor whose layers are all
        sliding-window) adds nothing to its set, and a set of only such pools has no lanes.
    """

    def __init__(self, stack: Stack, tables: Mapping[str, tuple[RowTable, RowTable]],
                 dst_pages: Mapping[str, int], device: torch.device) -> None:
        self.tables, self.device = dict(tables), device
        self.dst_pages = dict(dst_pages)
        # root -> its data pools per rows-per-token class, in the general form's job order
        order: dict[str, dict[int, list[str]]] = {}
        for p in stack.data_pools():
            order.setdefault(stack.root_of(p.name).name, {}).setdefault(p.tokens_per_row, []).append(p.name)
        layers = {p.name: tuple(range(p.num_layers)) for p in stack.data_pools()}
        self.pool_sets: dict[frozenset[str], PoolSet] = {}
        by_roots: dict[frozenset[str], PoolSet] = {}  # one pool set per set of roots with data
        own = sorted(stack.own_names)
        for size in range(1, len(own) + 1):
            for names in combinations(own, size):
                roots = tuple(r for r in order if r in names)
                if frozenset(roots) not in by_roots:
                    by_roots[frozenset(roots)] = _pool_set(roots, order, self.tables, layers)
                self.pool_sets[frozenset(names)] = by_roots[frozenset(roots)]
        # the pool set of a batch of one op of one root pool (`Op.one_root`: the tree's step)
        self.one_root = {name: self.pool_sets[frozenset((name,))] for name in own}

    def rows(self, ops: Sequence[Op]) -> tuple[PoolSet, Rows | None, Rows | None, tuple[int, ...] | None]:
        """The pool set of a batch of ``ops`` and each of its jobs' source and destination
        rows, and row counts: one slice per (root, rows-per-token class) and tier, shared by
        the class's jobs, never checked (the slots were validated at ``write``/``load``).
        The destination rows come from the pages the controller's allocator handed out (the
        ops' ``stamps``) when a page is one row (DeepSeek-V4's pools): no slot array is read.
        ``None`` rows: a pool set without lanes (no data pool: nothing to move).

        Raises:
            ValueError: a destination page in two ops of the batch (freed and allocated
                again while queued); nothing is launched.
        """
        src = ops[0].src if len(ops) == 1 else merge(ops, "src")
        one = ops[0].one_root if len(ops) == 1 else None  # a tree backup: its pool set by name
        pool_set = self.pool_sets[frozenset(src)] if one is None else self.one_root[one[0]]
        if not pool_set.lanes:
            return pool_set, None, None, None
        dst_pages = self.dst_pages
        pages = ops[0].stamps if len(ops) == 1 else _dst_pages(ops, src.keys(), dst_pages)
        src_rows, dst_rows, counts, dst = [], [], [], None
        for cls in pool_set.classes:
            root, tpr = cls.root, cls.tokens_per_row
            s, n = _rows(src[root], tpr)
            if pages is not None and tpr == dst_pages[root]:  # a page is one row
                d = torch.from_numpy(pages[root][0])
            else:
                dst = (ops[0].dst if len(ops) == 1 else merge(ops, "dst")) if dst is None else dst
                d = _rows(dst[root], tpr)[0]
            for _ in cls.jobs:
                src_rows.append(s)
                dst_rows.append(d)
                counts.append(n)
        return pool_set, src_rows, dst_rows, tuple(counts)


def _pool_set(roots: tuple[str, ...], order: Mapping[str, Mapping[int, list[str]]],
              tables: Mapping[str, tuple[RowTable, RowTable]],
              layers: Mapping[str, tuple[int, ...]]) -> PoolSet:
    """The lanes of ``roots``' data pools, root after root (the stack's order), one
    rows-per-token class after the other."""
    lanes, pools, classes = [], [], []
    for root in order:
        if root not in roots:
            continue
        for tpr, names in order[root].items():
            classes.append(RowClass(root, tpr, tuple(range(len(lanes), len(lanes) + len(names)))))
            for name in names:
                lanes.append(Lane(*tables[name], layers[name]))
                pools.append(name)
    pairs = tuple((j, layer) for j, lane in enumerate(lanes) for layer in lane.layers)
    return PoolSet(frozenset(roots), tuple(lanes), tuple(pools), tuple(classes), pairs)


def _rows(slots: torch.Tensor, tokens_per_row: int) -> tuple[torch.Tensor, int]:
    """The rows of a pool whose row holds ``tokens_per_row`` tokens, for the slots of its
    root (whole rows: checked or allocated by the controller), and how many. A token per
    row: the slots themselves (an op's own tensor, read-only until its ack), no copy."""
    n = slots.numel() // tokens_per_row
    if tokens_per_row == 1:
        return slots, n
    out = np.empty(n, np.int64)
    slot_arrays.rows(slots if slots.is_contiguous() else slots.contiguous(), tokens_per_row, out)
    return torch.from_numpy(out), n


def _dst_pages(ops: Sequence[Op], roots: Any, page_sizes: Mapping[str, int]
               ) -> Mapping[str, tuple[np.ndarray, Any]] | None:
    """Per root, the pages of a batch of several ``ops`` op after op (first of a pair) when
    every op keeps them (allocated by the controller), else ``None``; refuses a page handed
    out to two ops of the batch (``load_many``'s ops come from one allocator call: distinct).
    One op's are its ``stamps`` (`BatchPlanner.rows` reads them itself)."""
    if merged_once(ops) is not None:  # its merged slots: no concatenation
        return None
    if any(op.stamps is None for op in ops):
        for root, slots in merge_slots([op.dst for op in ops]).items():
            twice = first_duplicate(slots[::page_sizes[root]])
            if twice is not None:
                _shared(root, twice)
        return None
    parts: dict[str, list[np.ndarray]] = {root: [] for root in roots}
    for op in ops:
        for root, got in op.stamps.items():
            parts[root].append(got[0])
    pages = {root: (np.concatenate(p), None) for root, p in parts.items()}
    for root, (p, _) in pages.items():
        s = np.sort(p)
        dup = np.flatnonzero(s[1:] == s[:-1])
        if dup.size:  # named by its first slot, as the slots' check names it
            _shared(root, int(s[dup[0]]) * page_sizes[root])
    return pages


def _shared(root: str, first_slot: int) -> None:
    raise ValueError(f"destination slots of pool {root!r}: page {first_slot} belongs to two ops of "
                     f"one batch (freed and allocated again while queued)")
