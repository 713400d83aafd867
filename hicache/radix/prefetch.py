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

Policies (``--hicache-storage-prefetch-policy``): ``wait_complete`` reads everything found;
``timeout`` stops reading at ``--hicache-storage-prefetch-timeout`` seconds after the start;
``best_effort`` runs until the scheduler takes the request (`stop_prefetch`). A stopped
or short prefetch is a clean partial hit: `PrefetchResult` says how much it found, read
and added, and only whole verified pages are ever published.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from hicache.radix.node import EMPTY_SLOTS, MatchResult, TreeNode, as_key


class PrefetchOutcome(enum.Enum):
    """How a prefetch ended."""

    COMPLETE = "complete"  # every page the lookup found was read (and its snapshot)
    NOT_FOUND = "not found"  # nothing usable in storage past the tree
    HOST_SHORT = "host short"  # fewer host slots than pages found: read what fitted
    TIMEOUT = "timeout"  # the policy's deadline stopped it
    STOPPED = "stopped"  # stop_prefetch (the scheduler took the request)
    READ_FAILED = "read failed"  # a page missing, refused (checksum, namespace) or a store fault


class PrefetchResult(NamedTuple):
    """What a prefetch got (tokens past what the tree held when it started).

    Attributes:
        outcome: how it ended.
        found_tokens: tokens the lookup found usable (hybrid: up to the deepest snapshot).
        read_tokens: of those, read and verified into host slots.
        added_tokens: of those, tokens the tree gained as host copies (fewer when the tree
            grew meanwhile). On a hybrid stack they extend a match only with the snapshot
            at their end, which ``COMPLETE`` and ``HOST_SHORT`` (alone) promise.
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
        key: the prompt's whole pages.
        start: tokens of the prompt the tree held when the prefetch started.
        lock: the node locked meanwhile (the end of that coverage).
        hashes: page hashes of ``key[start:]``.
        deadline: ``time.monotonic()`` past which it stops (``timeout`` policy), or ``None``.
        state: where it is in its life (module docstring).
        job: the store job in flight.
        found: pages found usable; bounds: pages (from ``start``) with a snapshot at their end.
        host / snap: host slots of the pages being read and of the snapshot.
        stop: why it was asked to stop early, if it was.
        result: set once ``done``.
    """

    key: np.ndarray
    start: int
    lock: TreeNode
    hashes: list
    deadline: float | None
    state: PrefetchState = PrefetchState.LOOKUP
    job: Any = None
    found: int = 0
    bounds: tuple = ()
    host: torch.Tensor = EMPTY_SLOTS
    snap: dict | None = None
    stop: PrefetchOutcome | None = None
    result: PrefetchResult | None = None

    @property
    def done(self) -> bool:
        return self.state is PrefetchState.DONE


