"""Hybrid stacks (DeepSeek-V4): where a match may end, and state snapshots on their own.

History pools (``HitPolicy.ALL_PAGES``: the anchor and everything derived from it, e.g.
``c4_kv``, ``c4_indexer``, ``c128_kv``) must cover every page of a match. State pools
(``TRAILING_PAGES``: ``swa`` and the compressor rings derived from it) only need the
trailing window at the match end, so each node keeps one *snapshot* of the state root
pools for its end boundary (``window_tokens`` rounded up to rows: one 128-token ``swa``
row for DeepSeek-V4).

    query  0        256                 768      1024     1280      (page = 256 tokens)
           |---A----|---------B---------|---C----|---D----|--E ...   nodes on its path
    history  D+H      D+H                 D+H      H        H        D = device, H = host
    snapshot -        d+h                 -        h        -        d/h = snapshot there
                      ^                            ^
                      last_device_node             last_host_node  (the match end)

    * the match ends at the deepest node boundary with the full history chain (every node
      of the tree has its history on some tier, so any path qualifies) AND a snapshot on
      either tier: here 1280 (end of D); the root (empty state) always qualifies.
    * the device hit ends at the deepest boundary <= the match end whose history up to it
      is all on the device and whose snapshot is on the device: here 768 (end of B). C's
      history is on the device but C has no snapshot, so it counts as host hit.
    * ``load_back(D)`` loads the host-only history (D's pages) and D's snapshot; pages
      already on the device (C) are not moved again.
    * ``evict_states`` / ``evict_host_states`` drop snapshots alone: the history chain
      stays, the boundary just stops being a match end until a new snapshot is inserted.
    * a snapshot lives on a tier only while its node's history does (evicting the history
      drops the snapshot on that tier too).

Non-hybrid stacks have no state root: every boundary qualifies, the match runs to the
deepest page shared with the query (splitting a node there) and the device hit to the
deepest device node.
"""
from __future__ import annotations

import heapq
from typing import Sequence

import torch

from host_pools.spec import PoolKind, Stack
from hicache.radix.node import TreeNode
from hicache.radix.tiers import Tier


def snapshot_sizes(stack: Stack) -> dict[str, int]:
    """Slots one snapshot takes in each state root pool (own-indexed, non-anchor).

    The window is the largest ``window_tokens`` among the pools rooted there, rounded up
    to whole rows of the root.

    Raises:
        ValueError: an own-indexed non-anchor pool that is not a STATE pool (a second
            history token space has no place in a prefix tree keyed by the anchor).
    """
    sizes = {}
    for root in stack.own_indexed:
        if root is stack.anchor:
            continue
        if root.kind is not PoolKind.STATE:
            raise ValueError(f"stack: own-indexed pool {root.name!r} is {root.kind.value}; HiRadixCache "
                             "supports only STATE pools besides the anchor")
        window = max(p.window_tokens for p in stack if stack.root_of(p.name).name == root.name)
        rows = -(-window // root.tokens_per_row)
        sizes[root.name] = rows * root.tokens_per_row
    return sizes


def select_match_end(path: Sequence[TreeNode], hybrid: bool) -> tuple[int, int]:
    """Indices into ``path`` of the last device node and the match end (-1 = the root).

    Args:
        path: fully matched nodes from the root's child downwards.
        hybrid: whether boundaries need a snapshot.
    """
    if not hybrid:
        d = -1
        for i, node in enumerate(path):  # device nodes are closed under parent
            if node.device is None:
                break
            d = i
        return d, len(path) - 1
    e = -1
    for i, node in enumerate(path):
        if node.state_device or node.state_host:
            e = i
    d = -1
    for i in range(e + 1):
        node = path[i]
        if node.device is None:
            break
        if node.state_device:
            d = i
    return d, e


class SnapshotMixin:
    """State-snapshot bookkeeping of `HiRadixCache` (attach, free, evict on their own)."""

    def _attach_snapshot(self, node: TreeNode, snap: dict[str, torch.Tensor]) -> bool:
        """Give ``node`` a device snapshot; False (and ``snap`` freed) if it has one or cannot take one.

        A node whose history is not on the device, or with a load in flight (which may bring
        a snapshot), takes none; a backup in flight does not matter (it does not cover it).
        """
        loading = node.pending is not None and self._pending[node.pending].kind == "load"
        if node.state_device is not None or loading or node.device is None:
            for name, slots in snap.items():
                if node.state_device is None or not torch.equal(node.state_device[name], slots):
                    self.device_tier.free(name, slots)
            return False
        self.device_tier.set_snapshot(node, dict(snap))
        return True

    def _first_state_root(self) -> str:
        if not self.state_sizes:
            raise ValueError("evict_states: this stack has no state pools")
        return next(iter(self.state_sizes))

    def evict_states(self, num_slots: int) -> int:
        """Drop device snapshots, least recently used first, until ``num_slots`` are free.

        The nodes keep their history (and any host snapshot). Locked or in-flight nodes
        are skipped. Mutates the tree; not thread-safe.

        Returns:
            Slots freed in the first state root pool (``swa``).
        Raises:
            ValueError: the stack has no state pools.
        """
        return self._evict_snapshots(self.device_tier, num_slots)

    def evict_host_states(self, num_slots: int) -> int:
        """Free host snapshots (LRU, never of a node in use); the history chain stays.

        Returns:
            Host slots freed in the first state root pool.
        """
        return self._evict_snapshots(self.host_tier, num_slots)

    def _evict_snapshots(self, tier: Tier, num_slots: int) -> int:
        """LRU snapshots of ``tier`` go; host ones are written to storage first under its
        write-back policy (device ones are dropped: their history stays and a later
        insert brings a new snapshot)."""
        per = self.state_sizes[self._first_state_root()]
        heap = [(n.last_access, n.id, n) for n in tier.states if n.evictable]
        heapq.heapify(heap)
        victims = [heapq.heappop(heap)[2] for _ in range(min(len(heap), -(-num_slots // per)))]
        if tier is self.host_tier and self._writes_back(tier):
            self._store_now([n for n in victims if not n.state_stored])
        for node in victims:
            tier.free_snapshot(node)
        self.counters["states_evicted"] += len(victims)
        return len(victims) * per
