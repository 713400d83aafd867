"""`HostHints`: client hints in the vLLM plugin, on the host chunks a request used.

A request carries the envelope of `hicache.radix.hints.envelope` in its
``kv_transfer_params`` under ``"hicache"`` (the OpenAI-compatible server passes that
field through), or as an action of type ``"hicache"`` in vLLM's own ``kv_hints``
envelope (the Python engine API); both reach the scheduler-side manager with every call
it gets for the request (vLLM 0.32 and 0.33 alike), never the workers:

    on_new_request      the envelope is checked: tickets (refused at once when malformed,
                        or for an action the plugin cannot take)
    lookup, touch,      the request's keys are noted; a hit on a retained key restarts
    prepare_load/store  its retain's deadline
    request_finished    retain / release act on the keys noted so far; the tickets go back
                        in the response's kv_transfer_params: {"hicache": {"hints": [...]}}
    on_request_finished keys stored since join the retain (within the budget)
    on_schedule_end     retains past their deadline end

vLLM keeps the device tier (its own prefix cache), and the host is the plugin's lowest
tier, so it takes ``retain`` (the chunks stay on the host; at most
``--hicache-max-retained-ratio`` of each group's chunks, higher priority first) and
``release`` (the chunks go first); ``demote``, ``prefetch`` and ``persist`` are refused
with why. vLLM-free, scheduler thread only.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Hashable

from hicache.integrations.vllm.index import HostBlockIndex
from hicache.radix.hints.envelope import ENVELOPE_KEY, HintError, capabilities, parse_envelope
from hicache.radix.hints.ticket import HintState, HintTicket, refused

UNAVAILABLE = {"demote": "vLLM keeps its device blocks itself", "prefetch": "vLLM loads from the host itself",
               "persist": "the plugin has no storage tier"}


@dataclass(slots=True, eq=False)
class _Retain:
    keys: set
    ticket: HintTicket
    ttl_s: float
    priority: int
    deadline: float
    seq: int


@dataclass(slots=True)
class _Request:
    hints: list = field(default_factory=list)  # (Hint, ticket) to apply at request_finished
    tickets: list = field(default_factory=list)
    keys: set = field(default_factory=set)
    retain: _Retain | None = None


class HostHints:
    """The hints of one plugin manager (module docstring).

    Args:
        index: the host chunk index (its ``keep`` is set to this object's protected keys).
        ratio: ``--hicache-max-retained-ratio``; max_ttl_s: ``--hicache-max-hint-ttl``.
        tokens_per_chunk: per group, the prefix tokens one chunk holds (a ticket's ``tokens``).
        clock: seconds (deadlines).
    """

    def __init__(self, index: HostBlockIndex, ratio: float, max_ttl_s: float, tokens_per_chunk: list[int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.index, self.ratio, self.max_ttl_s, self.clock = index, ratio, max_ttl_s, clock
        self.tokens_per_chunk = tokens_per_chunk or [1] * index.num_groups
        self.budget = [int(ratio * n) for n in index.chunks_per_group]
        self.requests: dict[str, _Request] = {}
        self.retains: list[_Retain] = []
        self._deadlines: list[tuple[float, int, _Retain]] = []
        self._seq = itertools.count()
        self._kept: tuple[int, list[frozenset]] | None = None
        self._version = 0
        self.counters: Counter = Counter()
        index.keep = self.kept

    def capabilities(self) -> dict:
        """The plugin's capability report (`hicache.radix.hints.envelope.capabilities`)."""
        return capabilities(self.ratio, self.max_ttl_s, UNAVAILABLE)

    # ---- a request's life ----------------------------------------------------------------------
    def start(self, req_id: str, params: Any, kv_hints: Any = None) -> None:
        """A new request: check the envelope it carries, if any."""
        envelope = params.get(ENVELOPE_KEY) if isinstance(params, dict) else None
        for action in getattr(kv_hints, "actions", None) or ():
            if getattr(action, "action_type", None) == ENVELOPE_KEY:
                envelope = action.payload
        if envelope is None:
            return
        req = self.requests[req_id] = _Request()
        try:
            hints = parse_envelope(envelope, max_ttl_s=self.max_ttl_s)
        except HintError as exc:
            return self._refuse(req, "envelope", str(exc))
        self.counters["hints"] += len(hints)
        for h in hints:
            if h.action in UNAVAILABLE:
                self._refuse(req, h.action, f"{h.action}: not available in vLLM ({UNAVAILABLE[h.action]})")
            else:
                ticket = HintTicket(h.action)
                req.hints.append((h, ticket))
                req.tickets.append(ticket)

    def _refuse(self, req: _Request, action: str, reason: str) -> None:
        self.counters["hints_refused"] += 1
        req.tickets.append(refused(action, reason))

    def saw(self, req_id: str, keys: Collection[Hashable]) -> None:
        """``req_id`` used ``keys`` (looked up, loaded or stored); a retained key's retain restarts."""
        req = self.requests.get(req_id)
        if req is not None:
            req.keys.update(keys)
        if self.retains:
            now = self.clock()
            for r in self.retains:
                if not r.keys.isdisjoint(keys) and r.deadline < now + r.ttl_s:
                    r.deadline = now + r.ttl_s
                    heapq.heappush(self._deadlines, (r.deadline, r.seq, r))

    def report(self, req_id: str) -> list[dict]:
        """``req_id`` finished: its retain / release act on its keys; its tickets as JSON."""
        req = self.requests.get(req_id)
        if req is None:
            return []
        for h, ticket in req.hints:
            keys = [k for k in req.keys if self.index.lookup(k).value != "miss"]
            per_group = Counter(self.index.group(k) for k in keys)  # the prefix's tokens: its longest group's
            ticket.tokens = max((n * self.tokens_per_chunk[g] for g, n in per_group.items()), default=0)
            if h.action == "release":
                self.index.demote(keys)
                ticket.settle(HintState.DONE)
            else:
                req.retain = self._retain(set(keys), ticket, h.ttl_s, h.priority)
        req.hints = []
        return [t.as_dict() for t in req.tickets]

    def finish(self, req_id: str) -> None:
        """vLLM is done with ``req_id``: keys stored since `report` join its retain."""
        req = self.requests.pop(req_id, None)
        if req is not None and req.retain is not None and req.retain in self.retains:
            req.retain.keys |= req.keys
            self._version += 1

    # ---- retains -------------------------------------------------------------------------------
    def _retain(self, keys: set, ticket: HintTicket, ttl_s: float, priority: int) -> _Retain | None:
        r = _Retain(keys, ticket, ttl_s, priority, self.clock() + ttl_s, next(self._seq))
        over_before = self._allot(self.retains)[1]
        kept, over = self._allot([*self.retains, r])
        if r in over:
            self.counters["hints_refused"] += 1
            g = over[r]
            ticket.settle(HintState.REFUSED, f"retain: over group {g}'s budget: more than {self.ratio:g} of its "
                                             f"{self.index.chunks_per_group[g]} host chunks would be retained "
                                             "(--hicache-max-retained-ratio)")
            return None
        self.retains.append(r)
        heapq.heappush(self._deadlines, (r.deadline, r.seq, r))
        for x in over:
            if x not in over_before:
                self._end(x, f"displaced by hint {ticket.id} (priority {priority} > {x.priority})")
        self._version += 1
        return r

    def _end(self, r: _Retain, reason: str) -> None:
        if r in self.retains:
            self.retains.remove(r)
            self._version += 1
        r.ticket.settle(HintState.EXPIRED, reason)

    def expire(self) -> None:
        """End the retains past their deadline (a scheduler step)."""
        now, heap = self.clock(), self._deadlines
        while heap and heap[0][0] <= now:
            deadline, _, r = heapq.heappop(heap)
            if r.deadline == deadline and r in self.retains:
                self._end(r, f"expired: {r.ttl_s:g} s passed since it was sent or last hit")

    def _allot(self, retains: list[_Retain]) -> tuple[list[set], dict[_Retain, int]]:
        """Per group the protected keys (present ones, higher priority first, within the
        budget), and the retains some group cannot protect (with that group)."""
        kept: list[set] = [set() for _ in self.budget]
        over: dict[_Retain, int] = {}
        for r in sorted(retains, key=lambda r: (-r.priority, r.seq)):
            new: list[list] = [[] for _ in self.budget]
            for k in r.keys:
                if self.index.lookup(k).value != "miss":
                    g = self.index.group(k)
                    if k not in kept[g]:
                        new[g].append(k)
            bad = next((g for g, keys in enumerate(new) if len(kept[g]) + len(keys) > self.budget[g]), None)
            if bad is not None:
                over[r] = bad
                continue
            for g, keys in enumerate(new):
                kept[g].update(keys)
        return kept, over

    def kept(self, group: int) -> Collection[Hashable]:
        """The keys of ``group`` no eviction may take (retained, within the budget)."""
        if not self.retains:
            return ()
        if self._kept is None or self._kept[0] != self._version:
            self._kept = (self._version, [frozenset(s) for s in self._allot(self.retains)[0]])
        return self._kept[1][group]
