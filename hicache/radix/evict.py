"""Eviction for `HiRadixCache`: device (to host or dropped) and host (leaves, LRU).

Candidates are kept in sets that may hold stale entries; every transition that can make
a node a leaf adds it (a node gaining its tier without children there, a child losing
it), and each eviction filters the set, so no pass walks the whole tree:

    device leaf  history on device, no child with history on device
    host leaf    history on host only, no children at all

    evict(n) on a device leaf (LRU first, unlocked, no transfer in flight):
        backed up                  -> drop the device copy (history and snapshot)
        not backed up, write_back  -> back up now (synchronously), then drop the copy;
                                      a failed backup deletes the node's subtree
        not backed up, otherwise   -> delete the node's subtree
    evict_host(n) on a host leaf (LRU first, unlocked, no transfer in flight):
        delete the node (history and snapshot), its parent may become a host leaf
"""
from __future__ import annotations

import heapq

from hicache.radix.node import TreeNode


def _entry(node: TreeNode) -> tuple:
    return (node.last_access, node.id, node)


class EvictionMixin:
    """Device and host eviction of `HiRadixCache`."""

    # ---- device ------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` device anchor slots if the unlocked tree allows.

        Backed-up nodes drop their device copy; others are backed up first under
        ``write_back`` (a synchronous backup) and deleted otherwise. Locked nodes and
        nodes with a transfer in flight are never touched. Mutates the tree.

        Returns:
            Device anchor slots freed (whole pages; may exceed ``num_tokens``, or fall
            short when everything left is locked).
        """
        freed = 0
        while freed < num_tokens:
            heap = self._device_leaf_heap()
            if not heap:
                break
            gained, staged = self._evict_round(heap, num_tokens - freed)
            freed += gained
            if staged:
                freed += self._write_back(staged)
            elif gained == 0:
                break
        self.counters["device_evicted_tokens"] += freed
        return freed

    def _evict_round(self, heap: list, need: int) -> tuple[int, list[TreeNode]]:
        freed, staged, staged_tokens = 0, [], 0
        write_back = self.policy == "write_back" and self.host_enabled
        while heap and freed + staged_tokens < need:
            node = heapq.heappop(heap)[2]
            if node.host is None and write_back:
                staged.append(node)
                staged_tokens += node.num_tokens
                continue
            freed += self._drop_device(node)
            parent = node.parent
            if self._is_device_leaf(parent) and parent.evictable:
                heapq.heappush(heap, _entry(parent))
        return freed, staged

    def _is_device_leaf(self, node: TreeNode) -> bool:
        return not node.dead and not node.is_root and node.device is not None and not node.has_device_child()

    def _device_leaf_heap(self) -> list:
        keep = {n for n in self._dev_leaves if self._is_device_leaf(n)}
        self._dev_leaves = keep
        heap = [_entry(n) for n in keep if n.evictable]
        heapq.heapify(heap)
        return heap

    def _write_back(self, nodes: list[TreeNode]) -> int:
        """Back up ``nodes`` synchronously, then drop their device copies (or the nodes)."""
        ops = [op for op in (self._backup(n) for n in nodes) if op is not None]
        if ops:
            self.wait(ops)
        return sum(self._drop_device(n) for n in nodes if not n.dead)

    def _drop_device(self, node: TreeNode) -> int:
        """Give back the device copy of a device leaf; delete it if it has no host copy."""
        tokens = node.num_tokens
        if node.host is None:
            self._delete_subtree(node)
            return tokens
        self.device_pool.free(node.device)
        node.device = None
        self._free_device_states(node)
        self._dev_leaves.add(node.parent)
        if not node.children:
            self._host_leaves.add(node)
        return tokens

    def _delete_subtree(self, node: TreeNode) -> None:
        """Remove ``node`` and everything below it, freeing every tier they hold."""
        stack = [node]
        while stack:
            cur = stack.pop()
            stack.extend(cur.children.values())
            if cur.device is not None:
                self.device_pool.free(cur.device)
                cur.device = None
            if cur.host is not None:
                self.host_pool.free(cur.host)
                cur.host = None
            self._free_device_states(cur)
            self._free_host_states(cur)
            cur.dead = True
        parent = node.parent
        del parent.children[node.tokens[:self.page_size].tobytes()]
        self._dev_leaves.add(parent)
        self._host_leaves.add(parent)
        self.counters["nodes_deleted"] += 1

    # ---- host --------------------------------------------------------------------
    def _is_host_leaf(self, node: TreeNode) -> bool:
        return (not node.dead and not node.is_root and node.device is None and node.host is not None
                and not node.children)

    def evict_host(self, num_tokens: int) -> int:
        """Delete host-only leaves, least recently used first, until ``num_tokens`` are free.

        Never touches a locked node, one with a transfer in flight, or a node whose
        history is on the device. Mutates the tree.

        Returns:
            Host anchor slots freed (may fall short when nothing else is evictable).
        """
        self._host_leaves = {n for n in self._host_leaves if self._is_host_leaf(n)}
        heap = [_entry(n) for n in self._host_leaves if n.evictable]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            node = heapq.heappop(heap)[2]
            freed += node.num_tokens
            parent = node.parent
            self._delete_subtree(node)
            if self._is_host_leaf(parent) and parent.evictable:
                heapq.heappush(heap, _entry(parent))
        self.counters["host_evicted_tokens"] += freed
        return freed
