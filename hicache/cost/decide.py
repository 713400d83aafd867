"""Load or recompute: `LoadCost` (the time of a load plan) and `LoadGate` (the cut that pays).

A matched prefix lies on tiers; the gate keeps the part whose expected load time beats
recomputing it, and recomputes the rest::

    prompt  |<- device ->|<--- host --->|<--- storage --->|<- computed ->|
            0          start         host_end        storage_end       prompt
                                 ^ the cut: load [start, cut), compute [cut, prompt)

    T(cut) = [storage wait + latency + bytes / read GB/s]       (tokens past host_end)
             -> [h2d wait + enqueue + first byte + bytes / GB/s] (every loaded token)
             + prefill(prompt - cut new tokens after cut cached)

A wait is the link's backlog (bytes already queued on it, `hicache.cost.links`); a load
starts after its storage read. Between two tier boundaries the load time grows linearly
with the cut and the prefill falls ever faster (later tokens attend to more context), so
T is concave there and its minimum lies at a boundary, except where the prefill reaches
its floor (reading the weights once): past that point recomputing costs nothing more, so
the point where the prefill meets the floor (to a page) is a candidate too. The gate
evaluates those few candidates, which equals trying every page (a test checks it) at the
cost of a handful. On a hybrid stack (DeepSeek-V4) a cut must fall where a state snapshot
is, so the candidates are the snapshot boundaries given (`cuts`).

``always`` (`LOAD_POLICIES`) is the behaviour without a gate: everything found is loaded.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

from hicache.config import LOAD_POLICIES
from hicache.cost.footprint import Footprint
from hicache.cost.prefill import PrefillModel
from hicache.cost.profile import Link, Store

__all__ = ["Cut", "H2D", "LOAD_POLICIES", "LoadCost", "LoadGate", "STORAGE", "no_backlog"]
H2D, STORAGE = "h2d", "storage"


class Cut(NamedTuple):
    """A gate's decision: load to ``end``; estimated seconds to the first token, and those of
    loading everything found (``always_s``) and of loading nothing (``never_s``)."""

    end: int
    seconds: float
    always_s: float
    never_s: float


def no_backlog(link: str) -> float:
    """A backlog source of idle links."""
    return 0.0


class LoadCost:
    """The estimated time to the first token of a load plan (module docstring).

    Args:
        prefill: the model on the device.
        footprint: bytes per token and per snapshot in the host format.
        h2d: the host -> device link; store: the storage tier's figures (None: no tier).
        hybrid: a snapshot moves with every load (DeepSeek-V4).
    Immutable; thread-safe.
    """

    def __init__(self, prefill: PrefillModel, footprint: Footprint, h2d: Link, store: Store | None = None,
                 hybrid: bool = False) -> None:
        self.prefill, self.footprint, self.h2d, self.store, self.hybrid = prefill, footprint, h2d, store, hybrid
        self._token_b = footprint.token_bytes
        self._snap_b = self.snapshot_bytes = footprint.snapshot_bytes if hybrid else 0  # bytes with every load
        self._h2d_fixed, self._h2d_inv = h2d.enqueue_s + h2d.first_byte_s, 1 / (h2d.gbps * 1e9)
        self._st_fixed = store.read_latency_s if store else 0.0
        self._st_inv = 1 / (store.read_gbps * 1e9) if store else 0.0

    def load_seconds(self, start: int, end: int, host_end: int, wait_h2d: float = 0.0,
                     wait_storage: float = 0.0) -> float:
        """Seconds until tokens [start, end) are on the device (those past ``host_end`` read
        from storage first), after the links' waits."""
        if end <= start:
            return 0.0
        t = 0.0
        if end > host_end:
            t = wait_storage + self._st_fixed + ((end - host_end) * self._token_b + self._snap_b) * self._st_inv
        if wait_h2d > t:
            t = wait_h2d
        return t + self._h2d_fixed + ((end - start) * self._token_b + self._snap_b) * self._h2d_inv

    def seconds(self, prompt: int, start: int, end: int, host_end: int, wait_h2d: float = 0.0,
                wait_storage: float = 0.0) -> float:
        """T(end): load [start, end), then prefill the rest of ``prompt`` (module docstring)."""
        return (self.load_seconds(start, end, host_end, wait_h2d, wait_storage)
                + self.prefill.seconds(prompt - end, end))


