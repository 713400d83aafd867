"""`StorageEdits`: the few named calls through which the storage side changes the tree.

The storage side (`hicache.radix.storage`, `hicache.radix.prefetch`) runs lookups, reads
and writes on I/O threads and learns that they finished when the tree polls. It reads the
tree (a walk) and caches page hashes on nodes, but every change of the tree's state goes
through one of these calls, all made at `poll` (a store job finished) but for a
prefetch's lock, taken when it starts:

    call              when                              what changes
    lock / unlock     a prefetch starts / ends          lock counts on the path
    make_host_room    a lookup found pages to read      host leaves (then snapshots) evicted
    land              a read finished                   a host-only node (split of the node
                                                        it starts inside), its snapshot
    land_snapshot     a snapshot read alone finished    the host snapshot of a node whose
                                                        history the tree holds
    mark_written      a write finished                  ``stored`` / ``state_stored``

Nothing else of the tree is the storage side's to change: a prefetch that lands while
another part of the tree waited on a poll (a load-back making room) is one more `land`,
and the parts that could be affected read the tree again after their poll.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hicache.radix.evict import Evictor
from hicache.radix.index import RadixIndex
from hicache.radix.node import EMPTY_SLOTS, TreeNode, lock, unlock
from hicache.radix.tiers import SlotLedger


class StorageEdits:
    """The storage side's calls into the tree (scheduler thread).

    Args:
        index, ledger, evictor: the node structure, the tiers' slots, eviction.
        ctrl: the controller (host slots read from storage are declared written to it).
        policy: the write policy (under write-through a landed node needs its parent on host).
    """

    def __init__(self, index: RadixIndex, ledger: SlotLedger, evictor: Evictor, ctrl: Any, policy: str) -> None:
        self.index, self.ledger, self.evictor, self.ctrl, self.policy = index, ledger, evictor, ctrl, policy
        self.root, self.page_size = index.root, index.page_size

    def walk(self, key: np.ndarray) -> tuple[list[TreeNode], tuple[TreeNode, int] | None]:
        """The tree's walk of ``key`` (changes nothing)."""
        return self.index.walk(key)

    def lock(self, node: TreeNode) -> None:
        lock(node)

    def unlock(self, node: TreeNode) -> None:
        unlock(node)

    def make_host_room(self, anchor_tokens: int, with_state: bool) -> None:
        """Evict on the host until ``anchor_tokens`` (and, with state, a snapshot) fit."""
        self.evictor.make_room(self.ledger.host, anchor_tokens, with_state)

    def land(self, key: np.ndarray, start: int, end: int, host: torch.Tensor, snap: dict | None,
             hashes: list[str]) -> int:
        """Publish tokens ``[start, end)`` of ``key`` read into ``host`` (and ``snap`` at
        ``end``) as a host-only node; what the tree holds by now is freed instead.

        Returns:
            Tokens the tree gained.
        """
        self.ctrl.mark_host_written(host, snap)
        path, partial = self.index.walk(key[:end])
        covered = (path[-1].end if path else 0) + (partial[1] if partial is not None else 0)
        if partial is not None and covered < end:
            parent = self.index.split(*partial)
        else:
            parent = path[-1] if path else self.root
        if covered >= end or (parent._host is None and self.policy != "write_back"):
            self._drop_landed(host, snap, path[-1] if path and partial is None and covered == end else None)
            return 0
        host_tier = self.ledger.host
        if covered > start:  # inserted meanwhile: the tree's copy wins
            host_tier.free(self.ledger.anchor, host[:covered - start])
        node = TreeNode(key=key[covered:end].tobytes(), end=end, parent=parent,
                        _host=host[covered - start:].clone(), stored=True,
                        hashes=hashes[(covered - start) // self.page_size:])
        self.index.add_child(parent, node)
        self.evictor.policy.created(node)
        host_tier.leaves.add(node)
        if snap is not None:
            self.ledger.give_snapshot(host_tier, node, snap)
            node.state_stored = True
        self.index.touch([node])
        return end - covered

    def land_snapshot(self, node: TreeNode, snap: dict[str, torch.Tensor]) -> bool:
        """``node`` (history on host, no snapshot on any tier) takes ``snap`` read from
        storage as its host snapshot; one that no longer needs it (deleted, history gone
        from the host, a snapshot gained meanwhile) frees it instead.

        Returns:
            Whether ``node`` took it.
        """
        host_tier = self.ledger.host
        if node.dead or node._host is None or node._state_host is not None or node._state_device is not None:
            for name, slots in snap.items():
                host_tier.free(name, slots)
            return False
        self.ctrl.mark_host_written(EMPTY_SLOTS, snap)
        self.ledger.give_snapshot(host_tier, node, snap)
        node.state_stored = True
        self.index.touch([node])
        return True

    def _drop_landed(self, host: torch.Tensor, snap: dict | None, end_node: TreeNode | None) -> None:
        """Free pages that landed where the tree needs none; a snapshot may still serve ``end_node``."""
        host_tier = self.ledger.host
        host_tier.free(self.ledger.anchor, host)
        if snap is None:
            return
        if end_node is not None and end_node._host is not None and end_node._state_host is None:
            self.ledger.give_snapshot(host_tier, end_node, snap)
            end_node.state_stored = True
            return
        for name, slots in snap.items():
            host_tier.free(name, slots)

    def mark_written(self, segments: list[tuple[TreeNode, int, bool]], page_ok: list[bool],
                     snap_ok: list[bool]) -> list[bool]:
        """A write finished: ``segments`` (node, history tokens written, with its snapshot)
        in the write's order, ``page_ok`` per history page, ``snap_ok`` per snapshot.
        Returns per segment whether all it wrote (pages and snapshot) is stored."""
        off = snap = 0
        out = []
        for node, tokens, with_snap in segments:
            pages = tokens // self.page_size
            ok = all(page_ok[off:off + pages])
            if tokens and not node.dead and node.num_tokens == tokens:  # split meanwhile: unknown
                node.stored = ok
            off += pages
            if with_snap:
                ok = ok and snap_ok[snap]
                node.state_stored = snap_ok[snap] and not node.dead
                snap += 1
            out.append(ok)
        return out
