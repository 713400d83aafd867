"""Prefetch from the storage tier into host slots: the part of a prompt past the tree.

A prefetch starts where the tree's coverage of the prompt ends (device or host, any
node, a node matched in part included) and never changes what is already cached. Its
life, driven by `HiRadixCache.poll` (the scheduler only submits and polls):

    prefetch()        lookup done: pages found,      reads done
    ----------> LOOKUP ---------------------------> READING ----------------> DONE
    (locks the    |    host slots allocated              |   publish the leading run read as a
     prompt's     |    (evicting host leaves; fewer      |   host-only node (+ the snapshot);
     node)        |    slots than pages = a partial      |   free the rest; unlock
                  |    hit), reads submitted             |
                  +-- nothing found / no host slots / stopped before reading -----------> DONE

    prompt   |<-- in the tree (device/host) -->|<------------ found in storage ------------>|
    pages    0                               start               read (leading run)    found
                                                                 ^ published: a host node the
                                                                   match (and load_back) uses

Hybrid stacks (DeepSeek-V4): history pools per page, state pools per snapshot, and the
match rule of the host tier: the lookup finds the leading run of history pages and the
boundaries that have a snapshot in storage; the prefetch reads up to the deepest such
boundary (or, with fewer host slots, the deepest one that fits). History read without its
snapshot is still published (a later snapshot makes it usable), but adds nothing to the
match now.

History the tree holds past its match end without a snapshot (snapshots are evicted on
their own; the host keeps fewer of them than pages) is made usable too: the lookup also
asks for the snapshots of those node boundaries and, when nothing past the tree is
usable, reads the deepest stored one alone (``SNAPSHOT``); the match then ends there.
Otherwise a larger host, keeping more history, would serve fewer hits than a smaller one
whose evicted history comes back from storage with its snapshot.

A stack without history data pools (a DeepSeek-V4 stack of sliding-window layers only)
stores only snapshots: every page of the prompt is "found" (its history holds no data)
and the lookup and the read are the snapshots'.

With ``--hicache-load-policy cost`` a lookup's found pages are read only up to where loading
them beats recomputing them (`hicache.radix.loadcut`); none: the prefetch ends ``RECOMPUTE``
(``found_tokens`` still says what storage had). A snapshot read alone is not weighed.

Policies (``--hicache-storage-prefetch-policy``): ``wait_complete`` reads everything found;
``timeout`` stops reading at ``--hicache-storage-prefetch-timeout`` seconds after the start;
``best_effort`` runs until the scheduler takes the request (`stop_prefetch`). A stopped
or short prefetch is a clean partial hit: `PrefetchResult` says how much it found, read
and added, and only whole verified pages are ever published.
"""
from __future__ import annotations

import enum
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

import numpy as np
import torch

from hicache.radix.hybrid import deepest_needed, snapshotless_tail
from hicache.radix.landing import StorageEdits
from hicache.radix.loadcut import LoadCut
from hicache.radix.node import EMPTY_SLOTS, TreeNode

if TYPE_CHECKING:
    from hicache.radix.store import TierStore


def _pages_read(job: Any, pool: str) -> int:
    """Leading pages a read job's operation of ``pool`` has read: all, once it has a result;
    before that (a deadline), those its finished chunks read."""
    res = job.results.get(pool)
    return res.hit_pages if res is not None else job.ops[pool].progress()


class PrefetchOutcome(enum.Enum):
    """How a prefetch ended."""

    COMPLETE = "complete"  # every page the lookup found was read (and its snapshot)
    NOT_FOUND = "not found"  # nothing usable in storage past the tree
    SNAPSHOT = "snapshot"  # nothing past the tree; a snapshot of history the tree holds was read
    HOST_SHORT = "host short"  # fewer host slots than pages found: read what fitted
    TIMEOUT = "timeout"  # the policy's deadline stopped it
    STOPPED = "stopped"  # stop_prefetch (the scheduler took the request)
    READ_FAILED = "read failed"  # a page missing, refused (checksum, namespace) or a store fault
    RECOMPUTE = "recompute"  # found (what the host can take), but recomputing it is estimated faster


