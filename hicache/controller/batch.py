"""The controller's records: a queued `Op`, a `Batch` of them, an `Ack`, and merged slots.

A batch concatenates, per own-indexed root pool (``kv``, ``swa``), the slots of every
queued operation on both tiers; each data pool's rows are derived from its root's merged
slots (`hicache.controller.planner`), and transfers are grouped by (pool, source):

    ops:      op1 {kv: 512, swa: 128}   op2 {kv: 256}   op3 {kv: 256, swa: 128}
    merged:   kv: 1024 slots            swa: 256 slots
    jobs:     (c4_kv, kv) 4 rows  (c4_indexer, kv) 4  (c128_kv, kv) 4
              (swa, swa) 2 rows   (c4_state, swa) 2   (c4_indexer_state, swa) 2

Records hold no behaviour beyond their own fields: a batch's failure and the give-back of
its slots are written through its two methods, its event by the launcher alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

DIRECTIONS = ("d2h", "h2d")


@dataclass(slots=True)
class Op:
    """One queued write or load: own-indexed slots on the source and destination tiers."""

    op_id: int  # -1 until queued (`OpQueue.enqueue` numbers it)
    direction: str  # "d2h" (write / backup) or "h2d" (load)
    src: dict[str, torch.Tensor]
    dst: dict[str, torch.Tensor]
    # per pool, the destination pages the controller's allocator handed out and their
    # allocation generations (None: a server's allocator); d2h: stamped when acked
    stamps: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    # queued together by load_many/write_many: every op of the call's slots, merged once
    merged: MergedOps | None = None
    # an op of one root pool made by the controller (the tree's backups): (root, tokens),
    # its volume's key (`hicache.controller.stats.VolumeTable.of`); else None
    one_root: tuple[str, int] | None = None


class MergedOps(NamedTuple):
    """The slots of ``size`` ops queued by one call, per pool, op after op."""

    src: dict[str, torch.Tensor]
    dst: dict[str, torch.Tensor]
    size: int


class Ack(NamedTuple):
    """A finished operation: tokens and bytes per pool, and whether it succeeded."""

    op_id: int
    direction: str  # "d2h" | "h2d"
    success: bool
    tokens: dict[str, int]
    bytes: dict[str, int]
    error: str | None = None


@dataclass(slots=True)
class Batch:
    """Operations merged into one launch set, and how it ended."""

    ops: list[Op]
    direction: str
    consumer: int = -1  # a load's ring slot in `LayerDoneCounter`
    event: Any = None  # CUDA event recorded after the last launch; None on CPU
    error: str | None = None
    # rolled back: its destination slots are free again (on CUDA only once its event has
    # completed: copies enqueued before the failure may still write them until then)
    freed: bool = False

    def fail(self, exc: BaseException) -> None:
        """Mark the batch failed by ``exc`` (its acks report it)."""
        self.error = f"{type(exc).__name__}: {exc}"

    def given_back(self, errors: list[str]) -> None:
        """Its destination slots were freed; ``errors``: frees that raised (joined to its error)."""
        if errors:
            self.error += "; rollback: " + "; ".join(errors)
        self.freed = True


def merged_once(ops: list[Op]) -> MergedOps | None:
    """The ops' merged slots when they are exactly the ops of one ``load_many`` call."""
    merged = ops[0].merged
    if merged is None or merged.size != len(ops) or any(op.merged is not merged for op in ops):
        return None
    return merged


def merge(ops: list[Op], side: str) -> dict[str, torch.Tensor]:
    """The ops' ``side`` (``"src"`` / ``"dst"``) slots per root pool, op after op."""
    if len(ops) == 1:
        return getattr(ops[0], side)
    merged = merged_once(ops)
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
