"""`Footprint`: the bytes a load moves, from a stack in its host format.

A load of ``n`` prefix tokens moves every history pool's rows of those tokens (all
layers) and, on a hybrid stack, one state snapshot at the load's end; a backup the same
the other way::

    bytes(n) = n x token_bytes + (snapshot_bytes if a snapshot moves)

    token_bytes     sum over pools rooted at the anchor: layers x row bytes / tokens per row
    snapshot_bytes  sum over pools rooted elsewhere (``swa`` and its sidecars): the rows of
                    the largest window of their root, rounded up to whole rows of the root
"""
from __future__ import annotations

from typing import NamedTuple

from host_pools.host_format import host_stack
from host_pools.spec import Stack


class Footprint(NamedTuple):
    """Bytes a load or backup moves per token and per snapshot (module docstring)."""

    token_bytes: float
    snapshot_bytes: int

    def bytes(self, tokens: int, snapshot: bool) -> float:
        """Bytes of ``tokens`` history tokens, plus one snapshot when ``snapshot``."""
        return tokens * self.token_bytes + (self.snapshot_bytes if snapshot else 0)

    @classmethod
    def of(cls, stack: Stack, host_dtype: str = "auto") -> "Footprint":
        """The footprint of ``stack`` in its host format (``host_dtype``: int8 history pools
        count their int8 bytes and scales)."""
        stack = host_stack(stack, host_dtype)
        anchor = stack.anchor.name
        per_token, per_snapshot = 0.0, 0
        for pool in stack.data_pools():
            root = stack.root_of(pool.name)
            if root.name == anchor:
                per_token += pool.num_layers * pool.row_bytes / pool.tokens_per_row
                continue
            window = max(p.window_tokens for p in stack if stack.root_of(p.name).name == root.name)
            tokens = -(-window // root.tokens_per_row) * root.tokens_per_row
            per_snapshot += tokens // pool.tokens_per_row * pool.num_layers * pool.row_bytes
        return cls(per_token, per_snapshot)
