"""Merging queued operations into one transfer batch, and launching it.

A batch concatenates, per own-indexed root pool (``kv``, ``swa``), the slots of every
queued operation on both tiers; each data pool's rows are then derived *here*, lazily,
from its root's merged slots, and transfers are grouped by the key (pool, source):

    ops:      op1 {kv: 512, swa: 128}   op2 {kv: 256}   op3 {kv: 256, swa: 128}
    merged:   kv: 1024 slots            swa: 256 slots
    jobs:     (c4_kv, kv) 4 rows  (c4_indexer, kv) 4  (c128_kv, kv) 4
              (swa, swa) 2 rows   (c4_state, swa) 2   (c4_indexer_state, swa) 2

Backups (D2H) are one all-layer launch; loads (H2D) are one launch per group of
consecutive model layers (``LoadGrouper``: at least ~1 MB per launch), each followed by
its layers' done-event.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
import torch

from host_pools.spec import Stack
from transfer_kernels import CopyBackend, CopyJob, CopyPlan
from transfer_kernels.plan import LaunchGroups
from transfer_kernels.rows import first_duplicate


@dataclass(slots=True)
class Op:
    """One queued write or load: own-indexed slots on the source and destination tiers."""

    op_id: int
    direction: str  # "d2h" (write / backup) or "h2d" (load)
    src: dict[str, torch.Tensor]
    dst: dict[str, torch.Tensor]
    # per pool, the destination pages the controller's allocator handed out and their
    # allocation generations (None: a server's allocator); d2h: stamped when acked
    stamps: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    # queued together by load_many/write_many: every op of the call's slots, merged once
    merged: MergedOps | None = None


class MergedOps(NamedTuple):
    """The slots of ``size`` ops queued by one call, per pool, op after op."""

    src: dict[str, torch.Tensor]
    dst: dict[str, torch.Tensor]
    size: int


@dataclass(slots=True)
class Batch:
    """Operations merged into one launch set, and how it ended."""

    ops: list[Op]
    direction: str
    consumer: int = -1
    event: Any = None  # CUDA event recorded after the last launch; None on CPU
    error: str | None = None
    # rolled back: its destination slots are free again (on CUDA only once its event has
    # completed: copies enqueued before the failure may still write them until then)
    freed: bool = False


def _merged_once(ops: list[Op]) -> MergedOps | None:
    """The ops' merged slots when they are exactly the ops of one ``load_many`` call."""
    merged = ops[0].merged
    if merged is None or merged.size != len(ops) or any(op.merged is not merged for op in ops):
        return None
    return merged


def _merge(ops: list[Op], side: str) -> dict[str, torch.Tensor]:
    if len(ops) == 1:
        return getattr(ops[0], side)
    merged = _merged_once(ops)
    if merged is not None:
        return getattr(merged, side)
    return merge_slots([getattr(op, side) for op in ops])


