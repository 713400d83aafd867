"""`PolicyOrder`: the eviction order of one group of `HostBlockIndex`, by the tree's policies.

The plugin's host index is flat: one vLLM offload key per chunk, no tree (vLLM keeps the
prefix tree of the device itself). ``--hicache-eviction-policy`` ranks its chunks with
the very policy objects of the radix tree (`hicache.radix.policies`: one implementation,
one meaning of a count): a chunk is an item with the fields they read, its only tier is
``"host"`` (``tiered`` is therefore LRU here), its depth is its place in its request's
chain (a chain is given up from its end), and the clock counts lookups and stores:

    index call              here                                          the policy hears
    touch(keys) (a lookup)  held chunks: last access = now, one request    requested(keys)
                            more; an evicted key's ghost: one request more
    prepare_store -> store  a chunk joins with its ghost's count, or 1     created(chunk)
    complete_store / load   the chunk becomes idle: a candidate
    prepare_load            pinned: no longer a candidate
    eviction                the lowest idle chunk goes                     deleted("host", [chunk])

A demoted chunk (a sliding-window chunk no returning prefix needs) goes before all others.

Memory is bounded by what the group holds: a touch changes the chunk's fields and pushes
nothing; the heap holds one entry per idle chunk plus entries made stale by pins, and
is rebuilt from the idle chunks when those pass twice the live ones (or when the policy's
keys may have fallen: ``policy.version``). A popped entry whose chunk was touched since
is pushed back with its key now (keys only grow between touches: `scores`). Ghosts are
the policy's, bounded by tokens.
"""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable, Iterable

from hicache.radix.policies import EvictionPolicy, make_policy
from hicache.radix.policies.requests import KeyChains

_ids = itertools.count()
COMPACT_SLACK = 64  # stale heap entries tolerated beyond twice the live ones


@dataclass(slots=True, eq=False)
class Chunk:
    """One host chunk as a policy sees it (the fields `EvictionPolicy` reads)."""

    key: Hashable
    last_access: int = 0
    hit_count: int = 1
    end: int = 1  # its place in the chain of the request that last touched it (1: the root's)
    num_tokens: int = 1
    stamp: int = 0  # changes when it stops being idle: older heap entries are stale
    idle: bool = False
    id: int = field(default_factory=_ids.__next__)