class PrefetchResult(NamedTuple):
    """What a prefetch got (tokens past what the tree held when it started).

    Attributes:
        outcome: how it ended.
        found_tokens: tokens the lookup found usable (hybrid: up to the deepest snapshot).
        read_tokens: of those, read and verified into host slots.
        added_tokens: of those, tokens the tree gained as host copies (fewer when the tree
            grew meanwhile). On a hybrid stack they extend a match only with the snapshot
            at their end, which ``COMPLETE`` and ``HOST_SHORT`` (alone) promise.
    ``SNAPSHOT`` reads no token past the tree (all three are 0): the match now ends at the
    boundary whose snapshot it read.
    """

    outcome: PrefetchOutcome
    found_tokens: int
    read_tokens: int
    added_tokens: int


class PrefetchState(enum.Enum):
    LOOKUP = "lookup"
    READING = "reading"
    DONE = "done"


@dataclass(slots=True, eq=False)
class Prefetch:
    """One prompt's prefetch (returned by `HiRadixCache.prefetch`; poll until ``done``).

    Attributes:
        start: tokens of the prompt the tree held when the prefetch started.
        state: where it is in its life (module docstring).
        result: set once ``done``.
    The other fields are the tree's (a copy of the prompt's pages, the locked node, page
    hashes, the store job, host slots being read): never handed out.
    """

    start: int
    _key: np.ndarray
    _lock: TreeNode
    _hashes: list
    _deadline: float | None  # time.monotonic() past which it stops (``timeout`` policy)
    state: PrefetchState = PrefetchState.LOOKUP
    result: PrefetchResult | None = None
    _job: Any = None
    _found: int = 0  # pages found usable
    _wanted: int = 0  # of them, pages worth reading (all without the cost policy)
    _bounds: tuple = ()  # pages (from ``start``) with a snapshot at their end
    _host: torch.Tensor = EMPTY_SLOTS
    _snap: dict | None = None
    _stop: PrefetchOutcome | None = None
    _held: tuple = ()  # hybrid: nodes past the match end with history in the tree, no snapshot
    _target: TreeNode | None = None  # the one of them whose snapshot is being read
    _device_end: int = 0  # cost policy: the walk's device end and the tree's cuts past it (`LoadCut.walk_ends`)
    _tree_cuts: tuple = ()

    @property
    def done(self) -> bool:
        return self.state is PrefetchState.DONE

    @property
    def host_tokens(self) -> int:
        """Tokens being read into host slots now (0 before the reads and once done)."""
        return int(self._host.numel())


