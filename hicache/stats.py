"""`TransferStats`: plain counters of operations, tokens and bytes per pool and direction."""
from __future__ import annotations

import functools
from collections import defaultdict
from typing import Mapping

import torch

from host_pools.spec import Stack


class TransferStats:
    """Counters exposed as a plain dict (``as_dict``); metrics export reads that dict."""

    def __init__(self) -> None:
        self.ops = defaultdict(int)  # (direction, "ok"|"failed") -> operations
        self.tokens = defaultdict(int)  # (direction, pool) -> tokens
        self.bytes = defaultdict(int)  # (direction, pool) -> bytes, all layers
        self.rollbacks = defaultdict(int)  # direction -> batches rolled back

    @staticmethod
    def op_volume(stack: Stack, own_slots: dict[str, torch.Tensor]) -> tuple[dict[str, int], dict[str, int]]:
        """Tokens per pool and bytes per data pool moved for one operation's root slots."""
        return volume_table(stack).volume({root: s.numel() for root, s in own_slots.items()})

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
        self.rollbacks[direction] += 1

    def as_dict(self) -> dict:
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
        stack: the pools; computed once per stack (see :func:`volume_table`).
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


@functools.lru_cache(maxsize=16)
def volume_table(stack: Stack) -> VolumeTable:
    """The (cached) :class:`VolumeTable` of ``stack``."""
    return VolumeTable(stack)
