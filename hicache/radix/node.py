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

The slots live in private fields (``_device``...); a caller reads them through the
properties ``device``, ``host``, ``state_device`` and ``state_host``, which hand out
copies: no tensor the tree holds is ever handed out, so no edit in place reaches it.
Token ids are int64 keys (`hicache.tokens`: ids outside int64 are refused).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from hicache.tokens import int64_token_ids

_ids = itertools.count()

EMPTY_SLOTS = torch.empty(0, dtype=torch.int64)
_INT64 = np.dtype(np.int64)  # the native int64 dtype (arrays of it share this object: `is` is enough)


@dataclass(slots=True, eq=False)
class TreeNode:
    """One radix-tree node (identity-hashed; hot mutable record): the handle a caller
    gets back from a match or an insert, to lock, load back and read.

    The slot fields are the tree's own (``_device``, ``_host``, ``_state_device``,
    ``_state_host``); a caller reads them through the properties of the same public
    names, which hand out copies, so an edit in place never rewrites the tree. Every
    other field is the tree's to change (read them, never assign them).

    Attributes:
        key: the node's token ids (whole pages) as the bytes of an int64 array: a walk
            compares bytes (memcmp), never arrays; ``tokens`` views them as int64.
        end: prefix length in tokens at the end of this node (its boundary).
        parent: ``None`` only for the root.
        children: child nodes filed by their first page (`hicache.radix.read`: the one
            rule, with `file_child` and `child_nodes`).
        _device / _host: anchor token slots of the node's pages on each tier, or ``None``.
        _state_device / _state_host: snapshot slots at ``end`` per state root pool, or ``None``.
        lock_ref: users of the node (a lock covers the path to the root); locked nodes are
            never evicted on any tier.
        hit_count: requests that carried the node (every insert through it), hit or miss: a
            node created again takes its ghost's count (`hicache.radix.policies.ghosts`); the
            eviction scores and ``write_through_selective`` read it.
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
    _device: torch.Tensor | None = None
    _host: torch.Tensor | None = None
    _state_device: dict | None = None
    _state_host: dict | None = None
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
    def device(self) -> torch.Tensor | None:
        """Device anchor slots of the node's pages (a copy), or ``None``."""
        return None if self._device is None else self._device.clone()

    @property
    def host(self) -> torch.Tensor | None:
        """Host anchor slots of the node's pages (a copy), or ``None``."""
        return None if self._host is None else self._host.clone()

    @property
    def state_device(self) -> dict[str, torch.Tensor] | None:
        """Device snapshot slots at ``end`` keyed by state root pool (copies), or ``None``."""
        return copy_slots(self._state_device)

    @property
    def state_host(self) -> dict[str, torch.Tensor] | None:
        """Host snapshot slots at ``end`` keyed by state root pool (copies), or ``None``."""
        return copy_slots(self._state_host)

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

    def __repr__(self) -> str:
        tiers = ("D" if self._device is not None else "") + ("H" if self._host is not None else "")
        snap = ("d" if self._state_device else "") + ("h" if self._state_host else "")
        return (f"TreeNode(id={self.id}, end={self.end}, tokens={self.num_tokens}, tiers={tiers or '-'}, "
                f"snapshot={snap or '-'}, lock={self.lock_ref}, pending={self.pending})")


def copy_slots(slots: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    """A caller's copy of slots keyed by pool (``None`` stays ``None``)."""
    return None if slots is None else {name: s.clone() for name, s in slots.items()}


def lock(node: TreeNode) -> None:
    """Lock ``node`` and its ancestors: no tier of them is evicted until `unlock`."""
    while node.parent is not None:
        node.lock_ref += 1
        node = node.parent


def unlock(node: TreeNode) -> None:
    """Undo one `lock` of ``node``. Raises RuntimeError on an unlocked node (nothing changes)."""
    cur = node
    while cur.parent is not None:
        if cur.lock_ref <= 0:
            raise RuntimeError(f"dec_lock_ref: {cur!r} is not locked")
        cur = cur.parent
    while node.parent is not None:
        node.lock_ref -= 1
        node = node.parent


def new_root() -> TreeNode:
    """The root: an empty key that is on every tier and holds the (empty) initial state."""
    root = TreeNode(key=b"", end=0, _device=EMPTY_SLOTS, _host=EMPTY_SLOTS)
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
    """Token ids as a contiguous int64 array of whole pages (`hicache.tokens`: ids must fit int64).

    Args:
        strict: raise on a partial trailing page (insert) instead of dropping it (match).
    Raises:
        TypeError: ids that are not integers (floats and bools are refused, never cast).
        ValueError: not 1-D, an id outside int64, or (strict) not a multiple of ``page_size``.
    """
    if type(token_ids) is np.ndarray and token_ids.dtype is _INT64 and token_ids.ndim == 1 \
            and token_ids.flags.c_contiguous:  # the common case: nothing to convert
        key = token_ids
    else:
        key = int64_token_ids(token_ids)
        if key.ndim != 1:
            raise ValueError(f"token_ids: need a 1-D sequence, got shape {key.shape}")
    extra = key.size % page_size
    if extra and strict:
        raise ValueError(f"token_ids: length {key.size} is not a multiple of page_size={page_size}")
    return key[:key.size - extra] if extra else key


def common_pages(a: bytes, b: bytes, page_size: int) -> int:
    """Tokens (whole pages) of the common prefix of two page-aligned keys (as bytes)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # memcmp: the common case
        return n >> 3
    x, y = np.frombuffer(a, np.int64, n >> 3), np.frombuffer(b, np.int64, n >> 3)
    first = int((x == y).argmin())
    return first - first % page_size