class PrefetchMixin:
    """`prefetch`, `stop_prefetch` and `wait_prefetch` of `HiRadixCache`, advanced by `poll`."""

    def prefetch(self, token_ids: Any) -> Prefetch | None:
        """Start reading the part of ``token_ids`` past the tree from storage into host slots.

        Locks the node where the tree's coverage of the prompt ends until the prefetch is
        done. Under the write-through policies it starts only where that node is on the
        host (backed-up nodes stay a prefix from the root). Mutates the tree; not
        thread-safe; the I/O runs on the store's threads.

        Returns:
            A `Prefetch` to poll (`poll` advances it; ``done`` then ``result``), or ``None``:
            no storage tier or host tier, or nothing past the tree.
        Raises:
            TypeError / ValueError: token ids that are not a 1-D integer sequence.
        """
        if self.storage is None or not self.host_enabled:
            return None
        key = as_key(token_ids, self.page_size, strict=False)
        path, partial = self._walk(key)
        lock = partial[0] if partial is not None else (path[-1] if path else self.root)
        start = (path[-1].end if path else 0) + (partial[1] if partial is not None else 0)
        if start >= key.size:
            return None
        if lock.host is None and self.policy != "write_back":
            self.counters["prefetch_skipped"] += 1
            return None
        prior = None
        if start:
            node, taken = (partial[0], partial[1]) if partial is not None else (path[-1], path[-1].num_tokens)
            prior = self._node_hashes(node)[taken // self.page_size - 1]
        hashes = self.storage.page_hashes(key[start:], prior)
        policy = self.storage.prefetch_policy
        deadline = time.monotonic() + self.storage.prefetch_timeout_s if policy == "timeout" else None
        p = Prefetch(key, start, lock, hashes, deadline)
        self.inc_lock_ref(lock)
        p.job = self.storage.lookup(hashes, self.hybrid, p)
        self._prefetches.add(p)
        self.counters["prefetches"] += 1
        return p

    def match_and_prefetch(self, token_ids: Any) -> tuple[MatchResult, int]:
        """`match_prefix`; with a storage tier, then `prefetch` of the rest, `wait_prefetch`
        and a second match (a tool's and a test's helper: a server polls between steps).

        Returns:
            (the match, the end of the first match's host part: tokens loaded past it came
            from storage). Mutates the tree as `match_prefix` and `prefetch` do.
        """
        m = self.match_prefix(token_ids)
        first_end = m.last_host_node.end
        p = self.prefetch(token_ids) if self.storage is not None else None
        if p is not None:  # lands as host-only nodes; the match picks them up
            self.wait_prefetch(p)
            m = self.match_prefix(token_ids)
        return m, first_end

    def stop_prefetch(self, p: Prefetch) -> None:
        """Ask ``p`` to stop: it keeps what is read so far and is ``done`` within one I/O chunk."""
        if not p.done and p.stop is None:
            p.stop = PrefetchOutcome.STOPPED
            p.job.cancel()

    def wait_prefetch(self, p: Prefetch, poll_s: float = 0.0005) -> PrefetchResult:
        """Poll until ``p`` is done, as the policy says (a tool's and a test's helper; a
        server polls between steps instead). ``best_effort`` takes what is there now."""
        if self.storage.prefetch_policy == "best_effort":
            self.poll()
            self.stop_prefetch(p)
        while not p.done:
            self.poll()
            if not p.done:
                time.sleep(poll_s)
        return p.result

    # ---- driven by poll -----------------------------------------------------------------
    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for p in self._prefetches:
            if p.deadline is not None and now >= p.deadline and p.stop is None:
                p.stop = PrefetchOutcome.TIMEOUT
                p.job.cancel()

    def _advance(self, p: Prefetch) -> None:
        """The job of ``p`` finished: read what was found, or publish what was read."""
        if p.state is PrefetchState.LOOKUP:
            self._start_reading(p)
        else:
            self._publish_prefetch(p)

    def _start_reading(self, p: Prefetch) -> None:
        res = p.job.results
        run = res["history"].hit_pages
        present = res["state"].ok if "state" in res else ()
        p.bounds = tuple(i + 1 for i, ok in enumerate(present) if ok and i < run)
        p.found = self._usable_pages(p, run)
        if p.stop is not None or not p.found:
            return self._finish_prefetch(p, p.stop or PrefetchOutcome.NOT_FOUND, 0, 0)
        ps = self.page_size
        self._make_room(self.host_tier, p.found * ps, self.hybrid)
        pages = self._usable_pages(p, min(p.found, self.host_pool.available() // ps))
        host = self.host_pool.alloc(pages * ps) if pages else None
        snap = self._alloc_snapshot() if host is not None and self.hybrid else None
        if host is None or (self.hybrid and snap is None):
            if host is not None:
                self.host_tier.free(self.anchor, host)
            return self._finish_prefetch(p, PrefetchOutcome.HOST_SHORT, 0, 0)
        p.host, p.snap, p.state = host, snap, PrefetchState.READING
        timeout_s = None if p.deadline is None else max(0.0, p.deadline - time.monotonic())
        p.job = self.storage.read(p.hashes[:pages], host, snap, timeout_s, p)

    def _usable_pages(self, p: Prefetch, run: int) -> int:
        """Pages of a leading run of ``run`` a match can use (hybrid: to the deepest snapshot)."""
        if not self.hybrid:
            return run
        return max((b for b in p.bounds if b <= run), default=0)

    def _alloc_snapshot(self) -> dict[str, torch.Tensor] | None:
        snap = {}
        for name, size in self.state_sizes.items():
            slots = self.host_tier.pools[name].alloc(size)
            if slots is None:
                for n, s in snap.items():
                    self.host_tier.free(n, s)
                return None
            snap[name] = slots
        return snap

    def _publish_prefetch(self, p: Prefetch) -> None:
        res, ps = p.job.results, self.page_size
        wanted = p.host.numel() // ps
        read = min(res[name].hit_pages for name in self.storage.history)
        snap_ok = p.snap is not None and all(res[name].ok[0] for name in self.storage.state)
        snap = p.snap if snap_ok and read == wanted else None
        if snap is None and p.snap is not None:
            for name, slots in p.snap.items():
                self.host_tier.free(name, slots)
        if read < wanted:
            self.host_tier.free(self.anchor, p.host[read * ps:])
        added = self._adopt(p, read, snap) if read else 0
        if read < wanted or (self.hybrid and snap is None):
            outcome = p.stop or PrefetchOutcome.READ_FAILED
        else:
            outcome = PrefetchOutcome.HOST_SHORT if wanted < p.found else PrefetchOutcome.COMPLETE
        self._finish_prefetch(p, outcome, read * ps, added)

    def _finish_prefetch(self, p: Prefetch, outcome: PrefetchOutcome, read: int, added: int) -> None:
        p.state, p.job, p.host, p.snap = PrefetchState.DONE, None, EMPTY_SLOTS, None
        p.result = PrefetchResult(outcome, p.found * self.page_size, read, added)
        self._prefetches.discard(p)
        self.dec_lock_ref(p.lock)
        self.counters[f"prefetch_{outcome.name.lower()}"] += 1
        self.counters["prefetch_read_tokens"] += read
        self.counters["prefetch_added_tokens"] += added
