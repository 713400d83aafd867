"""`OpQueue`: the controller's op ids, its queued ops and its batches in flight.

    write()/load()  -> enqueue(op)       op id issued, op queued in its direction
    start_*()       -> take(direction)   every queued op of that direction, as one batch
                    -> launched(batch)   in flight until its event has completed
    poll()          -> finished()        per direction, oldest first, the completed batches

A finished load is not held back by an unfinished backup (or the reverse).
"""
from __future__ import annotations

import itertools
from collections import deque

import torch

from hicache.controller.batch import DIRECTIONS, Batch, Op


class OpQueue:
    """Part: op ids, ops queued per direction, batches in flight per direction.

    Attributes:
        last_op_id: the id of the op queued last (-1 before the first).
    Not thread-safe: driven by the controller.
    """

    def __init__(self) -> None:
        self._ids = itertools.count()
        self.last_op_id = -1
        self._queued: dict[str, list[Op]] = {d: [] for d in DIRECTIONS}
        self._inflight: dict[str, deque[Batch]] = {d: deque() for d in DIRECTIONS}

    def enqueue(self, op: Op) -> dict[str, torch.Tensor]:
        """Number ``op`` and queue it; returns its destination slots (the op's own dict)."""
        op.op_id = self.last_op_id = next(self._ids)
        self._queued[op.direction].append(op)
        return op.dst

    def take(self, direction: str) -> list[Op]:
        """Every op queued in ``direction``, oldest first; the queue is left empty."""
        ops = self._queued[direction]
        if ops:
            self._queued[direction] = []
        return ops

    def launched(self, batch: Batch) -> None:
        """``batch`` is in flight (launched, or failed before its launch) until acked."""
        self._inflight[batch.direction].append(batch)

    def finished(self) -> list[Batch]:
        """The batches whose event has completed (or that have none), per direction
        oldest first; they leave the queue."""
        done = []
        for queue in self._inflight.values():
            while queue and (queue[0].event is None or queue[0].event.query()):
                done.append(queue.popleft())
        return done

    def rolled_back_ops(self) -> set[int]:
        """Ids of in-flight ops whose batch was rolled back and whose slots are free again."""
        return {op.op_id for queue in self._inflight.values() for batch in queue
                if batch.freed for op in batch.ops}

    def unacked(self, direction: str) -> list[Op]:
        """Ops of ``direction`` queued or in flight (not yet acked), oldest first (read only: with
        nothing in flight, the queue's own list)."""
        inflight, queued = self._inflight[direction], self._queued[direction]
        if not inflight:
            return queued
        return [op for batch in inflight for op in batch.ops] + queued

    def pending(self) -> int:
        """Operations queued or in flight (not yet acked)."""
        return (sum(len(q) for q in self._queued.values())
                + sum(len(b.ops) for q in self._inflight.values() for b in q))
