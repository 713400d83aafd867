"""Counters of transfers: `TransferStats` (operations, tokens and bytes per pool and
direction) and the controller's `BatchStats`, the one owner of its counters, which also
gives each finished op its ack's volume (`VolumeTable`)."""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from hicache.controller.batch import Ack, Batch
from host_pools.spec import Stack


class TransferStats:
    """Counters exposed as a plain dict (``as_dict``); metrics export reads that dict
    (the controller's through `BatchStats`, the vLLM mover's directly)."""

    def __init__(self) -> None:
        self.ops = defaultdict(int)  # (direction, "ok"|"failed") -> operations
        self.tokens = defaultdict(int)  # (direction, pool) -> tokens
        self.bytes = defaultdict(int)  # (direction, pool) -> bytes, all layers
        self.rollbacks = defaultdict(int)  # direction -> batches rolled back

    def record(self, direction: str, ok: bool, tokens: Mapping[str, int], nbytes: Mapping[str, int],
               ops: int = 1) -> None:
        """Count ``ops`` operations (e.g. a whole batch) and, when ``ok``, their volume."""
        self.ops[(direction, "ok" if ok else "failed")] += ops
        if ok:
            for name, n in tokens.items():
                self.tokens[(direction, name)] += n
            for name, n in nbytes.items():
                self.bytes[(direction, name)] += n

    def rollback(self, direction: str) -> None:
        """Count one batch of ``direction`` rolled back."""
        self.rollbacks[direction] += 1

    def as_dict(self) -> dict:
        """Per direction: ``ops``, ``failed_ops``, ``rollbacks``, ``tokens`` and ``bytes`` per pool."""
        out: dict = {}
        for direction in ("d2h", "h2d"):
            out[direction] = {
                "ops": self.ops[(direction, "ok")],
                "failed_ops": self.ops[(direction, "failed")],
                "rollbacks": self.rollbacks[direction],
                "tokens": {p: n for (d, p), n in self.tokens.items() if d == direction},
                "bytes": {p: n for (d, p), n in self.bytes.items() if d == direction},
            }
        return out


class VolumeTable:
    """Per own-indexed root, its pools' row sizes: an op's volume from token counts alone.

    Args:
        stack: the pools.
    """

    def __init__(self, stack: Stack) -> None:
        by_root: dict[str, list[tuple[str, int, int | None]]] = {}
        for p in stack:
            per_row = p.num_layers * p.row_bytes if p.has_data else None
            by_root.setdefault(stack.root_of(p.name).name, []).append((p.name, p.tokens_per_row, per_row))
        self.by_root = {root: tuple(pools) for root, pools in by_root.items()}

    def volume(self, counts: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        """Tokens per pool and bytes (all layers) per data pool for ``counts`` tokens per root."""
        tokens, nbytes = {}, {}
        for root, n in counts.items():
            for name, tokens_per_row, per_row in self.by_root[root]:
                tokens[name] = n
                if per_row is not None:
                    nbytes[name] = n // tokens_per_row * per_row
        return tokens, nbytes


class BatchStats:
    """Part: the controller's counters, written only here: a finished batch's acks (each
    op's tokens and bytes) counted at once, and rollbacks.

    Args:
        stack: the pools (their row sizes give each op's volume).
    """

    def __init__(self, stack: Stack) -> None:
        self._counters = TransferStats()
        self._volume = VolumeTable(stack)

    def acks(self, batch: Batch) -> list[Ack]:
        """The acks of a finished ``batch``, one per op in order; the batch is counted."""
        ok, direction, error = batch.error is None, batch.direction, batch.error
        volume, acks, totals = self._volume.volume, [], {}
        seen: dict[tuple, tuple[dict, dict]] = {}  # ops of one shape: one volume, each ack its dicts
        for op in batch.ops:
            counts = tuple([(name, slots.numel()) for name, slots in op.src.items()])
            got = seen.get(counts)
            if got is None:
                tokens, nbytes = seen[counts] = volume(dict(counts))
            else:
                tokens, nbytes = dict(got[0]), dict(got[1])
            acks.append(Ack(op.op_id, direction, ok, tokens, nbytes, error))
            for name, n in counts:
                totals[name] = totals.get(name, 0) + n
        # the counters take the batch's volume at once, not op by op
        tokens, nbytes = (acks[0].tokens, acks[0].bytes) if len(acks) == 1 else volume(totals)
        self._counters.record(direction, ok, tokens, nbytes, ops=len(acks))
        return acks

    def rolled_back(self, direction: str) -> None:
        """Count one rolled-back batch of ``direction``."""
        self._counters.rollback(direction)

    def as_dict(self) -> dict:
        """The counters (`TransferStats.as_dict`)."""
        return self._counters.as_dict()
