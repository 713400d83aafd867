"""`Ghosts`: what a policy remembers of nodes that left the tree.

A node that leaves the tree (deleted from the host, or from the device when nothing
holds it below) leaves a *ghost*: who evicted it, when, and its hit count. A node that
joins the tree later at the same place with the same leading tokens (an insert of that
prefix again, a storage landing) finds it: a hit count kept across the eviction, and a
miss that the evicting expert is blamed for.

    ghost key    (start token of the node, its first min(8 tokens rounded up to a page,
                  whole key) token ids): a re-inserted prefix starts where the deleted
                  leaf started (its parent is still there) or at the parent's start (the
                  parent went too, and left its own ghost)
    capacity     ghosts of at most ``capacity_tokens`` tokens, oldest dropped first (FIFO)
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

from hicache.radix.node import TreeNode

KEY_BYTES = 64  # 8 int64 token ids: enough to tell two prefixes apart at one position


class Ghost(NamedTuple):
    """A node that left the tree: its hit count and what the policy remembers of it."""

    hit_count: int
    tokens: int
    memo: Any = None


class Ghosts:
    """A bounded FIFO of ghosts keyed by where the node started and its first tokens.

    Args:
        capacity_tokens: tokens of all ghosts together (>= 1).
        page_bytes: bytes of one page of a key (8 per token).
    """

    def __init__(self, capacity_tokens: int, page_bytes: int) -> None:
        self.capacity_tokens = max(1, capacity_tokens)
        self.key_bytes = KEY_BYTES - KEY_BYTES % page_bytes if page_bytes <= KEY_BYTES else page_bytes
        self._ghosts: OrderedDict[tuple, Ghost] = OrderedDict()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._ghosts)

    def key(self, node: TreeNode) -> tuple:
        """Where ``node`` starts and its first token ids (as bytes)."""
        return (node.end - node.num_tokens, node.key[:self.key_bytes])

    def add(self, node: TreeNode, ghost: Ghost) -> None:
        """Remember ``ghost`` for ``node`` (which leaves the tree); the oldest go past capacity."""
        key = self.key(node)
        old = self._ghosts.pop(key, None)
        if old is not None:
            self.tokens -= old.tokens
        self._ghosts[key] = ghost
        self.tokens += ghost.tokens
        while self.tokens > self.capacity_tokens and self._ghosts:
            self.tokens -= self._ghosts.popitem(last=False)[1].tokens

    def take(self, node: TreeNode) -> Ghost | None:
        """The ghost of a node that joins the tree where one left (forgotten then), or None."""
        if not self._ghosts:  # nothing has left the tree yet (or every ghost was taken): no key to make
            return None
        ghost = self._ghosts.pop(self.key(node), None)
        if ghost is not None:
            self.tokens -= ghost.tokens
        return ghost