class Prefetches:
    """The prefetches in flight of one tree: started, advanced by finished store jobs,
    ended; they change the tree only through `StorageEdits` (scheduler thread).

    Args:
        store: the storage tier; edits: the calls that change the tree.
        hashes_of: page hashes of a node's pages (cached on the node).
        host_pools: the host pools by name; state_sizes: slots of one snapshot per state root.
        counters: the tree's counters.
        cut: the load gate's tree side (`LoadCut`; None: read everything found).
    """

    def __init__(self, store: TierStore, edits: StorageEdits, hashes_of: Callable[[TreeNode], list[str]],
                 host_pools: Mapping[str, Any], state_sizes: Mapping[str, int], counters: Counter,
                 cut: LoadCut | None = None) -> None:
        self.store, self.edits, self.hashes_of, self.counters, self.cut = store, edits, hashes_of, counters, cut
        self.host_pools, self.state_sizes, self.hybrid = host_pools, state_sizes, bool(state_sizes)
        self.page_size, self.anchor = store.page_size, store.stack.anchor.name
        self.active: set[Prefetch] = set()

    def start(self, key: np.ndarray, may_start: Callable[[TreeNode], bool]) -> Prefetch | None:
        """Start reading the part of ``key`` (whole pages) past the tree (hybrid: and the
        snapshots of its boundaries the tree holds without one); ``None`` when there is
        neither or ``may_start(node)`` refuses the node where the tree's coverage ends."""
        path, partial = self.edits.walk(key)
        lock = partial[0] if partial is not None else (path[-1] if path else self.edits.root)
        start = (path[-1].end if path else 0) + (partial[1] if partial is not None else 0)
        held = snapshotless_tail(path) if self.hybrid else ()
        if start >= key.size and not held:
            return None
        if not may_start(lock):
            self.counters["prefetch_skipped"] += 1
            return None
        prior = None
        if start:
            node, taken = (partial[0], partial[1]) if partial is not None else (path[-1], path[-1].num_tokens)
            prior = self.hashes_of(node)[taken // self.page_size - 1]
        hashes = self.store.page_hashes(key[start:], prior) if start < key.size else []
        deadline = time.monotonic() + self.store.prefetch_timeout_s if self.store.prefetch_policy == "timeout" else None
        p = Prefetch(start, key.copy(), lock, hashes, deadline, _held=held)  # the caller's array may change later
        if self.cut is not None:
            p._device_end, p._tree_cuts = self.cut.walk_ends(path, partial)
        self.edits.lock(lock)  # the held nodes are its ancestors: they stay in the tree meanwhile
        p._job = self.store.lookup(hashes, self.hybrid, p, [self.hashes_of(n)[-1] for n in held])
        self.active.add(p)
        self.counters["prefetches"] += 1
        return p

    def stop(self, p: Prefetch, why: PrefetchOutcome = PrefetchOutcome.STOPPED) -> None:
        """Ask ``p`` to stop: it keeps what is read so far and is ``done`` within one I/O chunk."""
        if not p.done and p._stop is None:
            p._stop = why
            p._job.cancel()

    def check_deadlines(self) -> None:
        """End every prefetch past its deadline now, whatever its I/O is doing (`expire`)."""
        now = time.monotonic()
        for p in [p for p in self.active if p._deadline is not None and now >= p._deadline]:
            self.expire(p)

    def expire(self, p: Prefetch) -> None:
        """``p``'s deadline passed: it ends now, with the pages its reads finished (a lookup
        still running: with nothing). A chunk stuck in the store keeps its host pages,
        pinned by its job, until it returns; its late result is dropped (`advance`)."""
        self.stop(p, PrefetchOutcome.TIMEOUT)  # chunks not started yet never start
        if p.state is PrefetchState.LOOKUP:
            self._finish(p, PrefetchOutcome.TIMEOUT, 0, 0)
        elif p.state is PrefetchState.READING:
            self._publish(p)

    def advance(self, p: Prefetch) -> None:
        """The job of ``p`` finished: read what was found, or publish what was read (nothing
        for a prefetch that ended at its deadline: its job ends late)."""
        if p.state is PrefetchState.DONE:
            return
        if p.state is PrefetchState.LOOKUP:
            self._start_reading(p)
        else:
            self._publish(p)

    def _start_reading(self, p: Prefetch) -> None:
        res = p._job.results
        run = res["history"].hit_pages if "history" in res else len(p._hashes)  # no history data: all there
        present = res["state"].ok if "state" in res else ()
        p._bounds = tuple(i + 1 for i, ok in enumerate(present) if ok and i < run)
        p._found = self._usable_pages(p, run)
        wanted = p._found if self.cut is None or p._stop is not None else self._paying(p, p._found)
        if p._found and not wanted:
            return self._finish(p, PrefetchOutcome.RECOMPUTE, 0, 0)
        if p._stop is None and not p._found and p._held:
            target = deepest_needed(p._held, res["held"].ok if "held" in res else ())
            if target is not None:
                return self._read_snapshot(p, target)
        if p._stop is not None or not p._found:
            return self._finish(p, p._stop or PrefetchOutcome.NOT_FOUND, 0, 0)
        ps = self.page_size
        p._wanted = wanted
        self.edits.make_host_room(wanted * ps, self.hybrid)
        pages = self._usable_pages(p, min(wanted, self.host_pools[self.anchor].available() // ps))
        if self.cut is not None and 0 < pages < wanted:  # the host is short: does what fits still pay?
            fits, pages = pages, self._paying(p, pages)
            if not pages:
                p._found = fits  # found_tokens: what the host could take (what loading all would read)
                return self._finish(p, PrefetchOutcome.RECOMPUTE, 0, 0)
        host = self.host_pools[self.anchor].alloc(pages * ps) if pages else None
        snap = self._alloc_snapshot() if host is not None and self.hybrid else None
        if host is None or (self.hybrid and snap is None):
            if host is not None:
                self.store.free_host(self.anchor, host)
            return self._finish(p, PrefetchOutcome.HOST_SHORT, 0, 0)
        p._host, p._snap, p.state = host, snap, PrefetchState.READING
        timeout_s = None if p._deadline is None else max(0.0, p._deadline - time.monotonic())
        p._job = self.store.read(p._hashes[:pages], host, snap, timeout_s, p)

    def _read_snapshot(self, p: Prefetch, node: TreeNode) -> None:
        """Read the stored snapshot of ``node``'s boundary alone into host slots."""
        self.edits.make_host_room(0, True)
        snap = self._alloc_snapshot()
        if snap is None:
            return self._finish(p, PrefetchOutcome.HOST_SHORT, 0, 0)
        p._snap, p._target, p.state = snap, node, PrefetchState.READING
        timeout_s = None if p._deadline is None else max(0.0, p._deadline - time.monotonic())
        p._job = self.store.read_snapshot(self.hashes_of(node)[-1], snap, timeout_s, p)

    def _paying(self, p: Prefetch, pages: int) -> int:
        """Of ``pages`` found pages, those worth reading (the load gate's cut; 0: recompute)."""
        if not pages:
            return 0
        return self.cut.pages(p._key.size, p._device_end, p._tree_cuts, p.start, pages, self.page_size, p._bounds)

    def _usable_pages(self, p: Prefetch, run: int) -> int:
        """Pages of a leading run of ``run`` a match can use (hybrid: to the deepest snapshot)."""
        if not self.hybrid:
            return run
        return max((b for b in p._bounds if b <= run), default=0)

    def _alloc_snapshot(self) -> dict[str, torch.Tensor] | None:
        snap = {}
        for name, size in self.state_sizes.items():
            slots = self.host_pools[name].alloc(size)
            if slots is None:
                for n, s in snap.items():
                    self.store.free_host(n, s)
                return None
            snap[name] = slots
        return snap

    def _publish(self, p: Prefetch) -> None:
        ps = self.page_size
        if p._target is not None:
            return self._publish_snapshot(p, all(_pages_read(p._job, name) for name in self.store.state))
        wanted = p._host.numel() // ps
        read = min((_pages_read(p._job, name) for name in self.store.history), default=wanted)
        snap_ok = p._snap is not None and all(_pages_read(p._job, name) for name in self.store.state)
        snap = p._snap if snap_ok and read == wanted else None
        if snap is None and p._snap is not None:
            for name, slots in p._snap.items():
                self.store.free_host(name, slots)
        if read < wanted:
            self.store.free_host(self.anchor, p._host[read * ps:])
        added = 0
        if read:
            end = p.start + read * ps
            added = self.edits.land(p._key, p.start, end, p._host[:read * ps], snap, p._hashes[:read])
        if read < wanted or (self.hybrid and snap is None):
            outcome = p._stop or PrefetchOutcome.READ_FAILED
        else:
            outcome = PrefetchOutcome.HOST_SHORT if wanted < p._wanted else PrefetchOutcome.COMPLETE
        self._finish(p, outcome, read * ps, added)

    def _publish_snapshot(self, p: Prefetch, ok: bool) -> None:
        """A snapshot read alone finished: the held node takes it (if it still needs one)."""
        if not ok:
            for name, slots in p._snap.items():
                self.store.free_host(name, slots)
            return self._finish(p, p._stop or PrefetchOutcome.READ_FAILED, 0, 0)
        landed = self.edits.land_snapshot(p._target, p._snap)
        self._finish(p, PrefetchOutcome.SNAPSHOT if landed else PrefetchOutcome.NOT_FOUND, 0, 0)

    def _finish(self, p: Prefetch, outcome: PrefetchOutcome, read: int, added: int) -> None:
        p.state, p._job, p._host, p._snap = PrefetchState.DONE, None, EMPTY_SLOTS, None
        p._held, p._target = (), None
        p.result = PrefetchResult(outcome, p._found * self.page_size, read, added)
        self.active.discard(p)
        self.edits.unlock(p._lock)
        self.counters[f"prefetch_{outcome.name.lower()}"] += 1
        self.counters["prefetch_read_tokens"] += read
        self.counters["prefetch_added_tokens"] += added

    def in_flight_slots(self) -> list[tuple[str, torch.Tensor]]:
        """Host slots the prefetches read into now, by pool (for `check_tree`)."""
        return [(name, s) for p in self.active for name, s in [(self.anchor, p._host), *(p._snap or {}).items()]]
