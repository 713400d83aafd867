"""Eviction for `HiRadixCache`: one LRU mechanism for every tier (`hicache.radix.tiers`).

Candidates are kept per tier in sets that may hold stale entries; every transition that
can make a node a leaf adds it (a node gaining its tier without children there, a child
losing it), and each eviction filters the set, so no pass walks the whole tree:

    device leaf  history on device, no child with history on device
    host leaf    history on host only, no children at all

    evict(n) / evict_host(n) on a leaf of the tier (LRU first, unlocked, no transfer in flight):
        the tier below holds the history       -> drop this tier's copy (history and snapshot)
        it does not, tier writes back          -> back it up below first, then drop the copy;
                                                  a failed backup deletes the node's subtree
        it does not, otherwise                 -> delete the node's subtree
    device: below = host, writes back under ``write_back`` (a synchronous backup);
    host: nothing below, so a host leaf (held nowhere else) is deleted, and its parent
    may become a host leaf.
"""
from __future__ import annotations

import heapq

from hicache.radix.node import TreeNode
from hicache.radix.tiers import Tier


def _entry(node: TreeNode) -> tuple:
    return (node.last_access, node.id, node)


class EvictionMixin:
    """Device and host eviction of `HiRadixCache`."""

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` device anchor slots if the unlocked tree allows.

        Backed-up nodes drop their device copy; others are backed up first under
        ``write_back`` (a synchronous backup) and deleted otherwise. Locked nodes and
        nodes with a transfer in flight are never touched. Mutates the tree.

        Returns:
            Device anchor slots freed (whole pages; may exceed ``num_tokens``, or fall
            short when everything left is locked).
        """
        return self._evict(self.device_tier, num_tokens)

    def evict_host(self, num_tokens: int) -> int:
        """Delete host-only leaves, least recently used first, until ``num_tokens`` are free.

        Never touches a locked node, one with a transfer in flight, or a node whose
        history is on the device. Mutates the tree.

        Returns:
            Host anchor slots freed (may fall short when nothing else is evictable).
        """
        return self._evict(self.host_tier, num_tokens)

    def _evict(self, tier: Tier, num_tokens: int) -> int:
        freed = 0
        while freed < num_tokens:
            heap = self._leaf_heap(tier)
            if not heap:
                break
            gained, staged = self._evict_round(tier, heap, num_tokens - freed)
            freed += gained
            if staged:
                freed += self._write_back(tier, staged)
            elif gained == 0:
                break
        self.counters[f"{tier.name}_evicted_tokens"] += freed
        return freed

    def _evict_round(self, tier: Tier, heap: list, need: int) -> tuple[int, list[TreeNode]]:
        freed, staged, staged_tokens = 0, [], 0
        write_back = self._writes_back(tier)
        while heap and freed + staged_tokens < need:
            node = heapq.heappop(heap)[2]
            if write_back and not self._held_below(tier, node):
                staged.append(node)
                staged_tokens += node.num_tokens
                continue
            freed += self._drop(tier, node)
            parent = node.parent
            if tier.is_leaf(parent) and parent.evictable:
                heapq.heappush(heap, _entry(parent))
        return freed, staged

    def _leaf_heap(self, tier: Tier) -> list:
        keep = {n for n in tier.leaves if tier.is_leaf(n)}
        tier.leaves = keep
        heap = [_entry(n) for n in keep if n.evictable]
        heapq.heapify(heap)
        return heap

    def _write_back(self, tier: Tier, nodes: list[TreeNode]) -> int:
        """Back ``nodes`` up to the tier below, then drop their copies here (or the nodes)."""
        self._save_below(tier, nodes)
        return sum(self._drop(tier, n) for n in nodes if not n.dead)

    def _drop(self, tier: Tier, node: TreeNode) -> int:
        """Give back ``tier``'s copy of a leaf; delete the node if no other tier holds its history."""
        tokens = node.num_tokens
        others = [t for t in self.tiers if t is not tier and getattr(node, t.attr) is not None]
        if not others:
            self._delete_subtree(node)
            return tokens
        tier.free(self.anchor, getattr(node, tier.attr))
        setattr(node, tier.attr, None)
        self._epoch += 1
        tier.free_snapshot(node)
        tier.leaves.add(node.parent)
        for other in others:
            other.leaves.add(node)
        return tokens

    def _delete_subtree(self, node: TreeNode) -> None:
        """Remove ``node`` and everything below it, freeing every tier they hold."""
        stack = [node]
        while stack:
            cur = stack.pop()
            stack.extend(cur.children.values())
            for tier in self.tiers:
                slots = tier.slots(cur)
                if slots is not None:
                    tier.free(self.anchor, slots)
                    setattr(cur, tier.attr, None)
                tier.free_snapshot(cur)
            cur.dead = True
        parent = node.parent
        del parent.children[node.key[:self._page_bytes]]
        self._epoch += 1
        for tier in self.tiers:
            tier.leaves.add(parent)
        self.counters["nodes_deleted"] += 1