def merge_slots(per_op: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Slots of several ops per root pool, op after op (one concatenation per pool)."""
    per_root: dict[str, list[torch.Tensor]] = {}
    for slots_of in per_op:
        for root, slots in slots_of.items():
            per_root.setdefault(root, []).append(slots)
    return {root: torch.cat(parts) if len(parts) > 1 else parts[0] for root, parts in per_root.items()}


def plan_jobs(stack: Stack, ops: list[Op], tables: Callable[[str], tuple[Any, Any]],
              dst_pages: Mapping[str, int] | None = None) -> dict[tuple, CopyJob]:
    """Transfers of a batch keyed by (pool name, source pool), rows resolved from merged slots
    (the general form; the controller builds the same jobs with `hicache.batch_plan.BatchPlanner`).

    Every op's slots were validated for their root's page when it was queued, and each
    op's destination slots were allocated distinct; so the rows are derived unchecked.

    Args:
        tables: pool name -> (source-tier table, destination-tier table).
        dst_pages: root pool -> destination page size; when given, slots handed out to
            two ops of the batch (freed and reallocated while queued) are refused.
    Raises:
        ValueError: a destination page twice in the batch (only with ``dst_pages``).
    """
    dst = _merge(ops, "dst")
    # one call's pages come from one allocation per pool: distinct by construction
    if dst_pages is not None and len(ops) > 1 and _merged_once(ops) is None:
        for root, slots in dst.items():
            _check_distinct(slots, dst_pages[root], root)
    src_rows = stack.derive_rows(_merge(ops, "src"), check=False)
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


@functools.lru_cache(maxsize=64)
def layer_plan(stack: Stack, pools: tuple[str, ...]) -> list[list[tuple[str, int]]]:
    """For each model layer, the (pool, pool-local layer) pairs it loads."""
    per_layer: list[list[tuple[str, int]]] = [[] for _ in range(stack.num_model_layers)]
    for name in pools:
        for local, model_layer in enumerate(stack.pool(name).layer_ids):
            per_layer[model_layer].append((name, local))
    return per_layer


def launch_backup(plan: CopyPlan, backend: CopyBackend) -> None:
    """All layers of every pool in one launch."""
    if plan.jobs:
        backend.execute(plan)


class LoadGroups(NamedTuple):
    """A load's launch groups: consecutive model layers launched together.

    ``groups[g]`` lists the (job index, pool-local layer) pairs of model layers
    ``layers[g] .. layers[g + 1] - 1``; the hash is computed once (the triton backend keys
    its layout cache by the groups).
    """

    groups: _HashedGroups
    layers: tuple[int, ...]  # num_groups + 1 model-layer bounds


class _HashedGroups(tuple):
    """A tuple of launch groups whose hash is computed once."""

    def __new__(cls, groups):
        self = super().__new__(cls, groups)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


def launch_load(plan: CopyPlan, groups: LoadGroups, backend: CopyBackend,
                on_group: Callable[[int, int], None] | None) -> None:
    """One launch per group of consecutive model layers, then ``on_group(first, end)``
    for the group's model layers ``[first, end)``.

    The batch is prepared once (the triton backend stages every group's layout and
    indices in one copy); each launch reads its part of it, O(1) Python per group.
    """
    launch, bounds = backend.prepare(plan, groups.groups).launch, groups.layers
    if on_group is None:
        for g in range(len(bounds) - 1):
            launch(g)
        return
    for g, first, end in zip(range(len(bounds) - 1), bounds, bounds[1:]):
        launch(g)
        on_group(first, end)


class LoadGrouper:
    """Launch groups of a stack's loads: consecutive model layers until a group moves at
    least ``min_bytes`` (0: one group per layer), cached by pools and row counts.

    A consumer of model layer ``i`` waits for its whole group: at most the rest of the
    group's layers, fewer than ``min_bytes`` plus one layer's bytes in all (a group closes
    at the first layer that takes it to ``min_bytes``); never for a later group.
    """

    def __init__(self, stack: Stack, min_bytes: int, cache_size: int = 256) -> None:
        self.stack, self.min_bytes, self.cache_size = stack, min_bytes, cache_size
        self._bytes: dict[tuple[str, ...], np.ndarray] = {}
        self._groups: dict[tuple, LoadGroups] = {}

    def groups(self, pools: tuple[str, ...], rows: tuple[int, ...]) -> LoadGroups:
        """The groups of a load moving ``rows[j]`` rows of pool ``pools[j]``, all layers."""
        key = (pools, rows, self.min_bytes)
        got = self._groups.get(key)
        if got is None:
            got = self._build(pools, rows)
            if len(self._groups) >= self.cache_size:
                self._groups.pop(next(iter(self._groups)))
            self._groups[key] = got
        return got

    def _build(self, pools: tuple[str, ...], rows: tuple[int, ...]) -> LoadGroups:
        """Greedy cut (a new shape of batch only; a seen one is a dict hit)."""
        per_layer = self._per_layer_bytes(pools) @ np.asarray(rows, dtype=np.int64)
        if self.min_bytes > 0 and per_layer.size:
            # layer i closes its group when the group's bytes reach min_bytes
            ends, acc = [], 0
            for i, b in enumerate(per_layer.tolist()):
                acc += b
                if acc >= self.min_bytes:
                    ends.append(i + 1)
                    acc = 0
            if not ends or ends[-1] != per_layer.size:
                ends.append(per_layer.size)
            bounds = (0, *ends)
        else:
            bounds = tuple(range(per_layer.size + 1))
        plan = load_layer_pairs(self.stack, pools)
        groups = _HashedGroups(tuple(pair for layer in range(a, b) for pair in plan[layer])
                               for a, b in zip(bounds[:-1], bounds[1:]))
        return LoadGroups(groups, tuple(bounds))

    def _per_layer_bytes(self, pools: tuple[str, ...]) -> np.ndarray:
        """``[model layers, pools]``: bytes of one row of each pool in each model layer."""
        m = self._bytes.get(pools)
        if m is None:
            m = np.zeros((self.stack.num_model_layers, len(pools)), dtype=np.int64)
            for j, name in enumerate(pools):
                spec = self.stack.pool(name)
                m[list(spec.layer_ids), j] = spec.row_bytes
            self._bytes[pools] = m
        return m


@functools.lru_cache(maxsize=64)
def load_layer_pairs(stack: Stack, pools: tuple[str, ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """For each model layer, the (job index, pool-local layer) pairs it loads; job ``j``
    is pool ``pools[j]``."""
    job_of = {name: j for j, name in enumerate(pools)}
    return tuple(tuple((job_of[name], local) for name, local in entries)
                 for entries in layer_plan(stack, pools))
