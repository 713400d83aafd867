"""`EvictionPolicy`: the order in which a tier gives up its prefixes, and their counts' history.

One implementation serves the radix tree (its items are `TreeNode`s, its tiers
``"device"`` and ``"host"``) and the vLLM plugin's host index (its items are host chunks,
one tier ``"host"``). An item carries ``last_access`` (its owner's clock at the last
request that carried it), ``hit_count`` (those requests, hit or miss), ``end`` (its
depth: tokens up to its end), ``num_tokens`` and ``id``. The owner asks a policy for its
order, and tells it what happens (each a no-op unless a policy needs it):

    call / event            called by (tree; plugin)                  when
    entry(tier, item)       Evictor; the plugin's order               ranking one item
    victims(tier, items)    Evictor                                   a tier evicts
    created(item)           RadixIndex.add_child; a store             an item joins (its ghost's count back)
    dropped(tier, item)     Evictor                                   a tier gives up a copy; the item stays
    deleted(tier, items)    Evictor; an eviction                      items leave (their counts become ghosts)
    regained(tier, items)   Inserter, Transfers                       items get a tier's copy back
    requested(request)      match_prefix; a lookup (``hears_requests``) a request arrives (its prompt)

Entries are ``(key, last_access, -end, id, item)``, lowest first: a `Score`'s key
(`hicache.radix.policies.scores`), then the least recent, then the deepest (a chain is
given up from its end). Locked items and items with a transfer in flight never become
candidates (their owner filters them), so no policy can pick one.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterable

from hicache.radix.policies.ghosts import Ghosts
from hicache.radix.policies.scores import Score


class Victims:
    """One eviction's candidates on one tier, best victim first (a heap: O(log n) per pop).

    Args:
        entries: heap entries ``(score..., id, item)`` (the item last).
        entry: the entry of an item that becomes a candidate meanwhile (its parent).
    """

    __slots__ = ("_heap", "_entry")

    def __init__(self, entries: list[tuple], entry) -> None:
        heapq.heapify(entries)
        self._heap, self._entry = entries, entry

    def __bool__(self) -> bool:
        return bool(self._heap)

    def pop(self):
        """The best victim left (the caller checks the heap is not empty)."""
        return heapq.heappop(self._heap)[-1]

    def push(self, item) -> None:
        """Add ``item`` (a new leaf of the tier) to the candidates."""
        heapq.heappush(self._heap, self._entry(item))


class EvictionPolicy:
    """Which item a tier evicts first, by one `Score` per tier (scheduler thread; one
    instance per owner: it keeps that owner's history).

    Args:
        scores: the score of each tier, keyed by tier name.
        history: the ghosts of items that left (counts kept across eviction), or None.
        clock: the owner's clock (read when an item is evicted: aging scores).
    """

    name = ""
    hears_requests = False  # whether the owner calls `requested`

    def __init__(self, scores: dict[str, Score], history: Ghosts | None = None,
                 clock: Callable[[], int] = lambda: 0) -> None:
        self.scores, self.history, self.clock = dict(scores), history, clock
        self._ages = any(type(s).evicted is not Score.evicted for s in self.scores.values())

    @property
    def version(self) -> int:
        """Changes when entries computed before may no longer be lower bounds (`scores`)."""
        return sum(s.version for s in self.scores.values())

    def entry(self, tier: str, item) -> tuple:
        """The heap entry of ``item`` on ``tier``, lowest first."""
        return (self.scores[tier].key(item.last_access, item.hit_count), item.last_access, -item.end, item.id, item)

    def victims(self, tier: str, items: Iterable) -> Victims:
        """The candidates ``items`` (unlocked leaves of ``tier``) as a heap."""
        score = self.scores[tier]
        score.refresh()
        key = score.key
        return Victims([(key(n.last_access, n.hit_count), n.last_access, -n.end, n.id, n) for n in items],
                       lambda n: self.entry(tier, n))

    # ---- history -------------------------------------------------------------------------
    def created(self, item) -> None:
        """``item`` joined: it takes its ghost's count (it was carried while away)."""
        if self.history is not None:
            count = self.history.take(item)
            if count > item.hit_count:
                item.hit_count = count

    def dropped(self, tier: str, item) -> None:
        """``tier`` gave up ``item``'s copy; another tier still holds it."""
        if self._ages:
            self._evicted(tier, item)

    def deleted(self, tier: str, items: list) -> None:
        """``items`` left: ``items[0]`` was ``tier``'s victim, the rest its subtree."""
        if self._ages:
            self._evicted(tier, items[0])
        if self.history is not None:
            for item in items:
                self.history.add(item, item.hit_count, item.num_tokens)

    def regained(self, tier: str, items: Iterable) -> None:
        """``items`` got ``tier``'s copy back."""

    def _evicted(self, tier: str, item) -> None:
        score = self.scores.get(tier)
        if score is not None:
            score.evicted(score.key(item.last_access, item.hit_count), self.clock())

    # ---- requests and report -------------------------------------------------------------
    def requested(self, request) -> None:
        """A request arrived (``hears_requests`` policies only)."""

    def stats(self) -> dict:
        """What the policy keeps and why it orders as it does (a metric: JSON-ready)."""
        ghosts = self.history
        return {"policy": self.name, "live": self.live, "ghosts": 0 if ghosts is None else len(ghosts),
                "memory_bytes": (0 if ghosts is None else ghosts.nbytes()) + sum(s.nbytes() for s in self.all_scores())}

    def all_scores(self) -> list[Score]:
        """Every score the policy keeps (live or not: their memory)."""
        return list(self.scores.values())

    @property
    def live(self) -> str:
        """The score ranking now (its name)."""
        return next(iter(self.scores.values())).name


class LRU(EvictionPolicy):
    """Least recently used first (the common case, its entries built without a call)."""

    name = "lru"

    def __init__(self, history: Ghosts | None = None, tiers: Iterable[str] = ("device", "host")) -> None:
        super().__init__({t: Score() for t in tiers}, history)

    def entry(self, tier: str, item) -> tuple:
        return (item.last_access, -item.end, item.id, item)

    def victims(self, tier: str, items: Iterable) -> Victims:
        return Victims([(n.last_access, -n.end, n.id, n) for n in items], _lru_entry)


def _lru_entry(item) -> tuple:
    return (item.last_access, -item.end, item.id, item)
