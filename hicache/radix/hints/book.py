"""`HintBook`: the retained and released prefixes of one tree, and the one filter its
eviction consults (`HintBook.victims`).

    hint            the book                                 eviction of a tier's leaves
    retain          a `Retain` on the prefix's last node,     its pages on the tier (within
                    ends at its deadline (each hit restarts   the budget: `retains.allot`)
                    it), displaced, replaced or released      go last, lowest priority first,
                                                              and only down a tier: never dropped
    release         marks the prefix's unshared nodes with    marked leaves go first (a hit
                    the LRU clock                             since the mark clears it)

A tier's candidates come back in three bands, each in the policy's own order (policies
change the order within a band, never the bands):

    band 0  released, not hit since        first to go
    band 1  everything else                the policy's order
    band 2  retained (protected)           last, lowest priority first; a retained page that
                                           a running request needs goes down one tier (the
                                           evictor saves it below first) and its ticket says so

With no retain and no release in force the policy's own candidates are used as they are.
Scheduler thread only; deadlines are checked at `poll` (each scheduler step).

A client's releases are honoured while they prove right (`hicache.radix.hints.trust`):
while more than a quarter of its last releases came back, band 0 is empty (the marks go
in the policy's order, and are still judged), so a bad client's releases cost at most
the prefixes evicted before its record caught up. Retains need no such rule: a tier
protects at most its budget, and a retain ends at its deadline.
"""
from __future__ import annotations

import heapq
import itertools
from collections import Counter
from typing import Callable, Iterable, Mapping

from hicache.radix.hints.retains import Allotment, ClockTimes, Retain, allot, path_of, private_chain
from hicache.radix.hints.ticket import HintState, HintTicket
from hicache.radix.hints.trust import MAX_WRONG, TRUST_WINDOW, ReleaseRecord
from hicache.radix.node import TreeNode
from hicache.radix.policies import EvictionPolicy, Victims

_NONE: frozenset = frozenset()
_BELOW = {"device": "host", "host": "storage"}



class HintedVictims:
    """A tier's candidates in the three bands of the module docstring (duck-types `Victims`)."""

    __slots__ = ("_bands", "_band_of")

    def __init__(self, bands: tuple[Victims, Victims, Victims], band_of: Callable[[TreeNode], int]) -> None:
        self._bands, self._band_of = bands, band_of

    def __bool__(self) -> bool:
        return any(self._bands)

    def pop(self) -> TreeNode:
        return next(b for b in self._bands if b).pop()

    def push(self, node: TreeNode) -> None:
        self._bands[self._band_of(node)].push(node)


