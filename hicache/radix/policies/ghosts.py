"""`Ghosts`: the request counts of prefixes that left the cache, so that counts outlive eviction.

A prefix's count (``hit_count``) is the number of requests that carried it, hit or miss.
It lives on the prefix while the cache holds it; when the prefix leaves (a tree node
deleted on its last tier, a vLLM host chunk evicted) its count becomes a *ghost*. A
request that carries the prefix while it is away raises the ghost (`bump`, the plugin's
lookups; the tree counts such a miss when its insert creates the node again), and the
prefix that comes back takes it (`take`): a prefix that keeps returning while evicted
is the one worth keeping.

    ghost key    tree node: where it starts and its first min(8 tokens rounded up to a
                 page, whole key) token ids (`tree_key`): a re-inserted prefix starts
                 where the deleted node started (its parent is still there) or at the
                 parent's start (the parent went too, and left its own ghost);
                 vLLM chunk: its offload key
    capacity     ghosts of at most ``capacity_tokens`` tokens, oldest forgotten first
                 (FIFO): the policies keep `GHOST_SPAN` x the cache's tokens
    memory       ``nbytes()`` (per-ghost size measured with tracemalloc)
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable

KEY_BYTES = 64  # 8 int64 token ids: enough to tell two prefixes apart at one position
GHOST_SPAN = 4  # ghosts kept: this many caches' worth of tokens (a session away for a while still counts)
_GHOST_BYTES = 320  # an OrderedDict slot, its key tuple and the count list (tracemalloc, 64-byte keys)


def tree_key(page_size: int) -> Callable[[Any], tuple]:
    """The ghost key of a tree node: (its start, its first token ids as bytes)."""
    page_bytes = page_size * 8
    key_bytes = KEY_BYTES - KEY_BYTES % page_bytes if page_bytes <= KEY_BYTES else page_bytes
    return lambda node: (node.end - (len(node.key) >> 3), node.key[:key_bytes])


class Ghosts:
    """A bounded FIFO of the counts of prefixes that left the cache.

    Args:
        capacity_tokens: tokens of all ghosts together (>= 1).
        key_of: the ghost key of a prefix (`tree_key`, or a chunk's key).
    """

    def __init__(self, capacity_tokens: int, key_of: Callable[[Any], Hashable]) -> None:
        self.capacity_tokens = max(1, capacity_tokens)
        self.key_of = key_of
        self._ghosts: OrderedDict[Hashable, list[int]] = OrderedDict()  # key -> [count, tokens]
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._ghosts)

    def add(self, item: Any, count: int, tokens: int) -> None:
        """``item`` (``count`` requests, ``tokens`` tokens) leaves the cache; the oldest go past capacity."""
        key = self.key_of(item)
        old = self._ghosts.pop(key, None)
        if old is not None:
            self.tokens -= old[1]
        self._ghosts[key] = [count, tokens]
        self.tokens += tokens
        while self.tokens > self.capacity_tokens and self._ghosts:
            self.tokens -= self._ghosts.popitem(last=False)[1][1]

    def take(self, item: Any) -> int:
        """The count of ``item``'s ghost, forgotten now (``item`` is back), or 0."""
        if not self._ghosts:  # nothing has left yet (or every ghost was taken): no key to make
            return 0
        ghost = self._ghosts.pop(self.key_of(item), None)
        if ghost is None:
            return 0
        self.tokens -= ghost[1]
        return ghost[0]

    def bump(self, key: Hashable) -> bool:
        """One more request carried the prefix of ghost ``key`` while it was away; whether it has one."""
        ghost = self._ghosts.get(key)
        if ghost is None:
            return False
        ghost[0] += 1
        return True

    def nbytes(self) -> int:
        """An estimate of the memory the ghosts take."""
        return len(self._ghosts) * _GHOST_BYTES
