"""The tiers of `HiRadixCache` and the one record that describes each: `Tier`.

Device and host hold slots; a node keeps its history (anchor slots) and its state snapshot
in two fields per tier, and each tier keeps its own eviction candidates. Everything that
is "the same on every tier" — making room, evicting LRU leaves (backing them up to the
tier below first under write-back), dropping a copy, freeing snapshots, publishing slots
on a chain of nodes — is written once against a `Tier` (`hicache.radix.evict`,
`hicache.radix.transfers`); what differs is data in the record and what lies below:

    tier     node fields           pools                     a leaf is                    below
    device   device, state_device  cache.device_pools        on device, no device child   host
    host     host, state_host      cache.host_group.pools    on host only, no children    storage

Storage, below the host, holds no slots the tree could count: it is a store of page
objects (`hicache.radix.store`), so a node only remembers what it knows is stored
(``stored``, ``state_stored``) and the tree asks the store for the rest of a prompt.
Data moves one tier at a time, and only an acknowledged move changes a node:

                backup (controller write, ack)          write (StorageIO, polled)
     DEVICE  ----------------------------------> HOST  ---------------------------> STORAGE
             <----------------------------------       <---------------------------
                load_back (controller load, ack)        prefetch: lookup, read into host
                                                        slots, lands as a host-only node

A hit through storage: ``match_prefix`` (device + host) -> ``prefetch`` of the rest
(lookup: leading run of pages, and snapshot boundaries; host slots; reads; landed on
`poll`) -> ``match_prefix`` again (the landed node is a host hit) -> ``load_back`` -> the
device, exactly as a host hit goes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from hicache.radix.node import TreeNode


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
        free: ``free(pool_name, slots)`` gives slots of this tier back.
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

    def set_snapshot(self, node: TreeNode, snap: dict | None) -> None:
        """Give the node a snapshot on this tier (``None``: forget it); files it as a candidate."""
        setattr(node, self.state_attr, snap)
        if snap is None:
            self.states.discard(node)
        else:
            self.states.add(node)

    def free_snapshot(self, node: TreeNode) -> None:
        """Free the node's snapshot slots on this tier, if any."""
        snap = getattr(node, self.state_attr)
        if snap is not None:
            for name, slots in snap.items():
                self.free(name, slots)
            self.set_snapshot(node, None)


def is_device_leaf(node: TreeNode) -> bool:
    return not node.dead and not node.is_root and node.device is not None and not node.has_device_child()


def is_host_leaf(node: TreeNode) -> bool:
    return (not node.dead and not node.is_root and node.device is None and node.host is not None
            and not node.children)
