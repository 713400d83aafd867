"""Transfers of `HiRadixCache`: backups (D2H) and load-backs (H2D) through the controller.

An operation marks every node it covers ``pending = op_id`` and is remembered with its
destination slots; nothing about the node's tiers changes until its ack:

    queue (write / load)        ack ok                       ack failed
    node.pending = op  ------>  publish dst slots on the     forget (the controller
    (frozen: no eviction,       chain, snapshot on the       already freed dst); the
     no second transfer)        op's node; unfreeze          node is as it was; unfreeze

A node split while in flight hands ``pending`` to its new upper half, so the chain of an
op is "walk up from the op's node while ``pending == op``"; destination slots are dealt
out top-down to the chain nodes that lack that tier.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hicache.controller import Ack
from hicache.radix.node import EMPTY_SLOTS, TreeNode
from hicache.radix.tiers import Tier


@dataclass(slots=True)
class PendingOp:
    """An operation of the tree in flight."""

    kind: str  # "backup" | "load"
    node: TreeNode  # deepest node of the chain; owner of the snapshot
    dst: dict  # destination slots keyed by pool name (what write()/load() returned)
    with_state: bool  # whether the snapshot moves too


class TransferMixin:
    """Backup, load-back and ack routing of `HiRadixCache`."""

    def _init_transfers(self) -> None:
        # Keyed by the controller's op ids: it issues every id, so a server's ops and
        # the tree's never collide.
        self._pending: dict[int, PendingOp] = {}

    # ---- backups -----------------------------------------------------------------
    def _needs_backup(self, node: TreeNode) -> bool:
        if node.pending is not None or node.device is None:
            return False
        return node.host is None or (node.state_device is not None and node.state_host is None)

    def _backup(self, node: TreeNode) -> int | None:
        """Queue a backup of ``node``'s device-only history and snapshot; its op id, or None.

        When the host is short, host leaves (then host snapshots) are evicted first; if a
        snapshot still does not fit, the history is backed up without it.
        """
        anchor = node.device if node.host is None else EMPTY_SLOTS
        state = node.state_device if node.state_host is None else None
        if state is not None or anchor.numel() > self.host_pool.allocator.available():
            self._make_room(self.host_tier, anchor.numel(), state is not None)
        dst = self.ctrl.write(anchor, state, trusted=True)  # the tree's own slots, checked at insert
        if dst is None and state is not None and anchor.numel():
            state = None
            dst = self.ctrl.write(anchor, None, trusted=True)
        if dst is None:
            self.counters["backups_refused"] += 1
            return None
        op = self.ctrl.last_op_id
        node.pending = op
        self._pending[op] = PendingOp("backup", node, dst, state is not None)
        self.counters["backups"] += 1
        return op

    def _make_room(self, tier: Tier, anchor_tokens: int, with_state: bool) -> None:
        """Evict on ``tier`` until ``anchor_tokens`` (and, with state, one snapshot) fit."""
        short = anchor_tokens - tier.anchor.available()
        if short > 0:
            self._evict(tier, short)
        if with_state:
            for name, size in self.state_sizes.items():
                short = size - tier.pools[name].available()
                if short > 0:
                    self._evict_snapshots(tier, short)

    # ---- loads -------------------------------------------------------------------
    def load_back(self, node: TreeNode) -> dict[str, torch.Tensor] | None:
        """Queue the load of ``node``'s host-only history chain (and its host snapshot).

        The chain is every host-only node from the deepest device ancestor down to
        ``node``. Device room is made by evicting (nodes on ``node``'s path are locked
        meanwhile). The device slots are published on the nodes when the ack arrives
        (`poll` after ``controller.start_loading()``); ``node`` stays locked until then.
        Mutates the tree; not thread-safe.

        Returns:
            Device slots keyed by pool name (the anchor key always present, empty when only
            the snapshot moves), or ``None`` when the device is short or part of the chain
            is already in flight (nothing changes then).
        Raises:
            ValueError: ``node`` is the root or no longer in the tree.
        """
        if node.is_root or node.dead:
            raise ValueError(f"node: {node!r} is the root or was evicted")
        chain = self._host_chain(node)
        need_state = node.state_device is None and node.state_host is not None
        if not chain and not need_state:
            return {self.anchor: EMPTY_SLOTS}
        if node.pending is not None or any(n.pending is not None for n in chain):
            return None
        host = torch.cat([n.host for n in chain]) if chain else EMPTY_SLOTS
        self.inc_lock_ref(node)
        self._make_room(self.device_tier, host.numel(), need_state)
        try:
            dst = self.ctrl.load(host, node.state_host if need_state else None, trusted=True)  # acked host copies
        except BaseException:
            self.dec_lock_ref(node)
            raise
        if dst is None:
            self.dec_lock_ref(node)
            self.counters["loads_refused"] += 1
            return None
        op = self.ctrl.last_op_id
        if self.anchor in dst:
            self._hold(dst[self.anchor].numpy(), 1)
        for n in (*chain, node):
            n.pending = op
        self._pending[op] = PendingOp("load", node, dst, need_state)
        self.counters["loads"] += 1
        return {self.anchor: dst.get(self.anchor, EMPTY_SLOTS), **dst}

    def _host_chain(self, node: TreeNode) -> list[TreeNode]:
        chain = []
        while not node.is_root and node.device is None:
            chain.append(node)
            node = node.parent
        return chain[::-1]

    # ---- acks --------------------------------------------------------------------
    def poll(self) -> list[Ack]:
        """Process every finished ack of the controller (never blocks).

        Acks of this tree's ops publish (or, failed, forget) their slots; acks of ops
        the tree did not queue are returned untouched. With a storage tier, finished
        storage jobs are taken in too (writes marked, prefetches advanced, deadlines
        enforced) and the write-through writes of this poll submitted. Launching is the caller's:
        ``controller.start_writing()`` / ``start_loading()``. Mutates the tree.

        Returns:
            All acks, in order.
        """
        acks = self.ctrl.poll()
        for ack in acks:
            rec = self._pending.pop(ack.op_id, None)
            if rec is not None:
                self._finish(rec, ack)
        if self.storage is not None:
            self._poll_storage()
        return acks

    def wait(self, ops=None) -> None:
        """Launch what ``ops`` need and poll until they are acked (default: every op of this tree).

        Launches queued writes if a backup is awaited and queued loads if a load is (the
        whole controller queue of that direction goes). Blocks until done (CUDA: polls).

        Raises:
            RuntimeError: an awaited op is neither queued nor in flight in the controller.
        """
        todo = set(self._pending) if ops is None else set(ops) & self._pending.keys()
        kinds = {self._pending[op].kind for op in todo}
        if "backup" in kinds:
            self.ctrl.start_writing()
        if "load" in kinds:
            self.ctrl.start_loading()
        while todo & self._pending.keys():
            if not self.ctrl.pending():
                raise RuntimeError(f"wait: ops {sorted(todo & self._pending.keys())} are unknown to the controller")
            self.poll()

    def pending_ops(self) -> int:
        return len(self._pending)

    def _chain(self, node: TreeNode, op: int) -> list[TreeNode]:
        chain = []
        while node is not None and node.pending == op:
            node.pending = None
            chain.append(node)
            node = node.parent
        return chain[::-1]

    def _finish(self, rec: PendingOp, ack: Ack) -> None:
        chain = self._chain(rec.node, ack.op_id)
        if rec.kind == "load":
            self.dec_lock_ref(rec.node)
        if not ack.success:
            if rec.kind == "load" and self.anchor in rec.dst:  # the controller freed them
                self._hold(rec.dst[self.anchor].numpy(), -1)
            self.counters[f"{rec.kind}s_failed"] += 1
            return
        if rec.kind == "backup":
            self._publish_backup(rec, chain)
        else:
            self._publish_load(rec, chain)

    def _publish_backup(self, rec: PendingOp, chain: list[TreeNode]) -> None:
        slots = rec.dst.get(self.anchor)
        top = chain[0]
        if self.policy != "write_back" and slots is not None and top.parent.host is None:
            # The parent's backup failed meanwhile: keep backed-up nodes a prefix from the root.
            for name, s in rec.dst.items():
                self.host_tier.free(name, s)
            self.counters["backups_discarded"] += 1
            return
        takers = self._deal(chain, slots, self.host_tier) if slots is not None else []
        if rec.with_state:
            self.host_tier.set_snapshot(rec.node, {name: rec.dst[name] for name in self.state_sizes})
        if self.storage is not None:
            self._queue_store(takers, rec.node if rec.with_state else None)

    def _publish_load(self, rec: PendingOp, chain: list[TreeNode]) -> None:
        slots = rec.dst.get(self.anchor)
        if slots is not None:
            self.device_tier.leaves.update(self._deal(chain, slots, self.device_tier))
        if rec.with_state:
            self.device_tier.set_snapshot(rec.node, {name: rec.dst[name] for name in self.state_sizes})

    def _deal(self, chain: list[TreeNode], slots: torch.Tensor, tier: Tier) -> list[TreeNode]:
        """Hand ``slots`` out top-down to the chain nodes lacking a copy on ``tier``; returns them."""
        self._epoch += 1
        attr = tier.attr
        takers = [n for n in chain if getattr(n, attr) is None]
        if len(takers) == 1 and takers[0].num_tokens == slots.numel():  # the common case: no split
            setattr(takers[0], attr, slots)
            return takers
        total = sum(n.num_tokens for n in takers)
        if total != slots.numel():
            raise RuntimeError(f"ack: {slots.numel()=} slots for {total=} tokens on {takers!r}")
        off = 0
        for n in takers:
            setattr(n, attr, slots[off:off + n.num_tokens])
            off += n.num_tokens
        return takers
