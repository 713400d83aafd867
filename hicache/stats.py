"""`TransferStats`: plain counters of operations, tokens and bytes per pool and direction."""
from __future__ import annotations

from collections import defaultdict

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
        tokens, nbytes = {}, {}
        for p in stack:
            root = stack.root_of(p.name).name
            if root not in own_slots:
                continue
            n = own_slots[root].numel()
            tokens[p.name] = n
            if p.has_data:
                nbytes[p.name] = n // p.tokens_per_row * p.num_layers * p.row_bytes
        return tokens, nbytes

    def record(self, direction: str, ok: bool, tokens: dict[str, int], nbytes: dict[str, int]) -> None:
        self.ops[(direction, "ok" if ok else "failed")] += 1
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
