"""`HiRadixCache`: a page-granular prefix tree whose nodes live on device, host or both.

Built on what `hicache.build` returns; the write policy and the sizes come from its
config and plan. One request's life through the tree (the replay tool does exactly this):

    m = tree.match_prefix(tokens)            device hit + host hit (MatchResult)
    p = tree.prefetch(tokens)                storage tier: the rest of the prompt into host
    ... tree.poll() until p.done (or          slots (None: no tier, nothing past the tree);
        tree.stop_prefetch(p)) ...            p.result says how much it got
    m = tree.match_prefix(tokens)            the landed pages are a host hit now
    tree.inc_lock_ref(m.last_host_node)      nothing on the path is evicted meanwhile
    tree.load_back(m.last_host_node)         if m.host_hit_length (or a snapshot) must move
    ctrl.start_loading(); tree.poll()        the ack publishes the device copies
    ... allocate device slots for the rest (tree.evict when short), compute them ...
    tree.insert(tokens, slots, extra=...)    takes ownership; queues backups per policy
    ctrl.start_writing(); tree.poll()        the acks publish the host copies
    tree.dec_lock_ref(m.last_host_node)
    tree.close()                             at shutdown: storage writes finish, store closes

Keys, matches, inserts and evictions are whole pages (``stack.page_size`` tokens).

    write policy              backs a node up                       device eviction of a
                                                                    node not backed up
    write_through             at every insert reaching it           deletes it
    write_through_selective   at the 2nd insert reaching it         deletes it
    write_back                when it is evicted from the device    backs it up, then drops
                                                                    the device copy

Under both write-through policies a node is backed up only after its parent, so the
backed-up nodes form a prefix from the root. Node tiers: `hicache.radix.node`; matching and
splits: `hicache.radix.match`; eviction:
`hicache.radix.evict`; inserts and the caller's slots: `hicache.radix.insert`;
transfers and acks: `hicache.radix.transfers`; hybrid (DeepSeek-V4)
match rule and snapshots: `hicache.radix.hybrid`; invariants: `hicache.radix.check`;
the tiers as one mechanism: `hicache.radix.tiers`; storage: `hicache.radix.storage`,
`hicache.radix.prefetch`, `hicache.radix.store`.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hicache.radix.check import check_tree
from hicache.radix.evict import EvictionMixin
from hicache.radix.hybrid import SnapshotMixin, snapshot_sizes
from hicache.radix.insert import InsertMixin
from hicache.radix.match import MatchMixin
from hicache.radix.node import EMPTY_SLOTS, TreeNode, new_root
from hicache.radix.prefetch import PrefetchMixin
from hicache.radix.storage import StorageMixin
from hicache.radix.tiers import Tier, is_device_leaf, is_host_leaf
from hicache.radix.transfers import TransferMixin

if TYPE_CHECKING:
    from hicache.radix.store import TierStore


class HiRadixCache(MatchMixin, InsertMixin, EvictionMixin, SnapshotMixin, TransferMixin, StorageMixin,
                   PrefetchMixin):
    """Prefix tree over page-aligned token ids with device, host and storage tiers.

    Args:
        cache: a `hicache.HiCache` (``hicache.build(...)``); the tree owns its
            controller's acks (call ``tree.poll()``, never ``controller.poll()``).
        host_tier: use the host tier; default: when the host anchor pool has any room.
        storage: the storage tier below the host: a `TierStore` (the tree closes it in
            `close`), ``None`` for none, or ``"config"`` (default) to open what
            ``cache.config`` asks for (``--hicache-storage-*``; needs the host tier).
    Raises:
        ValueError: a stack with an own-indexed pool other than the anchor that is not a
            STATE pool.
        StorageUnavailableError: ``"config"`` names a store that cannot be reached (the
            message names the flag; ``--hicache-storage-optional`` runs without it).
    Not thread-safe: call from the scheduler thread.
    """

    def __init__(self, cache: Any, *, host_tier: bool | None = None,
                 storage: TierStore | str | None = "config") -> None:
        self.cache, self.stack, self.ctrl = cache, cache.stack, cache.controller
        self.page_size = self.stack.page_size
        self.policy = cache.config.write_policy
        self.anchor = self.stack.anchor.name
        self.device_pool = cache.device_pools[self.anchor]
        self.host_pool = cache.host_group.pools[self.anchor]
        self.state_sizes = snapshot_sizes(self.stack)
        self.hybrid = bool(self.state_sizes)
        self.host_enabled = self.host_pool.num_tokens > 0 if host_tier is None else host_tier
        self.root = new_root()
        self._clock = 0
        device_pools, host_pools = cache.device_pools, cache.host_group.pools
        self.device_tier = Tier("device", "device", "state_device", device_pools, self.device_pool,
                                is_device_leaf, self._free_device)
        self.host_tier = Tier("host", "host", "state_host", host_pools, self.host_pool,
                              is_host_leaf, self._free_host)
        self.tiers = (self.device_tier, self.host_tier)
        self.counters: Counter = Counter()
        # Per device anchor page: how many nodes and loads in flight hold it (0 or 1 but
        # for a rolled-back load not yet acked); insert's "already held?" is one lookup.
        self._held = np.zeros(self.device_pool.allocator.num_pages, np.int32)
        self._page_bytes = self.page_size * 8  # a child's dict key: its first page as int64 bytes
        # Bumped by every split and deletion and whenever a node's copy on a tier is dropped
        # or published: a match's walk kept for the next insert is stale then.
        self._epoch = 0
        self._last_walk: tuple | None = None  # match_prefix's (key bytes, path, epoch, device slots)
        self._init_transfers()
        if storage == "config":  # the storage layer is imported only when a store is configured
            storage = None
            if self.host_enabled and cache.config.storage_backend != "none":
                from hicache.radix.store import open_store
                storage = open_store(cache)
        self._init_storage(storage)

    def _free_device(self, name: str, slots: torch.Tensor) -> None:
        """Give device slots the tree held back (anchor pages stop counting as held). The
        anchor's are the tree's own whole pages: freed without being checked again."""
        if name != self.anchor:
            self.cache.device_pools[name].free(slots)
            return
        ps = self.page_size
        pages = slots.numpy()[::ps] // ps
        self.device_pool.allocator.free_pages(pages)
        self._held[pages] -= 1

    # ---- write policies ----------------------------------------------------------
    def _backup_path(self, path: list[TreeNode]) -> None:
        """Queue the backups an insert along ``path`` (whose hit counts it raised) asks for."""
        if not self.host_enabled or self.policy == "write_back":
            return
        threshold = 1 if self.policy == "write_through" else 2
        for n in path:  # top-down: a node only after its parent (prefix invariant)
            if n.host is not None and (n.state_device is None or n.state_host is not None):
                continue  # backed up already (most of a path): the check of _needs_backup, inlined
            if n.hit_count < threshold or not self._needs_backup(n):
                continue
            parent = n.parent
            parent_ok = parent.host is not None or (parent.pending is not None and
                                                    self._pending[parent.pending].kind == "backup")
            if not parent_ok or self._backup(n) is None:
                break

    # ---- the tier below -----------------------------------------------------------
    # device: below is the host (--hicache-write-policy); host: below is storage
    # (--hicache-storage-write-policy), whose writes run on I/O threads.
    def _writes_back(self, tier: Tier) -> bool:
        """Whether eviction from ``tier`` backs a leaf up to the tier below first."""
        if tier is self.device_tier:
            return self.policy == "write_back" and self.host_enabled
        return self.storage is not None and self.storage.write_policy == "write_back"

    def _held_below(self, tier: Tier, node: TreeNode) -> bool:
        """Whether the tier below ``tier`` already holds ``node``'s history (and snapshot)."""
        if tier is self.device_tier:
            return node.host is not None
        return node.stored and (node.state_host is None or node.state_stored)

    def _save_below(self, tier: Tier, nodes: list[TreeNode]) -> None:
        """Back ``nodes`` up to the tier below ``tier``: the device waits for its backups to
        the host; the host submits storage writes (their pages stay pinned until done)."""
        if tier is self.host_tier:
            self._store_now(nodes)
            return
        ops = [op for op in (self._backup(n) for n in nodes) if op is not None]
        if ops:
            self.wait(ops)

    # ---- locks -------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock ``node`` and its ancestors: no tier of them is evicted until unlocked."""
        while not node.is_root:
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref` of ``node``. Raises RuntimeError on an unlocked node."""
        while not node.is_root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref: {node!r} is not locked")
            node.lock_ref -= 1
            node = node.parent

    # ---- views -------------------------------------------------------------------
    def device_slots(self, node: TreeNode) -> torch.Tensor:
        """Device anchor slots of tokens ``[0, node.end)``.

        Raises:
            ValueError: part of the path is not on the device.
        """
        parts = []
        while not node.is_root:
            if node.device is None:
                raise ValueError(f"node: {node!r} has no device copy")
            parts.append(node.device)
            node = node.parent
        return torch.cat(parts[::-1]) if parts else EMPTY_SLOTS

    def snapshot_slots(self, node: TreeNode) -> tuple[dict | None, dict | None]:
        """(device, host) snapshot slots of ``node``'s boundary, each keyed by pool or None."""
        return node.state_device, node.state_host

    def stats(self) -> dict:
        """Counters of the tree (backups, loads, evictions, prefetches...), the controller's
        and, with a storage tier, the store's (bytes, objects, faults, busy seconds)."""
        out = {"tree": dict(self.counters), "controller": self.ctrl.stats()}
        if self.storage is not None:
            out["storage"] = self.storage.stats()
        return out

    def check_integrity(self) -> None:
        """Raise RuntimeError if an invariant is broken (see `hicache.radix.check`).

        Call when the caller holds no device slots outside the tree (between requests).
        """
        check_tree(self)
