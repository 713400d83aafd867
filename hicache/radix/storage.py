"""`StorageSide`: the storage tier in `HiRadixCache` — page hashes of nodes, writes to the store, polling.

The host tier's slots go to storage by ``--hicache-storage-write-policy``; what comes back
is a prefetch (`hicache.radix.prefetch`) that lands as a host-only node, loaded to the
device by the normal `load_back`. The tree knows a node is in storage only from its own
writes and reads (``stored`` for the history, ``state_stored`` for the snapshot); the
store may have dropped it since, which the next lookup finds out.

    write policy    host -> storage                         host eviction of a leaf
    write_through   when its host copy is acked (batched    deletes it (a write still in
                    per poll; the snapshot with it)         flight keeps its host pages)
    write_back      when it is evicted from the host        writes it first if not stored,
                    (the node leaves the tree at once; its  then deletes it
                    host pages return when the write ends)

    a node of the tree      stored  state_stored
    written, write acked    True    True (if its snapshot went too)
    landed by a prefetch    True    True (if it brought the snapshot)
    anything else           False   False

A store that fails (unreachable, full, corrupt objects) makes writes fail and lookups
miss; the backends count it and log it once, and the tree serves from device and host.

The storage side owns its store, its prefetches and the writes queued for the next poll;
it changes the tree only through `StorageEdits` (``land``, ``mark_written``, locks and
host room). For eviction it is what lies below the host (`hicache.radix.evict.Below`). A
stack without history data pools has nothing to store for a page: its history counts as
stored, and only snapshots are written and read.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from hicache.radix.admission import StorageAdmission
from hicache.radix.jobs import WRITE, StoreJob
from hicache.radix.landing import StorageEdits
from hicache.radix.loadcut import LoadCut
from hicache.radix.node import EMPTY_SLOTS, TreeNode
from hicache.radix.prefetch import Prefetch, Prefetches, PrefetchOutcome, PrefetchResult

if TYPE_CHECKING:
    from hicache.radix.store import TierStore


class StorageSide:
    """Storage writes, prefetches and storage polling of one tree (scheduler thread).

    Args:
        store: the storage tier (closed by `close`).
        edits: the calls through which it changes the tree.
        host_pools: the host pools by name; state_sizes: slots of one snapshot per state root.
        counters: the tree's counters.
        cut: the load gate's tree side (`LoadCut`), or None: prefetches read all they find.
    """

    def __init__(self, store: TierStore, edits: StorageEdits, host_pools: Mapping[str, Any],
                 state_sizes: Mapping[str, int], counters: Counter, cut: LoadCut | None = None) -> None:
        self.store, self.edits, self.counters = store, edits, counters
        self.state_sizes = dict(state_sizes)
        self.prefetches = Prefetches(store, edits, self.node_hashes, host_pools, state_sizes, counters, cut)
        self._to_store: list[tuple[TreeNode, bool]] = []  # (node, with its host snapshot)
        self._writing: set[TreeNode] = set()  # nodes of the write jobs in flight
        self._has_history = bool(store.history)  # pages with data to write (else only snapshots)
        # told of every finished write: (segments, each one's success); the client hints' persist
        self.on_written: Callable[[list, list[bool]], None] | None = None
        self.admission = StorageAdmission(store.admission, self.node_hashes) if store.admission > 1 else None

    def node_hashes(self, node: TreeNode) -> list[str]:
        """Page hashes of ``node``'s pages (chained from the root; cached on the nodes)."""
        chain = []
        while not node.is_root and node.hashes is None:
            chain.append(node)
            node = node.parent
        prior = None if node.is_root else node.hashes[-1]
        for n in reversed(chain):
            n.hashes = self.store.page_hashes(n.tokens, prior)
            prior = n.hashes[-1]
        return chain[0].hashes if chain else node.hashes

    def free_host(self, name: str, slots: torch.Tensor) -> None:
        """Give host slots back (pages a storage write still reads: when it ends)."""
        self.store.free_host(name, slots)

    # ---- below the host (evict.Below) ------------------------------------------------------
    @property
    def writes_back(self) -> bool:
        # with admission, a node refused at its ack is offered again when it leaves the host
        return self.store.write_policy == "write_back" or self.admission is not None

    def stored(self, node: TreeNode) -> bool:
        """Whether the store acked ``node``'s history (and its host snapshot)."""
        return ((node.stored or not self._has_history)
                and (node._state_host is None or node.state_stored))

    def holds(self, node: TreeNode) -> bool:
        """Stored, or its write is running (the host may let it go: the write keeps its pages)."""
        return self.stored(node) or node in self._writing

    def save(self, nodes: list[TreeNode], asked: frozenset = frozenset()) -> None:
        """Write-back: write ``nodes`` (history and snapshot) before they leave the host
        (those the admission takes, it remembers the count of the others; and those in
        ``asked`` whatever it says: a client's retain or persist)."""
        self._to_store.extend((n, True) for n in self._admitted(nodes, leaving=True, asked=asked))
        self._flush()

    def save_snapshots(self, nodes: list[TreeNode]) -> None:
        """Write the host snapshots of ``nodes`` (with their history if not stored) before
        the host drops them; the nodes stay in the tree."""
        self._to_store.extend((n, True) for n in self._admitted([n for n in nodes if not n.state_stored], False))
        self._flush()

    def _admitted(self, nodes: list[TreeNode], leaving: bool, asked: frozenset = frozenset()) -> list[TreeNode]:
        """The nodes the admission takes (all without one), and those in ``asked``;
        ``leaving``: the others leave the tree, and the admission remembers their counts."""
        admission = self.admission
        if admission is None:
            return nodes
        taken = []
        for n in nodes:
            if n in asked or admission.admits(n):
                taken.append(n)
            elif leaving:
                admission.refuse(n)
                self.counters["storage_refused_pages"] += n.num_tokens // self.store.page_size
            else:
                self.counters["storage_refused_snapshots"] += 1
        return taken

    # ---- writes ------------------------------------------------------------------------------
    def queue_store(self, nodes: list[TreeNode], with_state: TreeNode | None) -> None:
        """Write-through: remember freshly backed-up nodes (and a snapshot's owner) for this poll."""
        if self.store.write_policy != "write_through":
            return
        if self.admission is not None:  # the refused are offered again when they leave the host
            nodes = [n for n in nodes if self.admission.admits(n)]
            if with_state is not None and not self.admission.admits(with_state):
                with_state = None
        self._to_store.extend((n, n is with_state) for n in nodes)
        if with_state is not None and with_state not in nodes:
            self._to_store.append((with_state, True))

    def _flush(self) -> None:
        """One write job for every node queued since the last poll (history not yet stored,
        and snapshots not yet stored)."""
        todo, self._to_store = self._to_store, []
        segs, hashes, slots, snap_hashes = [], [], [], []
        snap_slots: dict[str, list] = {name: [] for name in self.state_sizes}
        wanted: dict[TreeNode, bool] = {}  # a node queued twice (history, then its snapshot): once
        for node, with_state in todo:
            wanted[node] = wanted.get(node, False) or with_state
        for node, with_state in wanted.items():
            if node.dead or node._host is None:
                continue
            history = self._has_history and not node.stored
            snap = with_state and node._state_host is not None and not node.state_stored
            if not history and not snap:
                continue
            node_hashes = self.node_hashes(node)
            if history:
                hashes += node_hashes
                slots.append(node._host)
            if snap:
                snap_hashes.append(node_hashes[-1])
                for name, s in node._state_host.items():
                    snap_slots[name].append(s)
            segs.append((node, node.num_tokens if history else 0, snap))
            self._writing.add(node)
        if segs:
            self.store.write(hashes, torch.cat(slots) if slots else EMPTY_SLOTS,
                             snap_hashes, {n: torch.cat(v) for n, v in snap_slots.items() if v}, segs)
            self.counters["storage_write_pages"] += len(hashes)
            self.counters["storage_write_snapshots"] += len(snap_hashes)

    def _finish_write(self, job: StoreJob) -> None:
        res, store = job.results, self.store
        page_ok = _all_ok(res, store.history)
        snap_ok = _all_ok(res, store.state)
        ok = self.edits.mark_written(job.owner, page_ok, snap_ok)
        self._writing.difference_update(seg[0] for seg in job.owner)
        self.counters["storage_write_failed_pages"] += page_ok.count(False)
        if self.on_written is not None:
            self.on_written(job.owner, ok)

    # ---- polling -------------------------------------------------------------------------
    def poll(self) -> None:
        """Finished store jobs (writes marked, prefetches advanced), deadlines, queued writes."""
        for job in self.store.poll():
            if job.kind == WRITE:
                self._finish_write(job)
            else:
                self.prefetches.advance(job.owner)
        if self.prefetches.active:
            self.prefetches.check_deadlines()
        if self._to_store:
            self._flush()

    def busy(self) -> bool:
        """Whether a store job or a prefetch is still running."""
        return self.store.busy() or bool(self.prefetches.active)

    def writing(self) -> bool:
        """Whether a write is queued for the next poll or still running."""
        return bool(self._to_store or self._writing)

    def drain(self, poll, timeout_s: float, writes_only: bool = False) -> None:
        """Stop the prefetches, then ``poll`` until no store job is left (writes included);
        ``writes_only``: leave the prefetches running and wait for the writes alone.

        Raises:
            RuntimeError: the store did not finish within ``timeout_s``.
        """
        if not writes_only:
            for p in list(self.prefetches.active):
                self.prefetches.stop(p)
        deadline = time.monotonic() + timeout_s
        self._flush()
        while self.writing() if writes_only else self.busy():
            if time.monotonic() > deadline:
                raise RuntimeError(f"drain_storage: store jobs still running after {timeout_s} s")
            poll()
            time.sleep(0.0005)

    def wait_prefetch(self, p: Prefetch, poll, poll_s: float) -> PrefetchResult:
        """``poll`` until ``p`` is done, as the policy says (``best_effort`` takes what is there now)."""
        if self.store.prefetch_policy == "best_effort":
            poll()
            self.prefetches.stop(p, PrefetchOutcome.STOPPED)
        while not p.done:
            poll()
            if not p.done:
                time.sleep(poll_s)
        return p.result


def _all_ok(results: Mapping[str, Any], pools: list[str]) -> list[bool]:
    """Per unit (page or snapshot) of a write: stored in every pool of ``pools`` (none: [])."""
    got = [results[n].ok for n in pools if n in results]
    return [all(r) for r in zip(*got)] if got else []
