"""Counters of transfers: `TransferStats` (operations, tokens and bytes per pool and
direction) and the controller's `BatchStats`, the one owner of its counters, which also
gives each finished op its ack's volume (`VolumeTable`)."""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from hicache.controller.batch import DIRECTIONS, Ack, Batch
from host_pools.spec import Stack


_KEPT_SIZES = 512  # op sizes whose volume `VolumeTable.of` keeps (a server moves a few sizes)


class TransferStats:
    """Counters exposed as a plain dict (``as_dict``); metrics export reads that dict
    (the controller's through `BatchStats`, the vLLM mover's directly)."""

    def __init__(self) -> None:
        self.ops = defaultdict(int)  # (direction, "ok"|"failed") -> operations
        self.tokens = defaultdict(lambda: defaultdict(int))  # direction -> pool -> tokens
        self.bytes = defaultdict(lambda: defaultdict(int))  # direction -> pool -> bytes, all layers
        self.rollbacks = defaultdict(int)  # direction -> batches rolled back

    def record(self, direction: str, ok: bool, tokens: Mapping[str, int], nbytes: Mapping[str, int],
               ops: int = 1) -> None:
        """Count ``ops`` operations (e.g. a whole batch) and, when ``ok``, their volume."""
        if not ok:
            self.ops[(direction, "failed")] += ops
            return
        self.ops[(direction, "ok")] += ops
        counts = self.tokens[direction]
        for name, n in tokens.items():
            counts[name] += n
        counts = self.bytes[direction]
        for name, n in nbytes.items():
            counts[name] += n

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
                "tokens": dict(self.tokens.get(direction, {})),
                "bytes": dict(self.bytes.get(direction, {})),
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
        self._one: dict[tuple[str, int], tuple[dict[str, int], dict[str, int]]] = {}  # `of`'s, per (root, tokens)

    def of(self, key: tuple[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        """`volume` of ``key = (root, n)``: ``n`` tokens of one root (an op of one pool, the
        tree's backups and loads), as fresh dicts; the volumes of the last few hundred
        sizes are kept."""
        got = self._one.get(key)
        if got is None:
            if len(self._one) >= _KEPT_SIZES:
                self._one.clear()
            got = self._one[key] = self.volume({key[0]: key[1]})
        return dict(got[0]), dict(got[1])

    def scaled(self, root: str, n: int, times: int) -> tuple[dict[str, int], dict[str, int]]:
        """`volume` of ``times`` ops of ``n`` tokens of one root each."""
        tokens, nbytes = self.volume({root: n})
        return {k: v * times for k, v in tokens.items()}, {k: v * times for k, v in nbytes.items()}

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
        # acked ops of one root not counted yet, per direction: (root, tokens) -> ops;
        # counted into the counters when they are read (`as_dict`), not at every ack
        self._acked: dict[str, dict[tuple[str, int], int]] = {d: {} for d in DIRECTIONS}

    def acks(self, batch: Batch) -> list[Ack]:
        """The acks of a finished ``batch``, one per op in order; the batch is counted."""
        ok, direction, error = batch.error is None, batch.direction, batch.error
        if len(batch.ops) == 1:  # the common case (a tree step): one volume, counted as the batch's
            op = batch.ops[0]
            if ok and len(op.src) == 1:  # one root (the tree's history alone): counted when read
                key = op.one_root
                if key is None:
                    (name, slots), = op.src.items()
                    key = (name, slots.numel())
                tokens, nbytes = self._volume.of(key)
                acked = self._acked[direction]
                acked[key] = acked.get(key, 0) + 1
                return [_ack((op.op_id, direction, True, tokens, nbytes, None))]
            tokens, nbytes = self._volume.volume({name: slots.numel() for name, slots in op.src.items()})
            self._counters.record(direction, ok, tokens, nbytes)
            return [Ack(op.op_id, direction, ok, tokens, nbytes, error)]
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

    def bytes_of(self, ops: list) -> int:
        """Bytes (all layers, every data pool) the ``ops`` move; counts nothing."""
        total = 0
        for op in ops:
            total += sum(self._volume.volume({name: slots.numel() for name, slots in op.src.items()})[1].values())
        return total

    def rolled_back(self, direction: str) -> None:
        """Count one rolled-back batch of ``direction``."""
        self._counters.rollback(direction)

    def as_dict(self) -> dict:
        """The counters (`TransferStats.as_dict`), the acks not counted yet counted first."""
        for direction, acked in self._acked.items():
            for (root, n), times in acked.items():
                tokens, nbytes = self._volume.scaled(root, n, times)
                self._counters.record(direction, True, tokens, nbytes, ops=times)
            acked.clear()
        return self._counters.as_dict()


def _ack(fields: tuple) -> Ack:
    """``Ack(*fields)`` without the Python-level ``__new__`` of a named tuple (the step's hot path)."""
    return tuple.__new__(Ack, fields)
