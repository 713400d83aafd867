"""The tiers of `HiRadixCache` and `SlotLedger`, the one owner of the slots the tree holds on them.

Device and host hold slots; a node keeps its history (anchor slots) and its state snapshot
in two fields per tier, and each tier keeps its own eviction candidates. Everything that
is "the same on every tier" — dropping a copy, freeing snapshots, publishing slots on a
chain of nodes — is written once against a `Tier`; what differs is data in the record:

    tier     node fields             pools                     a leaf is                    below
    device   _device, _state_device  cache.device_pools        on device, no device child   host
    host     _host, _state_host      cache.host_group.pools    on host only, no children    storage

Storage, below the host, holds no slots the tree could count: it is a store of page
objects (`hicache.radix.store`), so a node only remembers what it knows is stored
(``stored``, ``state_stored``) and the tree asks the store for the rest of a prompt.
Data moves one tier at a time, and only an acknowledged move changes a node:

                backup (controller write, ack)          write (StorageIO, polled)
     DEVICE  ----------------------------------> HOST  ---------------------------> STORAGE
             <----------------------------------       <---------------------------
                load_back (controller load, ack)        prefetch: lookup, read into host
                                                        slots, lands as a host-only node

Who holds a device page (what insert checks a caller's slots against, one lookup each):

    anchor page        held[page]            +1 a node takes it (insert, load ack), a load
    state root page    state_held[pool][p]      is queued into it; -1 it is given back
                                                (``Tier.free``) or a load into it fails

A load's hold passes to the nodes that take its slots when it is acked (counted once).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch

from hicache import slot_arrays
from hicache.radix.index import RadixIndex
from hicache.radix.node import TreeNode
from hicache.radix.read import child_nodes


@dataclass(slots=True, eq=False)
class Tier:
    """One tier whose slots the tree holds (a hot mutable record; identity-compared).

    Attributes:
        name: ``"device"`` or ``"host"`` (counter names use it).
        attr: the `TreeNode` field of the history slots on this tier.
        state_attr: the `TreeNode` field of the snapshot slots on this tier.
        pools: the tier's pools keyed by pool name (own-indexed ones allocate and free).
        anchor: the tier's anchor pool.
        is_leaf: whether a node is an eviction candidate of this tier right now.
        free: ``free(pool_name, slots)`` gives slots the tree held on this tier back.
        leaves: candidate leaves (may hold stale entries; eviction filters them).
        states: nodes with a snapshot on this tier (snapshot eviction candidates).
    """

    name: str
    attr: str
    state_attr: str
    pools: Mapping[str, Any]
    anchor: Any
    is_leaf: Callable[[TreeNode], bool]
    free: Callable[[str, torch.Tensor], Any]
    leaves: set = field(default_factory=set)
    states: set = field(default_factory=set)

    def slots(self, node: TreeNode) -> torch.Tensor | None:
        """The node's history slots on this tier, or ``None``."""
        return getattr(node, self.attr)

    def snapshot(self, node: TreeNode) -> dict | None:
        """The node's snapshot slots on this tier keyed by pool, or ``None``."""
        return getattr(node, self.state_attr)


def has_device_child(node: TreeNode) -> bool:
    """Whether a child of ``node`` holds device pages."""
    return any(c._device is not None for c in child_nodes(node))


def is_device_leaf(node: TreeNode) -> bool:
    return not node.dead and not node.is_root and node._device is not None and not has_device_child(node)


def is_host_leaf(node: TreeNode) -> bool:
    return (not node.dead and not node.is_root and node._device is None and node._host is not None
            and not node.children)


