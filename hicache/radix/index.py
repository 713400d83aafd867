"""`RadixIndex`: the node structure of `HiRadixCache` — the root, walks along keys, splits,
the LRU clock and the epoch that says when a kept walk went stale.

It knows nodes and keys, never which slots they hold or where: the tiers
(`hicache.radix.tiers`) and the transfers (`hicache.radix.transfers`) change those, and
bump the epoch when they do. A match keeps its walk so that the insert of the same
tokens that follows continues it instead of walking again:

    match_prefix(tokens)   walk, keep (path, epoch, the device slots, their tensor version)
    ... a split, a deletion, a copy dropped or published: epoch += 1 (the kept walk is stale)
    insert(tokens, ...)    walk again from the root, along the kept path without lookups
                           while the key matches its nodes (same epoch); the kept slots
                           are the insert's hint when the walk went through the whole path

The slots a match returns are never a node's tensor: the path's device slots are
gathered once into a fresh array (`hicache.radix.read`'s gather: one copy, no torch call but
the tensor handed out over it; a second copy would cost a match as much again). That
array is kept only as the insert's *hint* of what the
tree's slots along the path are: it decides which of the caller's pages in the cached
prefix differ (and are freed when no node holds them). An edit in place through torch
bumps the tensor's version and the hint is dropped (the insert checks every slot); an
edit through a numpy view is not seen, so a page the caller wrote there is not freed (it
stays the caller's). Either way the tree's own slots, and what it holds, never change.

A node matched only in part is split (non-hybrid stacks) so that a match ends on a node
boundary; where a hybrid (DeepSeek-V4) match may end: `hicache.radix.hybrid`.
"""
from __future__ import annotations

import numpy as np
import torch

from hicache.radix.hybrid import select_match_end
from hicache.radix.node import EMPTY_SLOTS, TreeNode, common_pages, new_root
from hicache.radix.read import READ, ReadPath, file_child, unfile_child

Partial = tuple[TreeNode, int]  # a node matched only in part, and its matched tokens
_NO_SLOTS = np.empty(0, np.int64)  # the hint of a match with no device hit
_NO_SLOTS.flags.writeable = False


