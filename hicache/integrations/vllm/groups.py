"""`GroupPlan`: each KV cache group as the host tier holds it, sized by what it must keep.

vLLM splits a hybrid model's cache into groups (Gemma-style models: full attention +
sliding window; DeepSeek-V4: two sliding-window groups, a compressed-KV + indexer group
and two compressor-state groups). A full-attention group needs every chunk of every
cached prefix; a windowed group (sliding window, chunked-local, state) only the
``window + 1`` chunks at the end of each (``window.py``). So, with ``C`` host chunks
from ``--hicache-ratio`` / ``--hicache-size`` and ``P`` the typical cached prefix
(``hicache_prefix_tokens``)::

    anchor tokens   T = C x tokens per chunk of the full groups (of all groups if none)
    full group      C chunks
    windowed group  min(ceil(T / its tokens per chunk), ceil(T / P) x (window + 1)) chunks

Host bytes per cached token of a group = its pool bytes / T; storing every block would
cost its bytes per chunk / its tokens per chunk. No vLLM import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class GroupPlan:
    """One KV cache group on the host.

    Attributes:
        tokens_per_chunk: tokens one host chunk of this group covers.
        window: chunks a returning prefix needs at its end, ``None`` for full attention.
        chunks: host capacity in chunks.
        bytes_per_chunk: host bytes of one chunk (all layers of the group), ``None``
            where this side of vLLM does not know them.
    """

    tokens_per_chunk: int
    window: int | None
    chunks: int
    bytes_per_chunk: int | None = None

    @property
    def kind(self) -> str:
        return "full" if self.window is None else "window"

    @property
    def host_bytes(self) -> int | None:
        return None if self.bytes_per_chunk is None else self.chunks * self.bytes_per_chunk

    @property
    def every_block_bytes_per_token(self) -> float | None:
        """Host bytes per token if every block of the group were stored."""
        return None if self.bytes_per_chunk is None else self.bytes_per_chunk / self.tokens_per_chunk


@dataclass(frozen=True)
class HostLayout:
    """Every group's plan and the prefix tokens the host holds (``T``)."""

    groups: tuple[GroupPlan, ...]
    anchor_tokens: int

    @property
    def chunks(self) -> list[int]:
        return [g.chunks for g in self.groups]

    def bytes_per_token(self) -> list[float | None]:
        """Per group, host bytes per cached token (its pool bytes over ``T``)."""
        return [None if g.host_bytes is None else g.host_bytes / self.anchor_tokens
                for g in self.groups]

    def describe(self) -> str:
        """One line per group: kind, window, chunks, bytes per token (vs every block)."""
        lines = []
        for i, (g, per_token) in enumerate(zip(self.groups, self.bytes_per_token())):
            window = "" if g.window is None else f" (window {g.window}+1 chunks)"
            cost = "" if per_token is None else (f", {per_token:.1f} B/token (every block: "
                                                 f"{g.every_block_bytes_per_token:.1f})")
            lines.append(f"group {i}: {g.kind}{window}, {g.chunks} chunks of "
                         f"{g.tokens_per_chunk} tokens{cost}")
        return "; ".join(lines)


def plan_groups(tokens_per_chunk: Sequence[int], windows: Sequence[int | None], chunks: int,
                prefix_tokens: int, bytes_per_chunk: Sequence[int | None] | None = None
                ) -> HostLayout:
    """Every group's host capacity (module docstring).

    Raises:
        ValueError: lengths differ, or a count below 1 (names the argument).
    """
    n = len(tokens_per_chunk)
    sizes = list(bytes_per_chunk) if bytes_per_chunk is not None else [None] * n
    if n < 1 or len(windows) != n or len(sizes) != n:
        raise ValueError(f"tokens_per_chunk, windows, bytes_per_chunk: need one entry per group, "
                         f"got {n}, {len(windows)}, {len(sizes)}")
    if chunks < 1 or prefix_tokens < 1 or min(tokens_per_chunk) < 1:
        raise ValueError(f"chunks, prefix_tokens, tokens_per_chunk: must be >= 1, got {chunks}, "
                         f"{prefix_tokens}, {list(tokens_per_chunk)}")
    full = [t for t, w in zip(tokens_per_chunk, windows) if w is None] or list(tokens_per_chunk)
    total = chunks * max(full)
    prefixes = -(-total // prefix_tokens)
    plans = []
    for tpc, window, nbytes in zip(tokens_per_chunk, windows, sizes):
        count = chunks if window is None else min(-(-total // tpc), prefixes * (window + 1))
        plans.append(GroupPlan(tpc, window, max(1, count), nbytes))
    return HostLayout(tuple(plans), total)
