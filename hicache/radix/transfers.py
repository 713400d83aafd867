"""`Transfers`: the backups (D2H) and load-backs (H2D) of `HiRadixCache` through the controller.

    write policy              backs a node up                       device eviction of a
                                                                    node not backed up
    write_through             at every insert reaching it           deletes it
    write_through_selective   at the 2nd insert reaching it         deletes it
    write_back                when it is evicted from the device    backs it up, then drops
                              (its snapshot too: also one evicted   the device copy
                              on its own, with its history if the
                              host lacks it)

Under both write-through policies a node is backed up only after its parent, so the
backed-up nodes form a prefix from the root.

An operation marks every node it covers ``pending = op_id`` and is remembered with its
destination slots; nothing about the node's tiers changes until its ack:

    queue (write / load)        ack ok                       ack failed
    node.pending = op  ------>  publish dst slots on the     forget (the controller
    (frozen: no eviction,       chain, snapshot on the       already freed dst); the
     no second transfer)        op's node; unfreeze          node is as it was; unfreeze

A node split while in flight hands ``pending`` to its new upper half, so the chain of an
op is "walk up from the op's node while ``pending == op``"; destination slots are dealt
out top-down to the chain nodes that lack that tier. A load makes device room first
(which may poll: a prefetch may land and split a node on the way) and only then reads
the chain it loads, so the chain it marks is the chain the ack finds.

Each ack is applied on its own: one that cannot be applied (a bug) is logged and counted
(``acks_broken``), its destination slots are given back and the acks after it are
applied as usual. This component is also what lies below the device tier for eviction
(`hicache.radix.evict.Below`): the host, under ``write_back``.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from hicache.controller import Ack
from hicache.radix.index import RadixIndex
from hicache.radix.node import EMPTY_SLOTS, TreeNode, copy_slots, lock, unlock
from hicache.radix.tiers import SlotLedger

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class PendingOp:
    """An operation of the tree in flight."""

    kind: str  # "backup" | "load"
    node: TreeNode  # deepest node of the chain; owner of the snapshot
    dst: dict  # destination slots keyed by pool name (what write()/load() returned)
    with_state: bool  # whether the snapshot moves too


class Transfers:
    """The tree's controller operations in flight, keyed by the controller's op ids.

    Args:
        ctrl: the controller (its ``write`` / ``load(..., trusted=True)``, ``poll``...).
        index, ledger: the node structure and the tiers' slots.
        counters: the tree's counters.
        policy: the write policy; host_enabled: whether the host tier is used.
    Attributes (wired by the tree):
        make_room: ``make_room(tier, anchor_tokens, with_state)`` (the evictor's).
        poll: the tree's poll (acks and storage), what `wait` repeats.
        on_backed_up: ``(nodes, snapshot_owner)`` after a backup's ack published, or None.
        on_loaded: ``(tier_name, nodes)`` after a load's ack gave ``nodes`` device copies
            (the eviction policy's ``regained``).
    """

    def __init__(self, ctrl, index: RadixIndex, ledger: SlotLedger, counters: Counter, *,
                 policy: str, host_enabled: bool) -> None:
        self.ctrl, self.index, self.ledger, self.counters = ctrl, index, ledger, counters
        self.policy, self.host_enabled = policy, host_enabled
        self.anchor = ledger.anchor
        self.pending: dict[int, PendingOp] = {}
        self.make_room: Callable[..., None] = lambda tier, tokens, with_state: None
        self.poll: Callable[[], object] = lambda: self.apply(self.ctrl.poll())
        self.on_backed_up: Callable[[list[TreeNode], TreeNode | None], None] | None = None
        self.on_loaded: Callable[[str, list[TreeNode]], None] = lambda tier, nodes: None

    # ---- below the device (evict.Below) ---------------------------------------------------
    @property
    def writes_back(self) -> bool:
        return self.policy == "write_back" and self.host_enabled

    def holds(self, node: TreeNode) -> bool:
        return node._host is not None and (node._state_device is None or node._state_host is not None)

    def save(self, nodes: list[TreeNode], asked: frozenset = frozenset()) -> None:
        """Back ``nodes`` up and wait for the acks (polls); ``asked`` changes nothing here."""
        ops = [op for op in (self.backup(n) for n in nodes) if op is not None]
        if ops:
            self.wait(ops)

    def save_snapshots(self, nodes: list[TreeNode]) -> None:
        """Back up the snapshots of ``nodes`` (with their history where the host lacks it:
        a host snapshot needs its history there) and wait for the acks (polls)."""
        self.save([n for n in nodes if self.needs_backup(n)])

    # ---- backups ------------------------------------------------------------------------
    def needs_backup(self, node: TreeNode) -> bool:
        if node.pending is not None or node._device is None:
            return False
        return node._host is None or (node._state_device is not None and node._state_host is None)

    def backup_path(self, path: list[TreeNode]) -> None:
        """Queue the backups an insert along ``path`` (whose hit counts it raised) asks for."""
        if not self.host_enabled or self.policy == "write_back":
            return
        threshold = 1 if self.policy == "write_through" else 2
        for n in path:  # top-down: a node only after its parent (prefix invariant)
            if n._host is not None and (n._state_device is None or n._state_host is not None):
                continue  # backed up already (most of a path): needs_backup's check, inlined
            if n.hit_count < threshold or not self.needs_backup(n):
                continue
            parent = n.parent
            parent_ok = parent._host is not None or (parent.pending is not None and
                                                     self.pending[parent.pending].kind == "backup")
            if not parent_ok or self.backup(n) is None:
                break

    def backup(self, node: TreeNode) -> int | None:
        """Queue a backup of ``node``'s device-only history and snapshot; its op id, or None.

        Host room (host leaves evicted, then host snapshots) is made before a backup with a
        snapshot, and for the history alone only when its write is refused, which is then
        tried again; if a snapshot still does not fit, the history goes without it.
        """
        anchor, tokens = (node._device, len(node.key) >> 3) if node._host is None else (EMPTY_SLOTS, 0)
        state = node._state_device if node._state_host is None else None
        write = self.ctrl.write  # the tree's own slots, checked at insert
        dst = None if state is not None else write(anchor, None, trusted=True)
        if dst is None:
            self.make_room(self.ledger.host, tokens, state is not None)
            dst = write(anchor, state, trusted=True)
        if dst is None and state is not None and tokens:
            state = None
            dst = write(anchor, None, trusted=True)
        if dst is None:
            self.counters["backups_refused"] += 1
            return None
        op = self.ctrl.last_op_id
        node.pending = op
        self.pending[op] = PendingOp("backup", node, dst, state is not None)
        self.counters["backups"] += 1
        return op

    # ---- loads --------------------------------------------------------------------------
    def load_back(self, node: TreeNode) -> dict[str, torch.Tensor] | None:
        """Queue the load of ``node``'s host-only chain and host snapshot (see `HiRadixCache.load_back`)."""
        if node.is_root or node.dead:
            raise ValueError(f"node: {node!r} is the root or was evicted")
        if not self._load_needed(node):
            return {self.anchor: EMPTY_SLOTS.clone()}
        if self._in_flight(node):
            return None
        lock(node)  # nothing on the path is evicted meanwhile; the ack unlocks it
        try:
            dst, queued = self._queue_load(node)
        except BaseException:
            unlock(node)
            raise
        if not queued:
            unlock(node)
        return dst

    def _queue_load(self, node: TreeNode) -> tuple[dict[str, torch.Tensor] | None, bool]:
        """Make device room, then queue the load of the chain as it is after any poll
        that made: (the caller's copy of the destination slots, or None; queued)."""
        tokens = sum(n.num_tokens for n in _host_chain(node))
        self.make_room(self.ledger.device, tokens, self._needs_state(node))  # may poll
        chain, need_state = _host_chain(node), self._needs_state(node)  # read after any poll
        if not chain and not need_state:
            return {self.anchor: EMPTY_SLOTS.clone()}, False
        if self._in_flight(node):
            return None, False
        host = torch.cat([n._host for n in chain]) if chain else EMPTY_SLOTS
        dst = self.ctrl.load(host, node._state_host if need_state else None, trusted=True)  # acked host copies
        if dst is None:
            self.counters["loads_refused"] += 1
            return None, False
        op = self.ctrl.last_op_id
        if self.anchor in dst:
            self.ledger.hold(dst[self.anchor].numpy(), 1)
        if need_state:
            self.ledger.hold_snapshot({n: dst[n] for n in self.ledger.state_sizes}, 1)
        for n in (*chain, node):
            n.pending = op
        self.pending[op] = PendingOp("load", node, dst, need_state)
        self.counters["loads"] += 1
        return {self.anchor: dst.get(self.anchor, EMPTY_SLOTS).clone(), **copy_slots(dst)}, True

    @staticmethod
    def _needs_state(node: TreeNode) -> bool:
        return node._state_device is None and node._state_host is not None

    def _load_needed(self, node: TreeNode) -> bool:
        return node._device is None or self._needs_state(node)

    def _in_flight(self, node: TreeNode) -> bool:
        return node.pending is not None or any(n.pending is not None for n in _host_chain(node))

    def is_loading(self, node: TreeNode) -> bool:
        """Whether a load (which may bring a snapshot) is in flight on ``node``."""
        return node.pending is not None and self.pending[node.pending].kind == "load"

    def rolled_back_loads(self, name: str) -> list[np.ndarray]:
        """Destination slots of pool ``name`` of loads whose batch the controller rolled
        back (free again) while their failed ack is not polled yet."""
        rolled_back = self.ctrl.rolled_back_ops()
        if not rolled_back:
            return []
        return [rec.dst[name].numpy() for op, rec in self.pending.items()
                if op in rolled_back and rec.kind == "load" and name in rec.dst]

    # ---- acks ---------------------------------------------------------------------------
    def apply(self, acks: list[Ack]) -> None:
        """Apply every ack of this tree's ops, each on its own (module docstring)."""
        for ack in acks:
            rec = self.pending.pop(ack.op_id, None)
            if rec is not None:
                self._apply(rec, ack)

    def _apply(self, rec: PendingOp, ack: Ack) -> None:
        chain = _unfreeze(rec.node, ack.op_id)
        if rec.kind == "load":
            unlock(rec.node)
        if not ack.success:
            if rec.kind == "load":  # the controller freed them: they stop counting as held
                self._unhold(rec)
            self.counters[f"{rec.kind}s_failed"] += 1
            return
        try:
            publish = self._publish_backup if rec.kind == "backup" else self._publish_load
            takers = publish(rec, chain)
        except Exception as exc:  # a bug: report it, give the slots back, apply the other acks
            self._abandon(rec, ack, exc)
            return
        if rec.kind == "backup" and self.on_backed_up is not None:
            self.on_backed_up(takers, rec.node if rec.with_state else None)

    def _unhold(self, rec: PendingOp) -> None:
        if self.anchor in rec.dst:
            self.ledger.hold(rec.dst[self.anchor].numpy(), -1)
        if rec.with_state:
            self.ledger.hold_snapshot({n: rec.dst[n] for n in self.ledger.state_sizes}, -1)

    def _abandon(self, rec: PendingOp, ack: Ack, exc: Exception) -> None:
        """An ack that could not be applied (nothing of it was published): its slots go back."""
        self.counters["acks_broken"] += 1
        logger.error("poll: the ack of op %d (%s of %r) could not be applied; its destination slots "
                     "were given back: %s", ack.op_id, rec.kind, rec.node, exc, exc_info=exc)
        tier = self.ledger.device if rec.kind == "load" else self.ledger.host
        for name, slots in rec.dst.items():
            tier.free(name, slots)  # the device tier's free also stops counting them as held

    def _publish_backup(self, rec: PendingOp, chain: list[TreeNode]) -> list[TreeNode]:
        slots = rec.dst.get(self.anchor)
        if self.policy != "write_back" and slots is not None and chain[0].parent._host is None:
            # The parent's backup failed meanwhile: keep backed-up nodes a prefix from the root.
            for name, s in rec.dst.items():
                self.ledger.host.free(name, s)
            self.counters["backups_discarded"] += 1
            return []
        takers = self.ledger.deal(self.ledger.host, chain, slots) if slots is not None else []
        if rec.with_state:
            self.ledger.give_snapshot(self.ledger.host, rec.node, {n: rec.dst[n] for n in self.ledger.state_sizes})
        return takers

    def _publish_load(self, rec: PendingOp, chain: list[TreeNode]) -> list[TreeNode]:
        slots = rec.dst.get(self.anchor)
        takers = self.ledger.deal(self.ledger.device, chain, slots) if slots is not None else []
        self.ledger.device.leaves.update(takers)
        self.on_loaded("device", takers)
        if rec.with_state:
            self.ledger.give_snapshot(self.ledger.device, rec.node, {n: rec.dst[n] for n in self.ledger.state_sizes},
                                      counted=True)
        return takers

    def wait(self, ops=None) -> None:
        """Launch what ``ops`` need and poll until they are acked (default: every op in flight).

        Raises:
            RuntimeError: an awaited op is neither queued nor in flight in the controller.
        """
        todo = set(self.pending) if ops is None else set(ops) & self.pending.keys()
        kinds = {self.pending[op].kind for op in todo}
        if "backup" in kinds:
            self.ctrl.start_writing()
        if "load" in kinds:
            self.ctrl.start_loading()
        while todo & self.pending.keys():
            if not self.ctrl.pending():
                raise RuntimeError(f"wait: ops {sorted(todo & self.pending.keys())} are unknown to the controller")
            self.poll()


def _host_chain(node: TreeNode) -> list[TreeNode]:
    """The host-only nodes from below the deepest device ancestor down to ``node``."""
    chain = []
    while not node.is_root and node._device is None:
        chain.append(node)
        node = node.parent
    return chain[::-1]


def _unfreeze(node: TreeNode, op: int) -> list[TreeNode]:
    """The chain of op ``op`` (walking up while ``pending == op``), unfrozen, top-down."""
    parent = node.parent
    if node.pending == op and (parent is None or parent.pending != op):  # one node (not split
        node.pending = None  # meanwhile), the common case: no walk
        return [node]
    chain = []
    while node is not None and node.pending == op:
        node.pending = None
        chain.append(node)
        node = node.parent
    return chain[::-1]
