"""Merging queued operations into one transfer batch, and launching it.

A batch concatenates, per own-indexed root pool (``kv``, ``swa``), the slots of every
queued operation on both tiers; each data pool's rows are then derived *here*, lazily,
from its root's merged slots, and transfers are grouped by the key (pool, source):

    ops:      op1 {kv: 512, swa: 128}   op2 {kv: 256}   op3 {kv: 256, swa: 128}
    merged:   kv: 1024 slots            swa: 256 slots
    jobs:     (c4_kv, kv) 4 rows  (c4_indexer, kv) 4  (c128_kv, kv) 4
              (swa, swa) 2 rows   (c4_state, swa) 2   (c4_indexer_state, swa) 2

Backups (D2H) are one all-layer launch; loads (H2D) are one launch per model layer,
each followed by that layer's done-event.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

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
    # d2h: per pool, the destination host pages and their allocation generations
    host_stamps: dict[str, tuple[np.ndarray, np.ndarray]] | None = None


@dataclass(slots=True)
class Batch:
    """Operations merged into one launch set, and how it ended."""

    ops: list[Op]
    direction: str
    consumer: int = -1
    event: Any = None  # CUDA event recorded after the last launch; None on CPU
    error: str | None = None


def _merge(ops: list[Op], side: str) -> dict[str, torch.Tensor]:
    if len(ops) == 1:
        return getattr(ops[0], side)
    per_root: dict[str, list[torch.Tensor]] = {}
    for op in ops:
        for root, slots in getattr(op, side).items():
            per_root.setdefault(root, []).append(slots)
    return {root: torch.cat(parts) if len(parts) > 1 else parts[0] for root, parts in per_root.items()}


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
    dst = _merge(ops, "dst")
    if dst_pages is not None and len(ops) > 1:
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


def launch_load(plan: CopyPlan, groups: LaunchGroups, backend: CopyBackend,
                on_layer: Callable[[int], None] | None) -> None:
    """One launch per model layer covering every pool that has it, then ``on_layer(i)``.

    The batch is prepared once (the triton backend stages every layer's descriptors and
    indices in one copy); each layer's launch is a slice of it, O(1) Python per layer.
    ``groups`` come from :func:`load_groups` for the plan's job order.
    """
    launch = backend.prepare(plan, groups).launch
    for layer in range(len(groups)):
        launch(layer)
        if on_layer is not None:
            on_layer(layer)


@functools.lru_cache(maxsize=64)
def load_groups(stack: Stack, pools: tuple[str, ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """For each model layer, the (job index, pool-local layer) pairs it loads; job ``j``
    is pool ``pools[j]``."""
    job_of = {name: j for j, name in enumerate(pools)}
    return tuple(tuple((job_of[name], local) for name, local in entries)
                 for entries in layer_plan(stack, pools))
