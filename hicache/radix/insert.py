"""`HiRadixCache.insert`: the caller's slots checked and the walk planned before the tree changes.

An insert cuts its key into segments along the nodes it matches (a node matched only in
part is split when the plan is applied; its upper half takes the segment):

    key       |<- A: on device ->|<- B: host only ->|<- C: load in flight -- ... end ->|
    action       keep               revive             drop (C and all after it: nothing
                                                       may hang below a load in flight)
    without a node in flight the unmatched tail becomes one new leaf ("new"):
    key       |<- A: on device ->|<- B: host only ->|<- not in the tree ------- end ->|
    action       keep               revive             new

    keep    the tree keeps its own slots; the caller's differing ones are candidates to free
    revive  the node takes the caller's slots as its device copy
    new     a new leaf takes the caller's slots
    drop    the caller's slots are candidates to free

Device nodes are closed under parent, so keep segments come first, then revive ones.
Rules on ``device_slots`` (a ValueError naming it, and the tree and allocators unchanged):
one slot per token, integers (TypeError otherwise), whole aligned pages in range, no page
twice, every page allocated by the device pool's allocator, and no slot past the cached
prefix that the tree holds for that prefix (the tree would hold it twice). When the
cached prefix is given as the tree's own slots (the common case), only the rest is
checked: the tree's slots are valid by construction.

Only *provable duplicates* are freed: candidates no node and no load in flight holds.
The tree's own slots passed back in another order are kept, never freed.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np
import torch

from host_pools.allocator import PageAllocator, is_integer_dtype
from hicache.radix.check import tree_nodes
from hicache.radix.node import EMPTY_SLOTS, InsertResult, TreeNode, as_key, page_key


class _Segment(NamedTuple):
    action: str  # "keep" | "revive" | "drop" | "new"
    start: int  # token positions [start, end) of the key
    end: int
    node: TreeNode | None  # None for "new"


def as_slots(value: Any, what: str) -> torch.Tensor:
    """``value`` (a tensor, numpy array or list of ints) as a CPU int64 tensor.

    A CUDA tensor is copied to the host here, once: the tree keeps CPU slots, so its
    backups and loads never wait on the device for them.

    Raises:
        TypeError: values that are not integers (floats and bools are refused, never cast).
    """
    if isinstance(value, torch.Tensor):
        if value.numel() and not is_integer_dtype(value.dtype):
            raise TypeError(f"{what}: need integer slots, got dtype {value.dtype}")
        return value.detach().to("cpu", torch.int64)
    arr = np.asarray(value)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{what}: need integer slots, got dtype {arr.dtype}")
    return torch.from_numpy(np.array(arr, dtype=np.int64, copy=True))


def allocated_pages(allocator: PageAllocator, slots: torch.Tensor, what: str) -> np.ndarray:
    """Pages of ``slots``: whole aligned pages in range, none twice, all allocated.

    Raises:
        ValueError: naming ``what`` and the first slots that break a rule.
    """
    pages = allocator.pages_of(slots, what)
    if not allocator.owns_pages(pages):
        bad = allocator.unowned_pages(pages)[:4] * allocator.page_size
        raise ValueError(f"{what}: slots starting at {bad.tolist()} are not allocated by the device "
                         "allocator (free, or never handed out)")
    return pages


class InsertMixin:
    """`insert` of `HiRadixCache`: checks, the plan, and applying it."""

    def insert(self, token_ids: Any, device_slots: Any,
               extra: Mapping[str, torch.Tensor] | None = None) -> InsertResult:
        """Cache ``token_ids`` whose KV sits in ``device_slots``; takes ownership of the slots.

        Pages already cached on the device keep the tree's slots; the caller's slots for
        them are freed when they are provably duplicates (held by no node and no load in
        flight). Host-only pages are revived with the caller's slots. ``extra`` is the
        device snapshot at the end of ``token_ids`` (``{"swa": slots}``, hybrid stacks
        only; freed when the boundary already has one). Queues backups per write policy
        (launch with ``controller.start_writing()``). Mutates the tree; a CUDA slot tensor
        is copied to the host once.

        Returns:
            `InsertResult`: tokens already cached on the device, and the node ending at
            ``len(token_ids)``.
        Raises:
            TypeError: token ids or slots that are not integers.
            ValueError: tokens not whole pages; ``device_slots`` not one per token,
                unaligned, out of range, repeated, not allocated, or slots this prefix
                already holds for other tokens; ``extra`` naming other pools / sizes than
                the stack's snapshot or unallocated slots. Nothing changes then.
        """
        key = as_key(token_ids, self.page_size, strict=True)
        slots = as_slots(device_slots, "device_slots")
        if slots.dim() != 1 or slots.numel() != key.size:
            raise ValueError(f"device_slots: need {key.size} slots (one per token), got shape {tuple(slots.shape)}")
        snap = self._check_extra(extra, key.size)
        segs, partial = self._plan_insert(key)
        to_free = self._insert_frees(segs, slots)  # raises before anything changes
        path, cached, complete = self._apply_insert(segs, partial, key, slots)
        if to_free.numel():
            self.device_pool.free(to_free)
        last = path[-1] if path else self.root
        if snap and complete:
            self._attach_snapshot(last, snap)
        elif snap:
            for name, s in snap.items():
                self.cache.device_pools[name].free(s)
        self._touch(path)
        self._backup_path(path)
        return InsertResult(cached, last)

    def _check_extra(self, extra: Mapping[str, torch.Tensor] | None, num_tokens: int) -> dict:
        if not extra:
            return {}
        if set(extra) != set(self.state_sizes):
            raise ValueError(f"extra: must name exactly the snapshot pools {sorted(self.state_sizes)}, "
                             f"got {sorted(extra)}")
        if num_tokens == 0:
            raise ValueError("extra: the empty prefix cannot take a snapshot")
        out = {}
        for name, value in extra.items():
            slots = as_slots(value, f"extra[{name!r}]")
            if slots.dim() != 1 or slots.numel() != self.state_sizes[name]:
                raise ValueError(f"extra[{name!r}]: a snapshot is {self.state_sizes[name]} slots, "
                                 f"got shape {tuple(slots.shape)}")
            allocated_pages(self.cache.device_pools[name].allocator, slots, f"extra[{name!r}]")
            out[name] = slots
        return out

    # ---- plan ----------------------------------------------------------------------
    def _plan_insert(self, key) -> tuple[list[_Segment], tuple[TreeNode, int] | None]:
        """Segments of ``key`` (module docstring) and the node to split, without changing anything."""
        path, partial = self._walk(key)
        matched = [(n, n.num_tokens) for n in path] + ([partial] if partial is not None else [])
        segs, start = [], 0
        for node, length in matched:
            if node.device is None and node.pending is not None:  # a load is bringing it back
                segs.append(_Segment("drop", start, key.size, node))
                return segs, partial
            segs.append(_Segment("keep" if node.device is not None else "revive", start, start + length, node))
            start += length
        if start < key.size:
            segs.append(_Segment("new", start, key.size, None))
        return segs, partial

    def _insert_frees(self, segs: list[_Segment], slots: torch.Tensor) -> torch.Tensor:
        """Check the caller's slots against the plan; returns the ones to free.

        Raises:
            ValueError: a rule of the module docstring broken (before anything changes).
        """
        keep = [s for s in segs if s.action == "keep"]
        k = keep[-1].end if keep else 0
        own = torch.cat([s.node.device[:s.end - s.start] for s in keep]) if len(keep) > 1 else \
            (keep[0].node.device[:k] if keep else EMPTY_SLOTS)
        mine = slots[:k]
        same = torch.equal(own, mine)  # the common case: the tree's own slots, valid by construction
        pages = allocated_pages(self.device_pool.allocator, slots[k:] if same else slots, "device_slots")
        self._check_past_prefix(own, pages if same else pages[k // self.device_pool.allocator.page_size:])
        cand = [] if same else [mine[mine != own]]
        if segs and segs[-1].action == "drop":
            cand.append(slots[segs[-1].start:])
        return self._provable_duplicates(torch.cat(cand), own) if cand else EMPTY_SLOTS

    def _check_past_prefix(self, own: torch.Tensor, pages: np.ndarray) -> None:
        """No slot past the cached prefix (``pages``) may be one the tree holds for this prefix."""
        if not own.numel() or not pages.size:
            return
        clash = self._pages_in(pages, self._pages(own))
        if clash.any():
            first = int(pages[clash][0]) * self.device_pool.allocator.page_size
            raise ValueError(f"device_slots: slot {first} (and its page) is the tree's own slot for other tokens "
                             "of this prefix; pass the tree's slots at their positions (match_prefix) or fresh ones")

    def _provable_duplicates(self, cand: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        """Of ``cand`` (whole pages), those no node and no load in flight holds."""
        if not cand.numel():
            return cand
        cand_pages = self._pages(cand)
        free = ~self._pages_in(cand_pages, self._pages(own)) if own.numel() else np.ones(cand_pages.size, bool)
        if free.any():  # rare (the caller computed cached pages again): one pass over the tree
            free &= ~self._pages_in(cand_pages, self._held_device_pages())
        ps = self.device_pool.allocator.page_size
        return cand.view(-1, ps)[torch.from_numpy(free)].reshape(-1)

    def _pages(self, slots: torch.Tensor) -> np.ndarray:
        ps = self.device_pool.allocator.page_size
        return slots.numpy()[::ps] // ps

    def _pages_in(self, pages: np.ndarray, among: np.ndarray) -> np.ndarray:
        """Mask of ``pages`` found in ``among`` (a scratch bitmap: O(n), no sort, no allocation)."""
        marks = self._page_marks
        marks[among] = True
        try:
            return marks[pages]
        finally:
            marks[among] = False

    def _held_device_pages(self) -> np.ndarray:
        """Every device anchor page a node or a load in flight holds (walks the tree)."""
        held = [node.device for node in tree_nodes(self) if node.device is not None]
        rolled_back = self.ctrl.rolled_back_ops()  # their slots are free again
        held += [rec.dst[self.anchor] for op, rec in self._pending.items()
                 if rec.kind == "load" and self.anchor in rec.dst and op not in rolled_back]
        return self._pages(torch.cat(held)) if held else np.empty(0, np.int64)

    # ---- apply ---------------------------------------------------------------------
    def _apply_insert(self, segs: list[_Segment], partial, key, slots: torch.Tensor
                      ) -> tuple[list[TreeNode], int, bool]:
        """Carry out the plan; (path, tokens cached on device, reached the end of the key)."""
        upper = self._split(*partial) if partial is not None else None
        path, cached = [], 0
        for seg in segs:
            node = upper if partial is not None and seg.node is partial[0] else seg.node
            if seg.action == "keep":
                cached += seg.end - seg.start
            elif seg.action == "revive":
                node.device = slots[seg.start:seg.end].clone()
                self.device_tier.leaves.add(node)
                self.counters["revived_tokens"] += seg.end - seg.start
            elif seg.action == "drop":
                path.append(node)
                return path, cached, node.end == key.size
            else:
                node = self._new_node(path[-1] if path else self.root, key[seg.start:], slots[seg.start:])
            path.append(node)
        return path, cached, True

    def _new_node(self, parent: TreeNode, tokens, slots: torch.Tensor) -> TreeNode:
        node = TreeNode(tokens=tokens.copy(), end=parent.end + tokens.size, parent=parent, device=slots.clone())
        parent.children[page_key(node.tokens, 0, self.page_size)] = node
        self.device_tier.leaves.add(node)
        return node
