"""`BatchPlanner`: what a batch of each pool set moves, decided when the controller is built.

A batch moves every data pool rooted at the root pools its ops touch: its *pool set*
(``{"kv", "swa"}``, ``{"kv"}``...). Its jobs, their order, tables and layers, how each job's
rows follow from its root's merged slots (a rows-per-token class), and the pools of its
load groups depend on the pool set alone, never on the slots; the planner fixes them per
direction for every pool set at construction (`PoolSet`). A batch's rows are derived by
the launcher (`hicache.controller.launcher.batch_rows`), unchecked: the slots were
validated (or allocated by the controller) at ``write``/``load``.

The row tables are fixed when the controller is built (`planners`): each data pool's
device and host table, oriented per direction, and the device the copies execute on.
"""
from __future__ import annotations

from itertools import combinations
from typing import Mapping, NamedTuple

import torch

from hicache.controller.batch import DIRECTIONS
from hicache.device_pool import DevicePool
from hicache.host_dtype import codec_of
from host_pools.group import HostPoolGroup
from host_pools.spec import Stack
from transfer_kernels import RowTable
from transfer_kernels.rows import Lane, exec_device


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
