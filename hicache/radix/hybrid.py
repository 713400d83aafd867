"""Hybrid stacks (DeepSeek-V4, linear-attention hybrids): snapshot sizes and where a match may end.

History pools (``HitPolicy.ALL_PAGES``: the anchor and everything derived from it, e.g.
``c4_kv``, ``c4_indexer``, ``c128_kv``) must cover every page of a match. State pools
(``TRAILING_PAGES``: ``swa`` and the compressor rings derived from it) only need the
trailing window at the match end, so each node keeps one *snapshot* of the state root
pools for its end boundary (``window_tokens`` rounded up to rows: one 128-token ``swa``
row for DeepSeek-V4; one ``conv`` row, and the ``recurrent`` row of the same index, for a
linear-attention hybrid, whose recurrent state pools hold a whole state per row).

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
    * ``evict_states`` / ``evict_host_states`` drop snapshots alone (`hicache.radix.evict`):
      the history chain stays, the boundary just stops being a match end until a new
      snapshot is inserted.
    * a snapshot lives on a tier only while its node's history does (evicting the history
      drops the snapshot on that tier too).
    * with a storage tier, a boundary past the match end whose history the tree holds and
      whose snapshot storage holds is read back alone (`snapshotless_tail`,
      `hicache.radix.prefetch`): the match then ends there.

Non-hybrid stacks have no state root: every boundary qualifies, the match runs to the
deepest page shared with the query (splitting a node there) and the device hit to the
deepest device node.
"""
from __future__ import annotations

from typing import Sequence

from host_pools.spec import PoolKind, Stack
from hicache.radix.node import TreeNode


def snapshot_sizes(stack: Stack) -> dict[str, int]:
    """Slots one snapshot takes in each state root pool (own-indexed, non-anchor).

    The window is the largest ``window_tokens`` among the pools rooted there, rounded up
    to whole rows of the root.

    Raises:
        ValueError: an own-indexed non-anchor pool that is not a STATE pool (a second
            history token space has no place in a prefix tree keyed by the anchor).
    """
    for root in stack.own_indexed:
        if root is not stack.anchor and root.kind is not PoolKind.STATE:
            raise ValueError(f"stack: own-indexed pool {root.name!r} is {root.kind.value}; HiRadixCache "
                             "supports only STATE pools besides the anchor")
    return dict(stack.snapshot_slots)


def select_match_end(path: Sequence[TreeNode], hybrid: bool) -> tuple[int, int]:
    """Indices into ``path`` of the last device node and the match end (-1 = the root).

    Args:
        path: fully matched nodes from the root's child downwards.
        hybrid: whether boundaries need a snapshot.
    """
    if not hybrid:
        d = -1
        for i, node in enumerate(path):  # device nodes are closed under parent
            if node._device is None:
                break
            d = i
        return d, len(path) - 1
    e = -1
    for i, node in enumerate(path):
        if node._state_device or node._state_host:
            e = i
    d = -1
    for i in range(e + 1):
        node = path[i]
        if node._device is None:
            break
        if node._state_device:
            d = i
    return d, e


def snapshotless_tail(path: Sequence[TreeNode]) -> tuple[TreeNode, ...]:
    """The boundaries a stored snapshot alone would make a match.

    Args:
        path: fully matched nodes of a hybrid walk, from the root's child downwards.
    Returns:
        The nodes past its match end (none has a snapshot on any tier) whose history is
        on the host (a host snapshot needs it there), top-down.
    """
    end = select_match_end(path, True)[1]
    return tuple(n for n in path[end + 1:] if n._host is not None)


def deepest_needed(nodes: Sequence[TreeNode], present: Sequence[bool]) -> TreeNode | None:
    """The node whose stored snapshot to read.

    Args:
        nodes: `snapshotless_tail` of a walk; present: per node, whether storage has its snapshot.
    Returns:
        The deepest node found in storage if it still needs the snapshot (in the tree, its
        history on the host, no snapshot gained meanwhile), else ``None``.
    """
    for node, ok in zip(reversed(nodes), reversed(list(present))):
        if ok:
            needs = not node.dead and node._host is not None and not node._state_host and not node._state_device
            return node if needs else None
    return None