class RadixIndex:
    """The node structure (scheduler thread only).

    Args:
        page_size: tokens per page (keys, splits and matches are whole pages).
        read: the form of the read path its walks, touches and gathers run (default: the
            compiled one when built; `hicache.radix.read`).

    Attributes:
        read: that form (the insert's walk and touch use it too).
        root: the root node (empty key, on every tier, never evicted).
        clock: the LRU clock (bumped by every match and insert).
        epoch: bumped by every change a kept walk must not survive.
    """

    def __init__(self, page_size: int, read: ReadPath = READ) -> None:
        self.read = read
        self.page_size = page_size
        self.page_bytes = page_size * 8  # a page of int64 token ids, in bytes
        self.root = new_root()
        self.clock = 0
        self.epoch = 0
        # the last match's (path, epoch, device slots (numpy), the caller's tensor over them
        # and its version, or -1)
        self._kept: tuple | None = None

    # ---- walks -------------------------------------------------------------------------
    def walk(self, key: np.ndarray | bytes, node: TreeNode | None = None) -> tuple[list[TreeNode], Partial | None]:
        """Fully matched nodes below ``node`` (default: the root), and the node matched only
        partly with its matched tokens. ``key`` is the whole key from the root (an int64
        array or its bytes)."""
        node = self.root if node is None else node
        path, child = self.read.walk(node, key, self.page_bytes, None)
        return path, self._partly(key, path[-1] if path else node, child)

    def _partly(self, key: np.ndarray | bytes, above: TreeNode, child: TreeNode | None) -> Partial | None:
        """``child`` (below ``above``, matching ``key`` only in part) with its matched tokens."""
        if child is None:
            return None
        off = above.end << 3
        mine = memoryview(key).cast("B")[off:off + len(child.key)].tobytes()
        return child, common_pages(child.key, mine, self.page_size)

    def match(self, key: np.ndarray, hybrid: bool) -> tuple[list[TreeNode], int, int, torch.Tensor]:
        """The walk of a match of the int64 ``key``: splits a partly matched node
        (non-hybrid), touches the matched nodes (LRU) and keeps the walk. Returns (path,
        index of the last device node, index of the match end, the device slots of the path
        up to the last device node: a tensor of the caller's, never the tree's); -1 is the root."""
        path, child = self.read.walk(self.root, key, self.page_bytes, None)
        if hybrid:
            d, e = select_match_end(path, True)
            self.touch(path[:e + 1])
        else:
            if child is not None:
                path.append(self.split(*self._partly(key, path[-1] if path else self.root, child)))
            self.clock += 1
            e = len(path) - 1
            # touched (LRU) and counted in one pass; device nodes are closed under parent
            d = self.read.touch(path, self.clock, False) - 1
        if d >= 0:  # a fresh array, the caller's tensor over it; kept as the next insert's hint
            hint = np.empty(path[d].end, np.int64)
            self.read.gather(path, d + 1, hint)
            slots = torch.from_numpy(hint)
            self._kept = (path, self.epoch, hint, slots, slots._version)
        else:
            slots = EMPTY_SLOTS.new_empty(0)
            self._kept = (path, self.epoch, _NO_SLOTS, slots, -1)
        return path, d, e, slots

    def continue_walk(self, key: np.ndarray) -> tuple[list[TreeNode], Partial | None, np.ndarray | None]:
        """The walk of the int64 ``key`` from the root and the tree's device slots along the
        kept match (read only), or ``None`` for them. The walk follows the kept match's path
        without lookups while the key matches its nodes; the slots are given when the epoch
        did not change since the match, the walk went through the match's whole path and
        the caller did not edit the match's slots in place."""
        kept = self._kept
        hint = kept[0] if kept is not None and kept[1] == self.epoch else None
        path, child = self.read.walk(self.root, key, self.page_bytes, hint)
        partial = self._partly(key, path[-1] if path else self.root, child)
        if hint is None:
            return path, partial, None
        k = len(hint)
        if k > len(path) or (k and path[k - 1] is not hint[-1]) or (kept[4] >= 0 and kept[3]._version != kept[4]):
            return path, partial, None  # another prefix, or slots edited in place (checked in full)
        return path, partial, kept[2]

    # ---- changes -----------------------------------------------------------------------
    def changed(self) -> None:
        """A node's copy on some tier was dropped or published: kept walks are stale."""
        self.epoch += 1

    def touch(self, nodes) -> int:
        """Mark ``nodes`` used now (LRU); returns the clock."""
        self.clock += 1
        clock = self.clock
        for n in nodes:
            n.last_access = clock
        return clock

    def add_child(self, parent: TreeNode, node: TreeNode) -> None:
        """File ``node`` (its ``parent`` already set) under its first page."""
        file_child(parent.children, node, self.page_bytes)

    def detach(self, node: TreeNode) -> None:
        """Remove ``node`` (and so its subtree) from its parent."""
        unfile_child(node.parent.children, node, self.page_bytes)
        self.epoch += 1

    def split(self, node: TreeNode, num_tokens: int) -> TreeNode:
        """Cut ``node`` after ``num_tokens`` (whole pages); returns the new upper half.

        The upper half takes the prefix slices of both tiers (and of the page hashes) and
        copies lock, hits, access time, any transfer in flight and whether it is stored;
        the snapshot stays with the lower half (it belongs to the end boundary, which does
        not move).
        """
        self.epoch += 1
        parent, cut = node.parent, num_tokens << 3
        upper = TreeNode(key=node.key[:cut], end=node.end - node.num_tokens + num_tokens,
                         parent=parent, lock_ref=node.lock_ref, hit_count=node.hit_count,
                         last_access=node.last_access, pending=node.pending, stored=node.stored)
        if node._device is not None:
            upper._device, node._device = node._device[:num_tokens], node._device[num_tokens:]
        if node._host is not None:
            upper._host, node._host = node._host[:num_tokens], node._host[num_tokens:]
        if node.hashes is not None:
            pages = num_tokens // self.page_size
            upper.hashes, node.hashes = node.hashes[:pages], node.hashes[pages:]
        pb = self.page_bytes
        file_child(parent.children, upper, pb)  # in ``node``'s place: the same first page
        node.key = node.key[cut:]
        node.parent = upper
        file_child(upper.children, node, pb)
        return upper
