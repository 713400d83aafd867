"""`Score`: what an eviction order ranks a cached prefix by, lowest evicted first.

A prefix (a tree node, a vLLM host chunk) carries two numbers, both kept by its owner:
``last_access`` (the clock of the last request that carried it) and ``hit_count`` (the
requests that carried it, hit or miss, kept across its eviction by the policy's ghosts:
`hicache.radix.policies.ghosts`). Every order is a function of the two, with ties broken
by recency, then depth (the deeper prefix first, so a chain is given up from its end):

    score                   primary key                                   changes it
    Recency       lru       last_access                                   -
    Frequency     lfu       hit_count                                     -
    AgedFrequency lfuda     L(at last_access) + hit_count, L the score of  each eviction raises
                            the last victim (dynamic aging)               L (from then on)
    Blend         rf<w>     last_access + W * log2(1 + hit_count),        the traffic's pace
                            W = w x the clock ticks in which the traffic  (W, a power of 2)
                            carries as many tokens as the cache holds

A score's key of a prefix only grows while the prefix is not touched: L and W rise and a
touch raises both numbers. So a key computed earlier is a lower bound of the key now,
which lets an order keep stale keys in a heap and re-score only the ones it pops
(`hicache.radix.policies.shadow`, the vLLM plugin's order). A Blend's W can also fall
(the traffic slows): ``version`` then changes and such an order re-scores everything.
"""
from __future__ import annotations

import bisect
import math
from typing import Callable

MAX_CHECKPOINTS = 1 << 16  # an aging score's checkpoints kept at most (~4.5 MB)
_CHECKPOINT_BYTES = 72  # two list slots, an int and a float (tracemalloc)


class Score:
    """A ranking of prefixes by ``(last_access, hit_count)``, lowest evicted first (Recency)."""

    name = "lru"
    version = 0  # changes when keys computed before are no longer lower bounds

    def key(self, last: int, count: int) -> float:
        """The primary key of a prefix last touched at ``last`` and carried ``count`` times."""
        return last

    def evicted(self, key: float, clock: int) -> None:
        """A prefix of primary ``key`` was evicted at ``clock`` (aging scores raise their age)."""

    def refresh(self) -> None:
        """Take the traffic's pace into account (an order calls it before it ranks)."""

    def nbytes(self) -> int:
        """An estimate of the memory the score keeps (its aging checkpoints)."""
        return 0


class Frequency(Score):
    """Fewest requests first (ties: least recent)."""

    name = "lfu"

    def key(self, last: int, count: int) -> float:
        return count


class AgedFrequency(Score):
    """LFU with dynamic aging: ``L(at last) + count``, ``L`` the key of the last victim.

    ``L`` is a step function of the clock kept as checkpoints ``(clock, L)``, appended
    when an eviction raises it and looked up by bisection; the oldest half is dropped past
    `MAX_CHECKPOINTS` (prefixes last touched before the oldest kept one score from 0).
    """

    name = "lfuda"
    __slots__ = ("clocks", "values", "now")

    def __init__(self) -> None:
        self.clocks: list[int] = []
        self.values: list[float] = []
        self.now = 0.0

    def age_at(self, clock: int) -> float:
        """``L`` when a prefix was touched at ``clock`` (before any eviction at that clock)."""
        i = bisect.bisect_left(self.clocks, clock)
        return self.values[i - 1] if i else 0

    def key(self, last: int, count: int) -> float:
        i = bisect.bisect_left(self.clocks, last)
        return (self.values[i - 1] if i else 0) + count

    def evicted(self, key: float, clock: int) -> None:
        if key <= self.now:
            return
        self.now = key
        if self.clocks and self.clocks[-1] == clock:
            self.values[-1] = key
            return
        self.clocks.append(clock)
        self.values.append(key)
        if len(self.clocks) > MAX_CHECKPOINTS:
            del self.clocks[:MAX_CHECKPOINTS // 2], self.values[:MAX_CHECKPOINTS // 2]

    def nbytes(self) -> int:
        return len(self.clocks) * _CHECKPOINT_BYTES


class Pace:
    """How fast the traffic moves: clock ticks per token requested, and so per capacity.

    Args:
        capacity_tokens: tokens the cache holds (the distinct ones, every tier together).
        clock: the owner's clock (the tree's LRU clock, the plugin's request count).
    """

    __slots__ = ("capacity", "clock", "first", "tokens")

    def __init__(self, capacity_tokens: int, clock: Callable[[], int]) -> None:
        self.capacity, self.clock = max(1, capacity_tokens), clock
        self.first: int | None = None
        self.tokens = 0

    def add(self, tokens: int) -> None:
        """A request carrying ``tokens`` arrived (now)."""
        if self.first is None:
            self.first = self.clock()
        self.tokens += tokens

    def ticks_per_capacity(self) -> float:
        """Clock ticks in which the traffic carries ``capacity_tokens`` (1 before any request)."""
        if not self.tokens:
            return 1.0
        return max(1, self.clock() - self.first) * self.capacity / self.tokens


class Blend(Score):
    """Recency and frequency blended: ``last + W * log2(1 + count)``.

    Args:
        weight: ``w``: W is ``w`` x the ticks in which the traffic carries a cache's worth of
            tokens (`Pace`), rounded to a power of 2 so that it changes seldom.
        pace: the traffic's pace.
    """

    def __init__(self, weight: float, pace: Pace) -> None:
        self.weight, self.pace = weight, pace
        self.name = f"rf{weight:g}"
        self.version = 0
        self._w = 0.0

    def refresh(self) -> None:
        """W from the pace now, in clock ticks (``version`` changes when it falls)."""
        raw = self.weight * self.pace.ticks_per_capacity()
        w = 2.0 ** round(math.log2(raw))
        if w < self._w:
            self.version += 1
        self._w = w

    def key(self, last: int, count: int) -> float:
        return last + self._w * math.log2(1 + count)


def make_score(name: str, pace: Pace) -> Score:
    """The score named ``name`` (``lru``, ``lfu``, ``lfuda`` or ``rf<w>``), blends on ``pace``.

    Raises:
        ValueError: another name.
    """
    plain = {"lru": Score, "lfu": Frequency, "lfuda": AgedFrequency}.get(name)
    if plain is not None:
        return plain()
    if name.startswith("rf"):
        try:
            weight = float(name[2:])
        except ValueError:
            weight = 0.0
        if weight > 0:
            return Blend(weight, pace)
    raise ValueError(f"score: must be lru, lfu, lfuda or rf<w> (w > 0), got {name!r}")