class HintBook:
    """Retains and releases of one tree (module docstring).

    Args:
        clock: the hints' clock (seconds; a server's ``time.monotonic``, a replay's trace time).
        lru_clock: the tree's LRU clock (``RadixIndex.clock``), read for hits.
        epoch: the tree's epoch (``RadixIndex.epoch``): a changed one means pages moved.
        tiers: tier name -> the `TreeNode` field of its slots.
        capacity: tier name -> its anchor tokens; ratio: ``--hicache-max-retained-ratio``.
        page_bytes: key bytes of one page (a ghost's first page).
        counters: the tree's counters (``hints_*``).
    """

    def __init__(self, clock: Callable[[], float], lru_clock: Callable[[], int], epoch: Callable[[], int],
                 tiers: Mapping[str, str], capacity: Mapping[str, int], ratio: float, page_bytes: int,
                 counters: Counter) -> None:
        self.clock, self._lru_clock, self._epoch, self.counters = clock, lru_clock, epoch, counters
        self.tiers, self.ratio, self.capacity, self.page_bytes = dict(tiers), ratio, dict(capacity), page_bytes
        self.budget = {t: int(ratio * capacity[t]) for t in tiers}
        self.retains: dict[TreeNode, Retain] = {}
        # node -> (the LRU clock when released, the release's ticket if it named this node, else None)
        self.released: dict[TreeNode, tuple[int, HintTicket | None]] = {}
        self.record = ReleaseRecord(page_bytes)
        self._deadlines: list[tuple[float, int, Retain]] = []
        self._seq = itertools.count()
        self._times = ClockTimes()
        self._version = 0  # bumped by every change of the retains
        self._allotted: tuple[tuple[int, int], Allotment] | None = None
        self._sweep_at = 1024  # sweep dead and hit marks when there are more

    # ---- retain ------------------------------------------------------------------------------
    def retain(self, node: TreeNode, ticket: HintTicket, ttl_s: float, priority: int) -> None:
        """Retain the prefix ending at ``node`` for ``ttl_s`` at ``priority`` (a retain of the
        same prefix is replaced). Over a tier's budget the ticket is refused and nothing
        changes; a lower-priority retain it pushes over is displaced (EXPIRED)."""
        old = self.retains.get(node)
        r = Retain(node, ticket, ttl_s, priority, self.clock() + ttl_s, next(self._seq), self._lru_clock())
        before = self.allotment()
        after = allot([*(x for x in self.retains.values() if x is not old), r], self.tiers, self.budget)
        if r in after.over:
            tier, used, tokens = after.over[r]
            ticket.settle(HintState.REFUSED, (
                f"retain: over the {tier}'s budget: its {tokens} tokens there would make {used + tokens} retained, "
                f"more than {self.ratio:g} of {self.capacity[tier]} (--hicache-max-retained-ratio); retains of "
                f"priority >= {priority} already hold {used}"))
            return
        self.retains[node] = r
        heapq.heappush(self._deadlines, (r.deadline, r.seq, r))
        self._version += 1
        self.counters["hints_retained"] += 1
        if old is not None:
            self._end(old, f"replaced by hint {ticket.id}")
        for x in after.over:
            if x not in before.over and x is not old and self.retains.get(x.node) is x:
                self.counters["hints_displaced"] += 1
                self._end(x, f"displaced by hint {ticket.id} (priority {priority} > {x.priority}) over the "
                             f"{after.over[x].tier}'s budget")

    def end_retain(self, ticket: HintTicket, reason: str) -> bool:
        """End the retain ``ticket`` holds (EXPIRED with ``reason``); whether it was in force."""
        r = next((r for r in self.retains.values() if r.ticket is ticket), None)
        if r is not None:
            self._end(r, reason)
        return r is not None

    def _end(self, r: Retain, reason: str) -> None:
        if self.retains.get(r.node) is r:
            del self.retains[r.node]
            self._version += 1
        r.ticket.settle(HintState.EXPIRED, reason)

    # ---- release -----------------------------------------------------------------------------
    def release(self, node: TreeNode, ticket: HintTicket) -> int:
        """Mark the prefix ending at ``node`` first to go: ``node`` and its ancestors while
        no other branch shares them and no retain names them (a shorter prefix the client
        still retains, its system prompt); retains of ``node`` or longer prefixes through it
        end. Returns the tokens marked."""
        for r in [r for r in self.retains.values() if node in path_of(r.node)]:
            self._end(r, f"released by hint {ticket.id}")
        chain = private_chain(node, self.retains)
        clock = self._lru_clock()
        for n in chain:
            self.released[n] = (clock, ticket if n is node else None)
        self.record.released(ticket, node)
        self.counters["hints_released_tokens"] += sum(n.num_tokens for n in chain)
        if len(self.released) > self._sweep_at:
            self._sweep()
        return sum(n.num_tokens for n in chain)

    def _came_back(self, ticket: HintTicket | None) -> None:
        """A released prefix was used again: the release was wrong."""
        if ticket is not None and self.record.came_back(ticket):
            self.counters["hints_releases_returned"] += 1
            ticket.note(f"its prefix came back: releases are honoured while at most {MAX_WRONG:g} of the last "
                        f"{TRUST_WINDOW} do")

    def _sweep(self) -> None:
        """Forget marks of nodes that left the tree or were hit since (amortised: the
        threshold doubles with what is left)."""
        for n, (clock, ticket) in list(self.released.items()):
            if n.dead or n.last_access > clock:
                del self.released[n]
                if not n.dead:
                    self._came_back(ticket)
        self._sweep_at = max(1024, 2 * len(self.released))

    # ---- each scheduler step -----------------------------------------------------------------
    def poll(self) -> None:
        """End the retains past their deadline (a retain hit since restarts from the hit)."""
        now = self.clock()
        self._times.add(self._lru_clock(), now)
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, _, r = heapq.heappop(heap)
            if self.retains.get(r.node) is not r or r.deadline != deadline:
                continue  # replaced or ended meanwhile
            if r.node.dead:
                self._end(r, "its prefix left the tree")
                continue
            if r.node.last_access > r.seen:  # hit since: ttl_s from the hit
                r.seen = r.node.last_access
                r.deadline = self._times.time_of(r.seen) + r.ttl_s
                if r.deadline > now:
                    heapq.heappush(heap, (r.deadline, r.seq, r))
                    continue
            self.counters["hints_expired"] += 1
            self._end(r, f"expired: {r.ttl_s:g} s passed since it was sent or last hit")

    # ---- the eviction filter -----------------------------------------------------------------
    def allotment(self) -> Allotment:
        """The protected pages of each tier now (computed again only after a change)."""
        key = (self._version, self._epoch())
        if self._allotted is None or self._allotted[0] != key:
            self._allotted = (key, allot(self.retains.values(), self.tiers, self.budget))
        return self._allotted[1]

    def kept(self, tier: str) -> frozenset:
        """The nodes ``tier`` protects (retained pages within its budget)."""
        return self.allotment().kept[tier] if self.retains else _NONE

    def victims(self, policy: EvictionPolicy, tier: str, nodes: Iterable[TreeNode]) -> tuple[Victims, frozenset]:
        """``tier``'s candidates ``nodes`` in bands (module docstring), and the protected ones."""
        if not self.retains and not self.released and not self.record.window:
            return policy.victims(tier, nodes), _NONE
        allotted = self.allotment()
        kept, prio, released = allotted.kept[tier], allotted.priority, self.released
        honoured = self.record.trusted()
        entry = policy.entry

        def band_of(n: TreeNode) -> int:
            if n in kept:
                return 2
            mark = released.get(n)
            if mark is None:
                return 1
            if n.last_access > mark[0]:  # hit since the release: it was wrong
                del released[n]
                self._came_back(mark[1])
                return 1
            return 0 if honoured else 1

        nodes = list(nodes)
        for ticket in self.record.judge(nodes):  # candidates that bring a released prefix back
            self._came_back(ticket)
        bands: tuple[list, list, list] = ([], [], [])
        for n in nodes:
            bands[band_of(n)].append(n)
        normal = policy.victims(tier, bands[1])  # first: a policy may draw its order here

        def first(n: TreeNode) -> tuple:
            return entry(tier, n)

        def last(n: TreeNode) -> tuple:
            return (prio[n], *entry(tier, n))

        out = (Victims([first(n) for n in bands[0]], first), normal, Victims([last(n) for n in bands[2]], last))
        return HintedVictims(out, band_of), kept

    def went_down(self, tier: str, node: TreeNode) -> None:
        """A running request needed ``node``'s protected pages on ``tier``: they went down a
        tier (the host's to storage, where the tree keeps none: those retains end)."""
        self.counters["hints_pushed_down_tokens"] += node.num_tokens
        below = _BELOW[tier]
        for r in [r for r in self.retains.values() if node in path_of(r.node)]:
            r.ticket.note(f"{node.num_tokens} tokens went down from the {tier} to the {below}: a running "
                          f"request needed the {tier}'s room")
            if tier == "host":
                self._end(r, "its prefix went down to storage (the tree retains device and host pages)")
