"""Retained prefixes and their budget: `Retain` (one client retain), `allot` (which pages of
each tier the retains protect) and `ClockTimes` (when a hit happened).

A retain names the last node of its prefix; the prefix is that node's path to the root,
and a tier protects the path's pages it holds. Retains share pages (a session's growing
context, one system prompt): a page counts once. Each tier's protected pages stay within
its budget (``--hicache-max-retained-ratio`` x the tier's tokens), higher priority first:

    retains by (priority desc, age)      device budget 6 pages        host budget 8 pages
    A  prio 70  path: 4 device pages     A: 4 -> protected (4)        A: 0 pages on the host
    B  prio 50  path: 3 device, 2 shared B: 1 new -> protected (5)    B: ...
    C  prio 50  path: 5 device           C: 5 new -> over: the device does not protect it

A retain over the budget of a tier where its prefix has pages is refused when it is sent
(or, sent later at a higher priority, it displaces the lower ones it pushes over). Pages
move between tiers afterwards (a hit loads a host prefix back), so eviction allots again
from the retains as they are; a tier never protects more than its budget.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Container, Iterable, Mapping, NamedTuple

from hicache.radix.hints.ticket import HintTicket
from hicache.radix.node import TreeNode
from hicache.radix.read import only_child

MAX_TIMES = 4096  # (clock, time) samples kept: about as many scheduler steps


@dataclass(slots=True, eq=False)
class Retain:
    """One retain in force (a hot mutable record; identity-compared).

    Attributes:
        node: the last node of the prefix (its path to the root is the prefix).
        ticket: the client's ticket (ACCEPTED while the retain is in force).
        ttl_s: seconds it lasts after it is sent or last hit; priority: among retains.
        deadline: the clock's time it ends at unless hit before.
        seq: order of arrival (an older retain wins a tie of priority).
        seen: the tree's LRU clock when it started or was last refreshed: a later
            ``node.last_access`` is a hit.
    """

    node: TreeNode
    ticket: HintTicket
    ttl_s: float
    priority: int
    deadline: float
    seq: int
    seen: int


class Over(NamedTuple):
    """A retain a tier cannot protect: the tier, tokens protected before it, its new tokens."""

    tier: str
    used: int
    tokens: int


class Allotment(NamedTuple):
    """Which nodes each tier protects, and why some retains are left out.

    Attributes:
        kept: per tier name, the protected nodes (those of the tier on protected paths).
        used: per tier name, the protected tokens.
        priority: per protected node, the highest priority protecting it.
        over: the retains some tier cannot protect, with the first such tier.
    """

    kept: dict[str, frozenset]
    used: dict[str, int]
    priority: dict[TreeNode, int]
    over: dict[Retain, Over]


def path_of(node: TreeNode) -> list[TreeNode]:
    """``node`` and its ancestors up to (not including) the root, deepest first."""
    out = []
    while node.parent is not None:
        out.append(node)
        node = node.parent
    return out


def private_chain(node: TreeNode, stop: Container[TreeNode] = ()) -> list[TreeNode]:
    """``node`` and its ancestors while no other branch shares them (a parent with one
    child) and no retain names them (``stop``: a retained system prompt stays), deepest
    first: the part of a prefix a release or a demote acts on."""
    chain = []
    while node.parent is not None:
        chain.append(node)
        parent = node.parent
        if parent.parent is None or parent in stop or not only_child(parent):
            break
        node = parent
    return chain


def allot(retains: Iterable[Retain], tiers: Mapping[str, str], budget: Mapping[str, int]) -> Allotment:
    """Protect the retains' pages tier by tier, highest priority (then oldest) first, while
    each tier's protected tokens stay within ``budget`` (module docstring).

    Args:
        retains: the retains in force (dead nodes are skipped).
        tiers: tier name -> the `TreeNode` field of its slots (``"_device"``, ``"_host"``).
        budget: tier name -> the most tokens it protects.
    """
    kept: dict[str, set] = {t: set() for t in tiers}
    used = dict.fromkeys(tiers, 0)
    priority: dict[TreeNode, int] = {}
    over: dict[Retain, Over] = {}
    for r in sorted(retains, key=lambda r: (-r.priority, r.seq)):
        if r.node.dead:
            continue
        path = path_of(r.node)
        for tier, attr in tiers.items():
            have = kept[tier]
            new = [n for n in path if getattr(n, attr) is not None and n not in have]
            tokens = sum(n.num_tokens for n in new)
            if used[tier] + tokens > budget[tier]:
                over.setdefault(r, Over(tier, used[tier], tokens))
                continue
            have.update(new)
            used[tier] += tokens
            for n in new:
                priority.setdefault(n, r.priority)
    return Allotment({t: frozenset(s) for t, s in kept.items()}, used, priority, over)


class ClockTimes:
    """When the tree's LRU clock had its values: one (clock, time) sample per poll, the
    last `MAX_TIMES` kept, so a hit's clock value (``last_access``) gives its time within a step."""

    def __init__(self) -> None:
        self.clocks: list[int] = []
        self.times: list[float] = []

    def add(self, clock: int, now: float) -> None:
        """The clock reads ``clock`` at ``now`` (a poll)."""
        if self.clocks and self.clocks[-1] == clock:
            return
        self.clocks.append(clock)
        self.times.append(now)
        if len(self.clocks) > 2 * MAX_TIMES:
            del self.clocks[:MAX_TIMES], self.times[:MAX_TIMES]

    def time_of(self, clock: int) -> float:
        """The time of the first poll that saw ``clock`` (the hit happened before it; an
        older hit than the samples kept reads as the oldest sample: earlier, never later)."""
        i = bisect.bisect_left(self.clocks, clock)
        return self.times[min(i, len(self.times) - 1)]
