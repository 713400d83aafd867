"""The storage tier in `HiRadixCache`: page hashes of nodes, writes to the store, prefetches landing.

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
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from hicache.radix.jobs import WRITE, StoreJob
from hicache.radix.node import TreeNode
from hicache.radix.prefetch import Prefetch

if TYPE_CHECKING:
    from hicache.radix.store import TierStore


class StorageMixin:
    """Storage writes, prefetch landing and storage polling of `HiRadixCache`."""

    def _init_storage(self, storage: TierStore | None) -> None:
        self.storage = storage
        self._prefetches: set[Prefetch] = set()
        self._to_store: list[tuple[TreeNode, bool]] = []  # (node, with its host snapshot)

    def _node_hashes(self, node: TreeNode) -> list[str]:
        """Page hashes of ``node``'s pages (chained from the root; cached on the nodes)."""
        chain = []
        while not node.is_root and node.hashes is None:
            chain.append(node)
            node = node.parent
        prior = None if node.is_root else node.hashes[-1]
        for n in reversed(chain):
            n.hashes = self.storage.page_hashes(n.tokens, prior)
            prior = n.hashes[-1]
        return chain[0].hashes if chain else node.hashes

    def _free_host(self, name: str, slots: torch.Tensor) -> None:
        """Give host slots back (pages a storage write still reads: when it ends)."""
        if self.storage is None:
            self.cache.host_group.pools[name].free(slots)
        else:
            self.storage.free_host(name, slots)

    # ---- writes --------------------------------------------------------------------------
    def _queue_store(self, nodes: list[TreeNode], with_state: TreeNode | None) -> None:
        """Write-through: remember freshly backed-up nodes (and a snapshot's owner) for this poll."""
        if self.storage is None or self.storage.write_policy != "write_through":
            return
        self._to_store.extend((n, n is with_state) for n in nodes)
        if with_state is not None and with_state not in nodes:
            self._to_store.append((with_state, True))

    def _flush_store(self) -> None:
        """One write job for every node queued since the last poll (history not yet stored,
        and snapshots not yet stored)."""
        todo, self._to_store = self._to_store, []
        segs, hashes, slots, snap_hashes = [], [], [], []
        snap_slots: dict[str, list] = {name: [] for name in self.state_sizes}
        for node, with_state in todo:
            if node.dead or node.host is None:
                continue
            history = not node.stored
            snap = with_state and node.state_host is not None and not node.state_stored
            if not history and not snap:
                continue
            node_hashes = self._node_hashes(node)
            if history:
                hashes += node_hashes
                slots.append(node.host)
            if snap:
                snap_hashes.append(node_hashes[-1])
                for name, s in node.state_host.items():
                    snap_slots[name].append(s)
            segs.append((node, node.num_tokens if history else 0, snap))
        if segs:
            self.storage.write(hashes, torch.cat(slots) if slots else torch.empty(0, dtype=torch.int64),
                               snap_hashes, {n: torch.cat(v) for n, v in snap_slots.items() if v}, segs)
            self.counters["storage_write_pages"] += len(hashes)

    def _store_now(self, nodes: list[TreeNode]) -> None:
        """Write-back: write ``nodes`` (history and snapshot) before they leave the host."""
        self._to_store.extend((n, True) for n in nodes)
        self._flush_store()

    def _finish_write(self, job: StoreJob) -> None:
        res, ps = job.results, self.page_size
        history, state = self.storage.history, self.storage.state
        page_ok = [all(r) for r in zip(*(res[n].ok for n in history))] if history[0] in res else []
        snap_ok = [all(r) for r in zip(*(res[n].ok for n in state))] if state and state[0] in res else []
        off = snap = 0
        for node, tokens, with_snap in job.owner:
            pages = tokens // ps
            if tokens and not node.dead and node.num_tokens == tokens:  # split meanwhile: unknown
                node.stored = all(page_ok[off:off + pages])
            off += pages
            if with_snap:
                node.state_stored = snap_ok[snap] and not node.dead
                snap += 1
        self.counters["storage_write_failed_pages"] += page_ok.count(False)

    # ---- polling -------------------------------------------------------------------------
    def _poll_storage(self) -> None:
        """Finished store jobs (writes marked, prefetches advanced), deadlines, queued writes."""
        for job in self.storage.poll():
            if job.kind == WRITE:
                self._finish_write(job)
            else:
                self._advance(job.owner)
        if self._prefetches:
            self._check_deadlines()
        if self._to_store:
            self._flush_store()

    def drain_storage(self, timeout_s: float = 60.0) -> None:
        """Poll until no store job is left (writes included); prefetches stop first.

        Raises:
            RuntimeError: the store did not finish within ``timeout_s``.
        """
        if self.storage is None:
            return
        for p in list(self._prefetches):
            self.stop_prefetch(p)
        deadline = time.monotonic() + timeout_s
        self._flush_store()
        while self.storage.busy() or self._prefetches:
            if time.monotonic() > deadline:
                raise RuntimeError(f"drain_storage: store jobs still running after {timeout_s} s")
            self.poll()
            time.sleep(0.0005)

    # ---- a prefetch lands --------------------------------------------------------------
    def _adopt(self, p: Prefetch, pages: int, snap: dict | None) -> int:
        """Publish the first ``pages`` read by ``p`` as a host-only node (and ``snap`` at its
        end); pages the tree holds by now are freed instead. Returns tokens added."""
        ps = self.page_size
        end = p.start + pages * ps
        host = p.host[:pages * ps]
        self.ctrl.mark_host_written(host, snap)
        path, partial = self._walk(p.key[:end])
        covered = (path[-1].end if path else 0) + (partial[1] if partial is not None else 0)
        parent = self._split(*partial) if partial is not None and covered < end else (path[-1] if path else self.root)
        if covered >= end or (parent.host is None and self.policy != "write_back"):
            self._drop_landed(host, snap, path[-1] if path and partial is None and covered == end else None)
            return 0
        if covered > p.start:  # inserted meanwhile: the tree's copy wins
            self.host_tier.free(self.anchor, host[:covered - p.start])
        node = TreeNode(key=p.key[covered:end].tobytes(), end=end, parent=parent,
                        host=host[covered - p.start:].clone(), stored=True,
                        hashes=p.hashes[(covered - p.start) // ps:pages])
        parent.children[node.key[:self._page_bytes]] = node
        self.host_tier.leaves.add(node)
        if snap is not None:
            self.host_tier.set_snapshot(node, snap)
            node.state_stored = True
        self._touch([node])
        return end - covered

    def _drop_landed(self, host: torch.Tensor, snap: dict | None, end_node: TreeNode | None) -> None:
        """Free pages that landed where the tree needs none; a snapshot may still serve ``end_node``."""
        self.host_tier.free(self.anchor, host)
        if snap is None:
            return
        if end_node is not None and end_node.host is not None and end_node.state_host is None:
            self.host_tier.set_snapshot(end_node, snap)
            end_node.state_stored = True
            return
        for name, slots in snap.items():
            self.host_tier.free(name, slots)

    def close(self) -> None:
        """Finish the storage tier's work and close it (idempotent); the tree keeps its
        device and host tiers. Call at shutdown, before ``cache.close()``."""
        if self.storage is not None:
            self.drain_storage()
            self.storage.close()
            self.storage = None