class LoadGate:
    """The cut that pays (module docstring), against the links' backlog now.

    Args:
        cost: the time model.
        page: tokens per page (a cut is whole pages).
        backlog: seconds of work queued on a link (``"h2d"``, ``"storage"``) now.

    Attributes:
        cuts: decisions so far that left found tokens to recompute (a counter).
    Not thread-safe.
    """

    def __init__(self, cost: LoadCost, page: int, backlog: Callable[[str], float] = no_backlog) -> None:
        self.cost, self.page, self.backlog = cost, page, backlog
        self.cuts = 0
        # `end`'s shortcut: recomputing a token costs at least its linear layers, loading it
        # its bytes; past a load's fixed cost and wait every loaded token gains the difference
        prefill = cost.prefill
        self._gain_s = prefill.linear_s - cost.footprint.token_bytes / (cost.h2d.gbps * 1e9)
        self._load_fixed_s = cost.h2d.enqueue_s + cost.h2d.first_byte_s + cost.snapshot_bytes / (cost.h2d.gbps * 1e9)
        self._floor_tokens = -(-(prefill.floor_s - prefill.fixed_s) // prefill.linear_s)  # a rest this long is above it

    def end(self, prompt: int, start: int, host_end: int, storage_end: int | None = None,
            cuts: Sequence[int] | None = None) -> int:
        """`choose`'s ``end`` alone (what a scheduler needs), with a shortcut for the common
        case: a host part alone, whose every token loads faster than its linear layers alone
        recompute, the load's fixed cost and wait paid off, before a rest above the prefill's
        floor: then loading it all is `choose`'s answer too (T is concave there)."""
        if storage_end is None and cuts is None and prompt - host_end >= self._floor_tokens:
            loaded = host_end - start
            if loaded > 0 and self._gain_s * loaded >= self.backlog(H2D) + self._load_fixed_s:
                return host_end
        return self.choose(prompt, start, host_end, storage_end, cuts).end

    def choose(self, prompt: int, start: int, host_end: int, storage_end: int | None = None,
               cuts: Sequence[int] | None = None) -> Cut:
        """Where to cut a match (module docstring's table).

        Args:
            prompt: the prompt's tokens; start: tokens already on the device.
            host_end / storage_end: where the host part and the storage part end
                (``storage_end`` None: nothing in storage).
            cuts: the allowed ends (hybrid: snapshot boundaries); None: any page.
        Returns:
            The `Cut` (``end == start``: recompute everything past the device).
        """
        last = host_end if storage_end is None else storage_end
        backlog, load, prefill = self.backlog, self.cost.load_seconds, self.cost.prefill
        wait_h2d = backlog(H2D)
        wait_st = backlog(STORAGE) if last > host_end else 0.0
        best_end, best_t = start, prefill.seconds(prompt - start, start)  # nothing loaded: no wait either
        never = always = best_t
        if last <= start:
            return tuple.__new__(Cut, (start, never, never, never))
        rest = prefill.seconds(prompt - last, last)  # T(last)'s prefill, computed once
        if cuts is None:  # the tier boundaries, and where the rest's prefill reaches its floor
            ends = [host_end] if last == host_end else [host_end, last]
            if rest <= prefill.floor_s:
                ends = sorted({*ends, *self._at_floor(prompt, start, last)})
        else:
            ends = sorted(c for c in cuts if start < c <= last)
        for end in ends:
            if end > start:  # the deepest last: everything found
                always = load(start, end, host_end, wait_h2d, wait_st) + (
                    rest if end == last else prefill.seconds(prompt - end, end))
                if always <= best_t:  # ties load: the same time, fewer GPU-seconds
                    best_end, best_t = end, always
        if best_t < always:
            self.cuts += 1
        return tuple.__new__(Cut, (best_end, best_t, always, never))  # without the named tuple's Python __new__

    def _at_floor(self, prompt: int, start: int, last: int) -> tuple[int, ...]:
        """The pages around the cut past which the rest's prefill stays at its floor (the
        rest after ``last`` is at it)."""
        prefill = self.cost.prefill
        floor = prefill.floor_s
        page = self.page
        lo, hi = start // page, last // page  # floor reached at hi; find the first page where it is
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if prefill.seconds(prompt - mid * page, mid * page) > floor:
                lo = mid
            else:
                hi = mid
        return tuple(p * page for p in (lo, hi) if start <= p * page <= last)
