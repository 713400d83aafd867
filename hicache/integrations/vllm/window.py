"""`TrailingWindows`: which chunks of sliding-window and state groups a request keeps.

A full-attention group needs every chunk of a prefix. A sliding-window group needs only
the chunks inside the window that ends where a returning request's hit ends, and a
state group (Mamba, DeepSeek-V4's compressor states: vLLM gives them a window too) the
last few. vLLM's scheduler offers every computed chunk of every group for storing; for
each request and windowed group this keeps the ``window + 1`` chunks nearest the
request's latest position (one more than the window: vLLM may load a window whose right
edge is rounded up to the next chunk) and names those that fell out of it, so the index
evicts them first::

    full group        0 1 2 3 4 5 6 7 8 9     every chunk stored
    window 2 (+1)                   7 8 9     stored; 0-6 never offered to the index
    next store: 10..12        ->   10 11 12   stored; 7 8 9 demoted (evicted first)

Positions are the token ends vLLM records per key (``ReqContext``), so chunks offered
out of order (vLLM re-offers a sliding-window tail when a request finishes) still rank
right; without one a key ranks after every key seen before it. No vLLM import.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, NamedTuple, Sequence


class Selection(NamedTuple):
    """One store call's decision: keys to offer the index (call order), keys to demote,
    and per windowed group the window kept if the store goes ahead."""

    offer: list[Hashable]
    demote: list[Hashable]
    kept: dict[int, dict[Hashable, int]]


@dataclass
class _Request:
    kept: dict[int, dict[Hashable, int]] = field(default_factory=dict)  # group -> key -> position
    arrivals: int = 0  # positions handed to keys vLLM gave none


class TrailingWindows:
    """Per request, the trailing window of every windowed KV cache group.

    Args:
        windows: per group, its window in chunks, or ``None`` for full attention.
    Raises:
        ValueError: a window below 1.
    """

    def __init__(self, windows: Sequence[int | None]) -> None:
        bad = [w for w in windows if w is not None and w < 1]
        if bad:
            raise ValueError(f"windows: must be None or >= 1 chunks, got {list(windows)}")
        self.keep = [None if w is None else w + 1 for w in windows]
        self._requests: dict[str, _Request] = {}

    @property
    def active(self) -> bool:
        """Whether any group is windowed."""
        return any(k is not None for k in self.keep)

    def select(self, req_id: str, keys: Sequence[Hashable], group_of: Callable[[Hashable], int],
               position_of: Callable[[Hashable], int | None]) -> Selection:
        """Decide one store call of request ``req_id`` (nothing changes until :meth:`commit`)."""
        if not self.active:
            return Selection(list(keys), [], {})
        state = self._requests.get(req_id) or _Request()
        offered: dict[int, dict[Hashable, int]] = {}
        arrivals = state.arrivals
        for key in keys:
            g = group_of(key)
            if self.keep[g] is None:
                continue
            pos = position_of(key)
            if pos is None:
                arrivals += 1
                pos = _ARRIVAL_BASE + arrivals
            offered.setdefault(g, {})[key] = pos
        kept, demote, take = {}, [], set()
        for g, cands in offered.items():
            merged = {**state.kept.get(g, {}), **cands}
            tail = dict(sorted(merged.items(), key=lambda kv: kv[1])[-self.keep[g]:])
            kept[g] = tail
            take.update(k for k in cands if k in tail)
            demote += [k for k in state.kept.get(g, {}) if k not in tail]
        offer = [k for k in keys if self.keep[group_of(k)] is None or k in take]
        return Selection(offer, demote, kept)

    def commit(self, req_id: str, selection: Selection) -> None:
        """Record the windows of a store that went ahead."""
        if not selection.kept:
            return
        state = self._requests.setdefault(req_id, _Request())
        state.kept.update(selection.kept)
        state.arrivals = max([state.arrivals] + [p - _ARRIVAL_BASE for w in selection.kept.values()
                                                 for p in w.values() if p > _ARRIVAL_BASE])

    def finish(self, req_id: str) -> None:
        """Forget a finished request (its stored windows stay in the index)."""
        self._requests.pop(req_id, None)

    def clear(self) -> None:
        """Forget every request (a cache reset)."""
        self._requests.clear()

    def __len__(self) -> int:
        return len(self._requests)


_ARRIVAL_BASE = 1 << 62  # keys without a position rank after every real token position