class SlotLedger:
    """The device and host tiers and every slot the tree holds on them (scheduler thread).

    Args:
        cache: the `hicache.HiCache` whose pools the tiers are.
        index: the node structure (its epoch changes whenever a copy does).
        state_sizes: slots of one snapshot per state root pool.
    """

    def __init__(self, cache: Any, index: RadixIndex, state_sizes: Mapping[str, int]) -> None:
        self.anchor, self.index, self.state_sizes = cache.stack.anchor.name, index, dict(state_sizes)
        self.page_size = cache.stack.page_size
        device_pools, host_pools = cache.device_pools, cache.host_group.pools
        self.device_pool, self.host_pool = device_pools[self.anchor], host_pools[self.anchor]
        self.device = Tier("device", "_device", "_state_device", device_pools, self.device_pool,
                           is_device_leaf, self._free_device)
        self.host = Tier("host", "_host", "_state_host", host_pools, self.host_pool, is_host_leaf,
                         self.free_host_now)
        self.tiers = (self.device, self.host)
        self.held = np.zeros(self.device_pool.allocator.num_pages, np.int32)
        self.state_held = {n: np.zeros(device_pools[n].allocator.num_pages, np.int32) for n in self.state_sizes}

    def route_host_frees(self, free: Callable[[str, torch.Tensor], Any] | None) -> None:
        """Give host slots back through ``free`` (the storage tier's pins) from now on;
        ``None``: straight to the pools again."""
        self.host.free = self.free_host_now if free is None else free

    def free_host_now(self, name: str, slots: torch.Tensor) -> None:
        """Give host slots back to their pool at once (no storage write reads them)."""
        self.host.pools[name].free(slots)

    # ---- who holds a device page ---------------------------------------------------------
    def hold(self, slots: np.ndarray, delta: int) -> None:
        """Count device anchor pages of ``slots`` (the tree's own: whole, distinct) as
        taken (+1: a node or a load in flight) or given back (-1)."""
        slot_arrays.hold(slots, self.page_size, self.held, delta)

    def hold_snapshot(self, snap: Mapping[str, torch.Tensor], delta: int) -> None:
        """Count the device pages of a snapshot (the tree's own) as taken or given back."""
        for name, slots in snap.items():
            self.state_held[name][self.state_pages(name, slots)] += delta

    def state_pages(self, name: str, slots: torch.Tensor) -> np.ndarray:
        """Allocator pages of the tree's own slots of state root ``name`` (whole pages)."""
        ps = self.device.pools[name].allocator.page_size
        arr = slots.numpy()
        return arr[::ps] // ps if ps > 1 else arr

    def take(self, slots: np.ndarray) -> torch.Tensor:
        """A node's own copy of a caller's device anchor slots, counted as held."""
        self.hold(slots, 1)
        return torch.from_numpy(slots.copy())

    def _free_device(self, name: str, slots: torch.Tensor) -> None:
        """Give back device slots the tree held (they stop counting as held). The anchor's
        are the tree's own whole pages: freed without being checked again."""
        if name != self.anchor:
            self.state_held[name][self.state_pages(name, slots)] -= 1
            self.device.pools[name].free(slots)
            return
        ps = self.page_size
        pages = slots.numpy()[::ps] // ps
        self.device_pool.allocator.free_pages(pages)
        self.held[pages] -= 1

    # ---- copies on nodes -----------------------------------------------------------------
    def deal(self, tier: Tier, chain: list[TreeNode], slots: torch.Tensor) -> list[TreeNode]:
        """Hand an acked op's ``slots`` out top-down to the chain nodes lacking a copy on
        ``tier``; returns them. Checks before it changes anything.

        Raises:
            RuntimeError: the slots do not cover exactly those nodes (nothing changed).
        """
        attr = tier.attr
        if len(chain) == 1 and getattr(chain[0], attr) is None and chain[0].num_tokens == slots.numel():
            setattr(chain[0], attr, slots)  # the common case: one node, not split meanwhile
            self.index.changed()
            return chain
        takers = [n for n in chain if getattr(n, attr) is None]
        total = sum(n.num_tokens for n in takers)
        if total != slots.numel():
            raise RuntimeError(f"ack: {slots.numel()=} slots for {total=} tokens on {takers!r}")
        off = 0
        for n in takers:
            setattr(n, attr, slots[off:off + n.num_tokens])
            off += n.num_tokens
        self.index.changed()
        return takers

    def drop_copy(self, tier: Tier, node: TreeNode, others: list[Tier]) -> None:
        """Give back ``tier``'s copy of a leaf's history and snapshot; ``others`` hold it still."""
        tier.free(self.anchor, getattr(node, tier.attr))
        setattr(node, tier.attr, None)
        self.index.changed()
        self.free_snapshot(tier, node)
        tier.leaves.add(node.parent)
        for other in others:
            other.leaves.add(node)

    def release(self, node: TreeNode) -> None:
        """Give back every tier's copies of ``node`` (it leaves the tree)."""
        for tier in self.tiers:
            slots = getattr(node, tier.attr)
            if slots is not None:
                tier.free(self.anchor, slots)
                setattr(node, tier.attr, None)
            self.free_snapshot(tier, node)

    def give_snapshot(self, tier: Tier, node: TreeNode, snap: dict[str, torch.Tensor],
                      counted: bool = False) -> None:
        """``node`` takes ``snap`` as its snapshot on ``tier`` (it has none there).

        Args:
            counted: device slots already held (a load's, passing to the node).
        """
        if tier is self.device and not counted:
            self.hold_snapshot(snap, 1)
        setattr(node, tier.state_attr, snap)
        tier.states.add(node)

    def free_snapshot(self, tier: Tier, node: TreeNode) -> None:
        """Give back the node's snapshot slots on ``tier``, if any."""
        snap = getattr(node, tier.state_attr)
        if snap is not None:
            for name, slots in snap.items():
                tier.free(name, slots)
            setattr(node, tier.state_attr, None)
            tier.states.discard(node)
