"""`Adaptive`: LRU and LFU as two experts, weighted by the misses each one caused (LeCaR-like).

Neither LRU nor LFU wins on every workload (a trace of returning users favours counts,
one of fresh conversations favours recency), so each tier keeps a weight per expert and
lets the traffic decide:

    evict (one call)    pick an expert with probability = its weight (seeded: a replay is
                        reproducible); its order is the heap of the call
                          lru   last access
                          lfu   hit count kept across evictions (ghosts), then last access
    a victim leaves     device copy dropped: the node remembers the expert (and when);
                        deleted: a ghost remembers it (`hicache.radix.policies.ghosts`)
    it comes back       device: a load or a revive of a node whose device copy an expert
                        dropped; tree: a node created where a ghost is
                        -> that expert's weight *= exp(-LEARNING_RATE * DISCOUNT ** age),
                           age = tokens the tier evicted since, over its capacity; both
                           weights renormalized to sum 1 (never below MIN_WEIGHT)

A miss blamed on an expert soon after its eviction counts more than one long after; a
workload that changes moves the weights within a few of its misses.
"""
from __future__ import annotations

import math
import random
from typing import Iterable, NamedTuple

from hicache.radix.node import TreeNode
from hicache.radix.policies.base import EvictionPolicy, Victims
from hicache.radix.policies.ghosts import Ghost, Ghosts


class _Blame(NamedTuple):
    """Who to blame when a deleted node comes back."""

    tier: str  # the tier whose eviction deleted it
    expert: int  # the expert that chose it (-1: deleted below a victim, no one chose it)
    when: int  # the tier's evicted tokens when it left
    device_expert: int  # the expert that dropped its device copy before (-1: none)
    device_when: int

LRU_EXPERT, LFU_EXPERT = 0, 1
LEARNING_RATE = 0.45  # LeCaR's
DISCOUNT = 0.005  # a miss one tier capacity of evictions later weighs 0.5 % of a fresh one
MIN_WEIGHT = 0.01  # an expert never vanishes: it can win back a changed workload


class Adaptive(EvictionPolicy):
    """LRU and LFU experts per tier, weighted by their misses (module docstring).

    Args:
        capacity_tokens: anchor tokens of each tier (``{"device": n, "host": m}``).
        page_bytes: key bytes of one page.
        seed: seed of the expert draws.
    """

    name = "adaptive"

    def __init__(self, capacity_tokens: dict[str, int], page_bytes: int, seed: int = 0) -> None:
        self.capacity = {t: max(1, n) for t, n in capacity_tokens.items()}
        self.weights = {t: [0.5, 0.5] for t in capacity_tokens}
        self.evicted_tokens = dict.fromkeys(capacity_tokens, 0)
        self.ghosts = Ghosts(sum(self.capacity.values()), page_bytes)
        self._marks: dict[TreeNode, tuple[int, int]] = {}  # device copy dropped by (expert, when)
        self.rng = random.Random(seed)  # the expert draws (a test may give its own)
        self._expert = dict.fromkeys(capacity_tokens, LRU_EXPERT)  # the expert of the last draw

    # ---- order ---------------------------------------------------------------------------
    def entry(self, tier: str, node: TreeNode) -> tuple:
        return _ENTRIES[self._expert[tier]](node)

    def victims(self, tier: str, nodes: Iterable[TreeNode]) -> Victims:
        expert = self.draw(tier)
        entry = _ENTRIES[expert]
        return Victims([entry(n) for n in nodes], entry)

    def draw(self, tier: str) -> int:
        """Draw the expert of ``tier``'s next eviction (LRU with probability its weight)."""
        w = self.weights[tier]
        self._expert[tier] = LRU_EXPERT if self.rng.random() < w[LRU_EXPERT] / (w[0] + w[1]) else LFU_EXPERT
        return self._expert[tier]

    # ---- history -------------------------------------------------------------------------
    def dropped(self, tier: str, node: TreeNode) -> None:
        self.evicted_tokens[tier] += node.num_tokens
        if tier == "device":
            self._marks[node] = (self._expert[tier], self.evicted_tokens[tier])

    def deleted(self, tier: str, nodes: list[TreeNode]) -> None:
        self.evicted_tokens[tier] += nodes[0].num_tokens
        when = self.evicted_tokens[tier]
        for i, node in enumerate(nodes):
            dev_expert, dev_when = self._marks.pop(node, (-1, 0))
            expert = self._expert[tier] if i == 0 else -1
            blame = _Blame(tier, expert, when, dev_expert, dev_when)
            self.ghosts.add(node, Ghost(node.hit_count, node.num_tokens, blame))

    def created(self, node: TreeNode) -> None:
        ghost = self.ghosts.take(node)
        if ghost is None:
            return
        node.hit_count = max(node.hit_count, ghost.hit_count)  # counts kept across the eviction
        blame = ghost.memo
        if blame.expert >= 0:
            self._blame(blame.tier, blame.expert, blame.when)
        if blame.device_expert >= 0 and blame.tier != "device":
            self._blame("device", blame.device_expert, blame.device_when)

    def regained(self, tier: str, nodes: Iterable[TreeNode]) -> None:
        if tier != "device":
            return
        for node in nodes:
            mark = self._marks.pop(node, None)
            if mark is not None:
                self._blame(tier, *mark)

    def _blame(self, tier: str, expert: int, when: int) -> None:
        """A miss ``expert``'s eviction on ``tier`` (at ``when`` evicted tokens) caused."""
        age = (self.evicted_tokens[tier] - when) / self.capacity[tier]
        w = self.weights[tier]
        w[expert] *= math.exp(-LEARNING_RATE * DISCOUNT ** age)
        total = w[0] + w[1]
        w[0], w[1] = max(MIN_WEIGHT, w[0] / total), max(MIN_WEIGHT, w[1] / total)


def _lru(node: TreeNode) -> tuple:
    return (node.last_access, node.id, node)


def _lfu(node: TreeNode) -> tuple:
    return (node.hit_count, node.last_access, node.id, node)


_ENTRIES = (_lru, _lfu)
