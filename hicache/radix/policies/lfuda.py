"""`LFUDA`: LFU with dynamic aging (GreedyDual with the cost of a leaf = its tokens), over a radix tree.

Plain LFU keeps what was popular once forever; LRU forgets what is popular the moment a
burst of new prefixes passes. LFU with dynamic aging keeps a tier-wide *age* ``L``, the
priority of the last victim, and scores a node at its last access:

    priority(node) = L(at node.last_access) + hit count      lowest evicted first;
                                                             ties: least recently used
    L(tier)        = max(L, priority of each victim)          raised by every eviction

so a node touched now starts above everything that was last touched long ago unless
those were hit more often; counts are kept across evictions (ghosts, as the adaptive
policy's). The priority is computed when the tier evicts, never when a node is touched
(matches and inserts only set ``last_access``): ``L`` is a step function of the LRU clock,
kept as checkpoints ``(clock, L)`` appended when an eviction raises it and looked up by
bisection (O(log n) per candidate); the oldest half is dropped past `MAX_CHECKPOINTS`
(nodes last touched before the oldest kept one score from ``L = 0``: evicted first).
"""
from __future__ import annotations

import bisect
from typing import Callable, Iterable

from hicache.radix.node import TreeNode
from hicache.radix.policies.base import EvictionPolicy, Victims
from hicache.radix.policies.ghosts import Ghost, Ghosts

MAX_CHECKPOINTS = 1 << 16


class _Age:
    """``L`` of one tier as a step function of the clock: ``L`` from clock ``c + 1`` on."""

    __slots__ = ("clocks", "values", "now")

    def __init__(self) -> None:
        self.clocks: list[int] = []
        self.values: list[int] = []
        self.now = 0

    def at(self, clock: int) -> int:
        """``L`` when a node was touched at ``clock`` (before any eviction at that clock)."""
        i = bisect.bisect_left(self.clocks, clock)
        return self.values[i - 1] if i else 0

    def raise_to(self, value: int, clock: int) -> None:
        if value <= self.now:
            return
        self.now = value
        if self.clocks and self.clocks[-1] == clock:
            self.values[-1] = value
            return
        self.clocks.append(clock)
        self.values.append(value)
        if len(self.clocks) > MAX_CHECKPOINTS:
            del self.clocks[:MAX_CHECKPOINTS // 2], self.values[:MAX_CHECKPOINTS // 2]


class LFUDA(EvictionPolicy):
    """LFU with dynamic aging per tier (module docstring).

    Args:
        capacity_tokens: anchor tokens of each tier (``{"device": n, "host": m}``): the ghosts' bound.
        page_bytes: key bytes of one page.
        clock: the tree's LRU clock (``RadixIndex.clock``), read when a victim goes.
    """

    name = "lfuda"

    def __init__(self, capacity_tokens: dict[str, int], page_bytes: int, clock: Callable[[], int]) -> None:
        self.ages = {t: _Age() for t in capacity_tokens}
        self.ghosts = Ghosts(sum(max(1, n) for n in capacity_tokens.values()), page_bytes)
        self.clock = clock

    def entry(self, tier: str, node: TreeNode) -> tuple:
        return (self.ages[tier].at(node.last_access) + node.hit_count, node.last_access, node.id, node)

    def victims(self, tier: str, nodes: Iterable[TreeNode]) -> Victims:
        age = self.ages[tier]
        entries = [(age.at(n.last_access) + n.hit_count, n.last_access, n.id, n) for n in nodes]
        return Victims(entries, lambda n: self.entry(tier, n))

    def dropped(self, tier: str, node: TreeNode) -> None:
        self._aged(tier, node)

    def deleted(self, tier: str, nodes: list[TreeNode]) -> None:
        self._aged(tier, nodes[0])
        for node in nodes:
            self.ghosts.add(node, Ghost(node.hit_count, node.num_tokens))

    def created(self, node: TreeNode) -> None:
        ghost = self.ghosts.take(node)
        if ghost is not None:
            node.hit_count = max(node.hit_count, ghost.hit_count)

    def _aged(self, tier: str, victim: TreeNode) -> None:
        age = self.ages[tier]
        age.raise_to(age.at(victim.last_access) + victim.hit_count, self.clock())