class PolicyOrder:
    """Idle chunks of one group in an `EvictionPolicy`'s order (module docstring).

    Args:
        policy: the group's policy (``make_policy`` for a group: `make_order`).
    """

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.clock = 0
        self.chunks: dict[Hashable, Chunk] = {}  # every key the index holds
        self._heap: list[tuple] = []  # (entry, stamp); entry[-1] is the chunk
        self._idle = 0
        self._demoted: OrderedDict[Hashable, None] = OrderedDict()  # idle demoted keys, first to go
        self._version = policy.version

    def keys(self) -> set:
        """The idle keys (candidates)."""
        return {k for k, c in self.chunks.items() if c.idle}

    def heap_entries(self) -> int:
        """Entries in the heap (live and stale): bounded by twice the idle chunks + slack."""
        return len(self._heap) + len(self._demoted)

    # ---- the index's calls -----------------------------------------------------------------
    def stored(self, key: Hashable) -> None:
        """``key`` entered the index (a store was planned for it): it takes its ghost's count."""
        self.clock += 1  # a store is an access (after any eviction it made)
        chunk = Chunk(key, last_access=self.clock)
        self.policy.created(chunk)
        self.chunks[key] = chunk

    def add(self, key: Hashable, demoted: bool = False) -> None:
        """``key`` became idle (a candidate; the first to go when ``demoted``)."""
        chunk = self.chunks[key]
        chunk.idle = True
        self._idle += 1
        if demoted:
            self._demoted[key] = None
        else:
            self._push(chunk)

    def discard(self, key: Hashable) -> None:
        """``key`` is no longer idle (pinned by a load)."""
        chunk = self.chunks.get(key)
        if chunk is not None and chunk.idle:
            chunk.idle = False
            chunk.stamp += 1
            self._idle -= 1
            self._demoted.pop(key, None)

    def touch(self, keys: Iterable[Hashable]) -> None:
        """A request carries ``keys`` (root first): one request more for each, held or a ghost."""
        self.clock += 1
        now, chunks, history = self.clock, self.chunks, self.policy.history
        for depth, key in enumerate(keys, 1):
            chunk = chunks.get(key)
            if chunk is not None:
                chunk.last_access, chunk.end = now, depth
                chunk.hit_count += 1
            elif history is not None:
                history.bump(key)
        if self.policy.hears_requests:
            self.policy.requested(keys)

    def demote(self, key: Hashable) -> None:
        chunk = self.chunks.get(key)
        if chunk is not None and chunk.idle:
            self._demoted[key] = None

    def victims(self, count: int, protected: set) -> list:
        """Up to ``count`` idle keys not in ``protected``, first to go first (nothing changes)."""
        out = [k for k in self._demoted if k not in protected][:count]
        if len(out) < count:
            self._refresh()
            popped = []
            while self._heap and len(out) < count:
                entry, chunk = self._pop()
                if chunk is None:
                    continue
                popped.append((entry, chunk.stamp))
                if chunk.key not in protected and chunk.key not in self._demoted:
                    out.append(chunk.key)
            for item in popped:  # nothing changes until the caller evicts them
                heapq.heappush(self._heap, item)
        return out

    def evicted(self, key: Hashable) -> None:
        """``key`` is evicted: its count becomes a ghost (then `forget`)."""
        self.policy.deleted("host", [self.chunks[key]])

    def forget(self, key: Hashable) -> None:
        """``key`` left the index."""
        self.discard(key)
        self.chunks.pop(key, None)

    # ---- the heap ------------------------------------------------------------------------
    def _push(self, chunk: Chunk) -> None:
        heapq.heappush(self._heap, (self.policy.entry("host", chunk), chunk.stamp))
        if len(self._heap) > 2 * self._idle + COMPACT_SLACK:
            self._rebuild()

    def _pop(self) -> tuple[tuple, Chunk | None]:
        """The lowest live entry and its chunk (None: a stale entry, dropped); a chunk touched
        since its entry was made goes back with its key now."""
        while True:
            entry, stamp = heapq.heappop(self._heap)
            chunk = entry[-1]
            if not chunk.idle or chunk.stamp != stamp or chunk.key not in self.chunks:
                return entry, None
            fresh = self.policy.entry("host", chunk)
            if fresh[:-1] <= entry[:-1]:
                return entry, chunk
            heapq.heappush(self._heap, (fresh, stamp))

    def _refresh(self) -> None:
        """Re-key everything when the policy's keys may have fallen (a switch, a slower pace)."""
        scores = self.policy.scores.get("host")
        if scores is not None:
            scores.refresh()
        if self.policy.version != self._version:
            self._version = self.policy.version
            self._rebuild()

    def _rebuild(self) -> None:
        entry = self.policy.entry
        self._heap = [(entry("host", c), c.stamp) for c in self.chunks.values()
                      if c.idle and c.key not in self._demoted]
        heapq.heapify(self._heap)


def make_order(policy: str, capacity: int) -> PolicyOrder:
    """The order of one group of ``capacity`` chunks under ``policy`` (`hicache.config.EVICTION_POLICIES`).

    Raises:
        ValueError: an unknown policy (naming the key and the allowed values).
    """
    order: PolicyOrder | None = None
    made = make_policy(policy, {"host": max(1, capacity)}, lambda: order.clock,
                       ghost_key=lambda chunk: chunk.key, chains=KeyChains(1))
    order = PolicyOrder(made)
    return order


def orders(policy: str, capacities: Iterable[int]) -> list[PolicyOrder]:
    """One order per group."""
    return [make_order(policy, n) for n in capacities]
