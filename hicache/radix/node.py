"""Radix-tree nodes of `HiRadixCache`: page-granular keys and the tiers a node's data lives on.

A node covers a run of whole pages of token ids (``tokens``) ending at token position
``end`` (its *boundary*). Its *history* is the anchor token slots of those pages, on the
device (``device``), the host (``host``) or both; every pool derived from the anchor (KV,
compressed KV, indexer keys) follows them. A hybrid stack (DeepSeek-V4) adds a *state
snapshot* for the boundary: the slots of each state root pool (``swa``) holding the
trailing window, again on the device (``state_device``), the host (``state_host``) or both.

Tiers of a node's history (the snapshot follows the same picture one level down: it is
on a tier only while the history is, and can also be evicted on its own):

              insert                         backup acked
    (new) ------------> DEVICE ---------------------------------> DEVICE+HOST
                         |  ^                                       |    ^
       evict: deleted    |  | insert revives                 evict  |    | load acked,
       (write_back:      |  | (fresh slots)                         |    | insert revives
        backed up first) |  |                                       v    |
                         v  +------------------------------------- HOST -+
                      deleted                                       |
                                                evict_host (a leaf, |
                                                not in use)         v
                                                                 deleted

A transfer in flight (``pending`` = its op id) freezes the node: it is never evicted on
any tier and takes no second transfer. The tier changes only when the ack arrives; a
failed ack leaves the node exactly as it was before the transfer.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from host_pools.allocator import is_integer_dtype

_ids = itertools.count()

EMPTY_SLOTS = torch.empty(0, dtype=torch.int64)


@dataclass(slots=True, eq=False)
class TreeNode:
    """One radix-tree node (identity-hashed; hot mutable record).

    Attributes:
        key: the node's token ids (whole pages) as the bytes of an int64 array: a walk
            compares bytes (memcmp), never arrays; ``tokens`` views them as int64.
        end: prefix length in tokens at the end of this node (its boundary).
        parent: ``None`` only for the root.
        children: child nodes keyed by the bytes of their first page.
        device / host: anchor token slots of the node's pages on each tier, or ``None``.
        state_device / state_host: snapshot slots at ``end`` per state root pool, or ``None``.
        lock_ref: users of the node (a lock covers the path to the root); locked nodes are
            never evicted on any tier.
        hit_count: inserts that went through the node (``write_through_selective``).
        last_access: logical clock of the last match or insert touching it (LRU).
        pending: op id of the transfer in flight on this node, or ``None``.
        dead: removed from the tree (stale entries in eviction candidate sets check it).
        hashes: page hashes of the node's pages (storage keys), computed when first needed.
        stored / state_stored: the history / the snapshot is known to be in storage (the
            tree wrote or read it; the store may have dropped it since).
    """

    key: bytes
    end: int
    parent: "TreeNode | None" = None
    children: dict = field(default_factory=dict)
    device: torch.Tensor | None = None
    host: torch.Tensor | None = None
    state_device: dict | None = None
    state_host: dict | None = None
    lock_ref: int = 0
    hit_count: int = 0
    last_access: int = 0
    pending: int | None = None
    dead: bool = False
    hashes: list | None = None
    stored: bool = False
    state_stored: bool = False
    id: int = field(default_factory=_ids.__next__)

    @property
    def tokens(self) -> np.ndarray:
        """The key as a read-only int64 array (a view, no copy)."""
        return np.frombuffer(self.key, np.int64)

    @property
    def num_tokens(self) -> int:
        return len(self.key) >> 3

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def evictable(self) -> bool:
        """Not locked and no transfer in flight."""
        return self.lock_ref == 0 and self.pending is None

    def has_device_child(self) -> bool:
        return any(c.device is not None for c in self.children.values())

    def __repr__(self) -> str:
        tiers = ("D" if self.device is not None else "") + ("H" if self.host is not None else "")
        snap = ("d" if self.state_device else "") + ("h" if self.state_host else "")
        return (f"TreeNode(id={self.id}, end={self.end}, tokens={self.num_tokens}, tiers={tiers or '-'}, "
                f"snapshot={snap or '-'}, lock={self.lock_ref}, pending={self.pending})")


def new_root() -> TreeNode:
    """The root: an empty key that is on every tier and holds the (empty) initial state."""
    root = TreeNode(key=b"", end=0, device=EMPTY_SLOTS, host=EMPTY_SLOTS)
    root.lock_ref = 1  # the root is never evicted
    return root


class MatchResult(NamedTuple):
    """Where a prefix is cached.

    ``device_slots`` are the anchor device slots of tokens ``[0, last_device_node.end)``;
    tokens ``[last_device_node.end, last_host_node.end)`` (``host_hit_length`` of them)
    are usable after ``load_back(last_host_node)``.
    """

    device_slots: torch.Tensor
    last_device_node: TreeNode
    host_hit_length: int
    last_host_node: TreeNode

    @property
    def device_hit_length(self) -> int:
        return int(self.device_slots.numel())


class InsertResult(NamedTuple):
    """``cached_length``: leading tokens already cached on the device before the insert."""

    cached_length: int
    last_node: TreeNode


def as_key(token_ids, page_size: int, strict: bool) -> np.ndarray:
    """Token ids as a contiguous int64 array of whole pages.

    Args:
        strict: raise on a partial trailing page (insert) instead of dropping it (match).
    Raises:
        TypeError: ids that are not integers (floats and bools are refused, never cast).
        ValueError: not 1-D, or (strict) not a multiple of ``page_size``.
    """
    if type(token_ids) is np.ndarray and token_ids.dtype == np.int64 and token_ids.ndim == 1 \
            and token_ids.flags.c_contiguous:  # the common case: nothing to convert
        key = token_ids
    else:
        key = _as_int64(token_ids)
    extra = key.size % page_size
    if extra and strict:
        raise ValueError(f"token_ids: length {key.size} is not a multiple of page_size={page_size}")
    return key[:key.size - extra] if extra else key


def _as_int64(token_ids) -> np.ndarray:
    if isinstance(token_ids, torch.Tensor):
        if token_ids.numel() and not is_integer_dtype(token_ids.dtype):
            raise TypeError(f"token_ids: need integer token ids, got dtype {token_ids.dtype}")
        token_ids = token_ids.detach().cpu().numpy()
    arr = np.asarray(token_ids)
    if arr.dtype.kind not in "iu" and arr.size:  # an empty list is float64 to numpy: fine
        raise TypeError(f"token_ids: need integer token ids, got dtype {arr.dtype}")
    key = np.ascontiguousarray(arr, dtype=np.int64)
    if key.ndim != 1:
        raise ValueError(f"token_ids: need a 1-D sequence, got shape {key.shape}")
    return key


def common_pages(a: bytes, b: bytes, page_size: int) -> int:
    """Tokens (whole pages) of the common prefix of two page-aligned keys (as bytes)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # memcmp: the common case
        return n >> 3
    x, y = np.frombuffer(a, np.int64, n >> 3), np.frombuffer(b, np.int64, n >> 3)
    first = int((x == y).argmin())
    return first - first % page_size
