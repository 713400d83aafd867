"""Eviction orders of `HostBlockIndex`: which idle READY chunk of a group goes first.

The plugin's host index is flat: one vLLM offload key per chunk, no tree (vLLM keeps the
prefix tree of the device itself, in LRU order). ``--hicache-eviction-policy`` applies by
its rules on keys instead of nodes:

    policy     here (per group; ``touch`` = vLLM's lookup of a request carrying the key)
    lru        least recently touched, loaded or stored
    lfu        fewest requests (its store, then touches) while the index holds the key,
               then least recent
    lfuda      requests + the group's age when last touched (the score of the last
               victim), then least recent; requests kept after an eviction (ghosts)
    adaptive   per store, LRU or LFU (requests kept after an eviction), drawn by weights
               that the misses each one's victims caused lower (a victim stored again)
    tiered     lru: the host is the plugin's only tier, and ``tiered``'s host tier is LRU

A demoted key (a sliding-window chunk no returning prefix needs) goes before all others.
Ghosts (touch counts and who evicted a key) are kept for as many keys as the group has
chunks, oldest forgotten first. Every order is O(log n) per key (LRU: O(1)).
"""
from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import OrderedDict
from typing import Hashable, Iterable

LEARNING_RATE, DISCOUNT, MIN_WEIGHT = 0.45, 0.005, 0.01  # as hicache.radix.policies.adaptive


class LruOrder:
    """Least recently used idle keys first (an ordered dict)."""

    def __init__(self) -> None:
        self._keys: OrderedDict[Hashable, None] = OrderedDict()

    def keys(self) -> set:
        return set(self._keys)

    def add(self, key: Hashable, demoted: bool = False) -> None:
        """``key`` became idle (most recent; first to go when ``demoted``)."""
        self._keys[key] = None
        self._keys.move_to_end(key, last=not demoted)

    def discard(self, key: Hashable) -> None:
        """``key`` is no longer idle (pinned by a load)."""
        self._keys.pop(key, None)

    def touch(self, key: Hashable) -> None:
        if key in self._keys:
            self._keys.move_to_end(key)

    def demote(self, key: Hashable) -> None:
        if key in self._keys:
            self._keys.move_to_end(key, last=False)

    def victims(self, count: int, protected: set) -> list:
        """Up to ``count`` idle keys not in ``protected``, first to go first (nothing changes)."""
        out: list = []
        for key in self._keys:
            if len(out) >= count:
                break
            if key not in protected:
                out.append(key)
        return out

    def stored(self, key: Hashable) -> None:
        """``key`` entered the index (a store was planned for it)."""

    def evicted(self, key: Hashable) -> None:
        """``key`` is evicted (then forgotten)."""

    def forget(self, key: Hashable) -> None:
        """``key`` left the index."""
        self._keys.pop(key, None)


class ScoredOrder(LruOrder):
    """Idle keys by score (``lfu``, ``lfuda``, ``adaptive``): a heap per expert, stale entries skipped.

    Args:
        rule: ``"lfu"``, ``"lfuda"`` or ``"adaptive"``.
        capacity: the group's chunks (the ghosts' bound).
        seed: seed of the adaptive draws.
    """

    def __init__(self, rule: str, capacity: int, seed: int = 0) -> None:
        self.rule, self.capacity = rule, max(1, capacity)
        self._idle: dict[Hashable, int] = {}  # idle key -> the stamp of its live heap entries
        self._score_of: dict[Hashable, int] = {}  # idle key -> its score (lfuda's age follows victims)
        self._heaps: list[list] = [[], []] if rule == "adaptive" else [[]]
        self._stamps = itertools.count()
        self.touches: dict[Hashable, int] = {}
        self.ghosts: OrderedDict[Hashable, tuple[int, int, int]] = OrderedDict()  # touches, expert, when
        self.age = 0  # lfuda: the score of the last victim
        self.weights, self.rng, self.expert, self.evictions = [0.5, 0.5], random.Random(seed), 1, 0

    def keys(self) -> set:
        return set(self._idle)

    def _score(self, heap: int, key: Hashable, stamp: int) -> tuple:
        if self.rule == "adaptive" and heap == 0:  # the LRU expert
            return (stamp, stamp, key)
        base = self.age if self.rule == "lfuda" else 0
        return (base + self.touches.get(key, 0), stamp, key)

    def add(self, key: Hashable, demoted: bool = False) -> None:
        stamp = next(self._stamps)
        self._idle[key] = stamp
        for i, heap in enumerate(self._heaps):
            entry = (-1, stamp, key) if demoted else self._score(i, key, stamp)
            heapq.heappush(heap, entry)
        self._score_of[key] = entry[0]

    def discard(self, key: Hashable) -> None:
        self._idle.pop(key, None)
        self._score_of.pop(key, None)

    def touch(self, key: Hashable) -> None:
        self.touches[key] = self.touches.get(key, 0) + 1
        if key in self._idle:
            self.add(key)

    def demote(self, key: Hashable) -> None:
        if key in self._idle:
            self.add(key, demoted=True)

    def victims(self, count: int, protected: set) -> list:
        if self.rule == "adaptive":
            self.expert = 0 if self.rng.random() < self.weights[0] / sum(self.weights) else 1
        heap = self._heaps[self.expert if self.rule == "adaptive" else 0]
        popped, out = [], []
        while heap and len(out) < count:
            entry = heapq.heappop(heap)
            if self._idle.get(entry[2]) != entry[1]:
                continue  # stale: re-scored since, or no longer idle
            popped.append(entry)
            if entry[2] not in protected:
                out.append(entry)
        for entry in popped:  # nothing changes until the caller evicts them
            heapq.heappush(heap, entry)
        return [e[2] for e in out]

    def stored(self, key: Hashable) -> None:
        self.touches[key] = 1  # the request that stores it is its first
        ghost = self.ghosts.pop(key, None)
        if ghost is None:
            return
        touches, expert, when = ghost
        if self.rule != "lfu":
            self.touches[key] = touches + 1  # kept across the eviction
        if self.rule == "adaptive":
            w = self.weights
            w[expert] *= math.exp(-LEARNING_RATE * DISCOUNT ** ((self.evictions - when) / self.capacity))
            total = w[0] + w[1]
            w[0], w[1] = max(MIN_WEIGHT, w[0] / total), max(MIN_WEIGHT, w[1] / total)

    def evicted(self, key: Hashable) -> None:
        if self.rule == "lfuda":
            self.age = max(self.age, self._score_of.get(key, 0))
        self.evictions += 1
        self.ghosts[key] = (self.touches.get(key, 0), self.expert, self.evictions)
        while len(self.ghosts) > self.capacity:
            self.ghosts.popitem(last=False)

    def forget(self, key: Hashable) -> None:
        self.discard(key)
        self.touches.pop(key, None)


def make_order(policy: str, capacity: int) -> LruOrder:
    """The order of one group of ``capacity`` chunks under ``policy`` (module docstring).

    Raises:
        ValueError: an unknown policy (naming the key and the allowed values).
    """
    if policy in ("lru", "tiered"):
        return LruOrder()
    if policy in ("lfu", "lfuda", "adaptive"):
        return ScoredOrder(policy, capacity)
    raise ValueError(f"eviction_policy (--hicache-eviction-policy): must be one of lru, lfu, adaptive, lfuda, "
                     f"tiered, got {policy!r}")


def orders(policy: str, capacities: Iterable[int]) -> list[LruOrder]:
    """One order per group."""
    return [make_order(policy, n) for n in capacities]
