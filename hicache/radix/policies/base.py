"""`EvictionPolicy`: the order in which a tier of `HiRadixCache` gives up its leaves.

The evictor (`hicache.radix.evict`) asks a policy for one thing when it evicts: the
candidates of a tier as `Victims`, best victim first. A policy with a history hears of
the tree's events (each a no-op here):

    event                  called by                   when
    created(node)          RadixIndex.add_child        a node joins the tree (insert, storage landing)
    dropped(tier, node)    Evictor                     a tier gives up a leaf's copy; the node stays
    deleted(tier, nodes)   Evictor                     a victim (first) and its subtree leave the tree
    regained(tier, nodes)  Inserter, Transfers         nodes get a tier's copy back (revive, load ack)

A node's score is its own (``last_access``, ``hit_count``): its history and its state
snapshot (DeepSeek-V4) go together, and a snapshot evicted on its own is chosen by the
same score. Locked nodes and nodes with a transfer in flight never become candidates
(the evictor filters them), so no policy can pick one.
"""
from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from typing import Iterable

from hicache.radix.node import TreeNode


class Victims:
    """One eviction's candidates on one tier, best victim first (a heap: O(log n) per pop).

    Args:
        entries: heap entries ``(score..., node.id, node)`` (the node last).
        entry: the entry of a node that becomes a candidate meanwhile (its parent).
    """

    __slots__ = ("_heap", "_entry")

    def __init__(self, entries: list[tuple], entry) -> None:
        heapq.heapify(entries)
        self._heap, self._entry = entries, entry

    def __bool__(self) -> bool:
        return bool(self._heap)

    def pop(self) -> TreeNode:
        """The best victim left (the caller checks the heap is not empty)."""
        return heapq.heappop(self._heap)[-1]

    def push(self, node: TreeNode) -> None:
        """Add ``node`` (a new leaf of the tier) to the candidates."""
        heapq.heappush(self._heap, self._entry(node))


class EvictionPolicy(ABC):
    """Which leaf a tier evicts first (scheduler thread; one instance per tree)."""

    name: str = ""

    @abstractmethod
    def entry(self, tier: str, node: TreeNode) -> tuple:
        """The heap entry of ``node`` on ``tier``: ``(score..., node.id, node)``, lowest first."""

    def victims(self, tier: str, nodes: Iterable[TreeNode]) -> Victims:
        """The candidates ``nodes`` (unlocked leaves of ``tier``) as a heap."""
        return Victims([self.entry(tier, n) for n in nodes], lambda n: self.entry(tier, n))

    def created(self, node: TreeNode) -> None:
        """``node`` joined the tree."""

    def dropped(self, tier: str, node: TreeNode) -> None:
        """``tier`` gave up ``node``'s copy; another tier still holds it."""

    def deleted(self, tier: str, nodes: list[TreeNode]) -> None:
        """``nodes`` left the tree: ``nodes[0]`` was ``tier``'s victim, the rest its subtree."""

    def regained(self, tier: str, nodes: Iterable[TreeNode]) -> None:
        """``nodes`` got ``tier``'s copy back."""


class LRU(EvictionPolicy):
    """Least recently used first (last match or insert touching the node)."""

    name = "lru"

    def entry(self, tier: str, node: TreeNode) -> tuple:
        return (node.last_access, node.id, node)

    def victims(self, tier: str, nodes: Iterable[TreeNode]) -> Victims:
        return Victims([(n.last_access, n.id, n) for n in nodes], _lru_entry)


def _lru_entry(node: TreeNode) -> tuple:
    return (node.last_access, node.id, node)


class LFU(EvictionPolicy):
    """Fewest hits first (``hit_count``: inserts through the node while it is in the
    tree, under every write policy), least recently used within a tie."""

    name = "lfu"

    def entry(self, tier: str, node: TreeNode) -> tuple:
        return (node.hit_count, node.last_access, node.id, node)
