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
twice, every page allocated by the device pool's allocator, and no slot of a revive or new
segment that the tree already holds (for this prefix or another: it would hold it twice).
When the cached prefix is given as the tree's own slots (the common case), only the rest
is checked, at a cost proportional to the rest: the tree's slots are valid by
construction, and what the tree holds is a per-page count (``_held``) kept as nodes and
loads take and give back device pages, so "held?" is one lookup per page, never a walk.

Only *provable duplicates* are freed: candidates no node and no load in flight holds.
The tree's own slots passed back in another order are kept, never freed.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np
import torch

from host_pools.allocator import PageAllocator, is_integer_dtype
from hicache import fastpath
from hicache.radix.node import InsertResult, TreeNode, as_key


class _Plan(NamedTuple):
    """Where an insert's key goes (module docstring), found before anything changes."""

    walked: list  # the nodes matched, in order (a partly matched one last, before its split)
    keep: int  # tokens [0, keep) stay on the tree's device slots (the first num_keep nodes)
    num_keep: int
    revive: list  # (index into walked, start, end) of host-only nodes taking the caller's slots
    stop: int  # tokens [stop, len): a new leaf, or (drop) candidates to free
    drop: bool  # walked[-1] has a load in flight: nothing may hang below it


def as_slots(value: Any, what: str) -> torch.Tensor:
    """``value`` (a tensor, numpy array or list of ints) as a CPU int64 tensor.

    A CUDA tensor is copied to the host here, once: the tree keeps CPU slots, so its
    backups and loads never wait on the device for them.

    Raises:
        TypeError: values that are not integers (floats and bools are refused, never cast).
    """
    return torch.from_numpy(slots_array(value, what))


def slots_array(value: Any, what: str) -> np.ndarray:
    """`as_slots` as a numpy int64 array (a view of a CPU int64 tensor: no copy)."""
    if type(value) is torch.Tensor and value.dtype is torch.int64 and value.is_cpu:
        return value.numpy()  # the common case (an integer tensor never requires grad)
    if isinstance(value, torch.Tensor):
        if value.numel() and not is_integer_dtype(value.dtype):
            raise TypeError(f"{what}: need integer slots, got dtype {value.dtype}")
        if value.dtype != torch.int64 or value.device.type != "cpu":
            value = value.to("cpu", torch.int64)
        return value.detach().numpy()
    arr = np.asarray(value)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{what}: need integer slots, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


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
        is copied to the host once. After a `match_prefix` of these tokens (or a prefix
        of them) the insert continues that match's walk.

        Returns:
            `InsertResult`: tokens already cached on the device, and the node ending at
            ``len(token_ids)``.
        Raises:
            TypeError: token ids or slots that are not integers.
            ValueError: tokens not whole pages; ``device_slots`` not one per token,
                unaligned, out of range, repeated, not allocated, or slots the tree
                already holds for other tokens; ``extra`` naming other pools / sizes than
                the stack's snapshot or unallocated slots. Nothing changes then.
        """
        key = as_key(token_ids, self.page_size, strict=True)
        slots = np.ascontiguousarray(slots_array(device_slots, "device_slots"))
        if slots.ndim != 1 or slots.size != key.size:
            raise ValueError(f"device_slots: need {key.size} slots (one per token), got shape {tuple(slots.shape)}")
        snap = self._check_extra(extra, key.size)
        kb = key.tobytes()
        path, partial, matched = self._walk_from_match(kb)
        if partial is None and matched is not None and matched.numel() == (path[-1].end if path else 0):
            # the continued match reached the last node on the device, and nothing changed
            # since: every node is kept (what _plan_insert would find, without the loop)
            plan = _Plan(path, matched.numel(), len(path), [], matched.numel(), False)
        else:
            plan = self._plan_insert(path, partial)
        to_free = self._insert_frees(plan, slots, matched, partial)  # raises before anything changes
        path, complete = self._apply_insert(plan, partial, kb, slots)
        if to_free.size:
            self.device_pool.free(torch.from_numpy(to_free))
        last = path[-1] if path else self.root
        if snap and complete:
            self._attach_snapshot(last, snap)
        elif snap:
            for name, s in snap.items():
                self.cache.device_pools[name].free(s)
        self._clock += 1
        clock = self._clock
        for n in path:  # touched (LRU) and counted (write_through_selective) in one pass
            n.last_access = clock
            n.hit_count += 1
        self._backup_path(path)
        return InsertResult(plan.keep, last)

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
    @staticmethod
    @staticmethod
    def _plan_insert(path: list[TreeNode], partial: tuple[TreeNode, int] | None) -> _Plan:
        """The plan of an insert along its walk (``path``, ``partial``), changing nothing."""
        walked = path if partial is None else [*path, partial[0]]
        start = keep = num_keep = 0
        revive = []
        last = len(walked) - 1
        for i, node in enumerate(walked):
            length = partial[1] if i == last and partial is not None else node.num_tokens
            if node.device is not None:  # device nodes are closed under parent: they come first
                num_keep, keep = i + 1, start + length
            elif node.pending is not None:  # a load is bringing it back
                return _Plan(walked[:i + 1], keep, num_keep, revive, start, True)
            else:
                revive.append((i, start, start + length))
            start += length
        return _Plan(walked, keep, num_keep, revive, start, False)

    def _insert_frees(self, plan: _Plan, slots: np.ndarray, matched: torch.Tensor | None,
                      partial: tuple[TreeNode, int] | None) -> np.ndarray:
        """Check the caller's slots against the plan; returns the ones to free.

        Args:
            matched: the device slots the continued `match_prefix` returned (still the
                tree's: nothing changed since), or ``None``.
        Raises:
            ValueError: a rule of the module docstring broken (before anything changes).
        """
        k, ps = plan.keep, self.page_size
        if matched is not None and matched.numel() == k:
            own = matched.numpy()
        elif k:
            parts = [n.device for n in plan.walked[:plan.num_keep]]
            if partial is not None and plan.num_keep == len(plan.walked):
                parts[-1] = parts[-1][:partial[1]]
            own = (torch.cat(parts) if len(parts) > 1 else parts[0]).numpy()
        else:
            own = slots[:0]
        stop = plan.stop if plan.drop else slots.size  # slots of revive and new segments end here
        if fastpath.same_bytes(own, slots[:k]):  # the common case: the tree's own slots, valid by construction
            cand = []
            pages = fastpath.fresh_pages(slots, k, stop, ps, self.device_pool.allocator.owned_mask(), self._held)
            if pages is None:  # not the fast case: check the rest the long way (names what is wrong)
                pages = allocated_pages(self.device_pool.allocator, torch.from_numpy(slots[k:]), "device_slots")
                self._refuse_held(pages[:(stop - k) // ps])
        else:  # the cached prefix given as other slots: check them all
            pages = allocated_pages(self.device_pool.allocator, torch.from_numpy(slots), "device_slots")
            mine = pages[:k // ps]
            cand = [mine[mine != own[::ps] // ps]]
            pages = pages[k // ps:]
            self._refuse_held(pages[:(stop - k) // ps])
        if plan.drop:
            cand.append(pages[(stop - k) // ps:])
        if not cand:
            return slots[:0]
        cand = np.concatenate(cand) if len(cand) > 1 else cand[0]
        held = self._held_pages(cand)
        return self.device_pool.allocator.page_slots(cand if held is None else cand[~held])  # only provable duplicates go back

    def _refuse_held(self, pages: np.ndarray) -> None:
        """Raise if a page the caller gives for a revive or new segment is already held."""
        held = self._held_pages(pages)
        if held is not None:
            first = int(pages[held][0]) * self.page_size
            raise ValueError(f"device_slots: slot {first} (and its page) is the tree's own slot for other tokens "
                             "(of this prefix or another); pass the tree's slots at their positions "
                             "(match_prefix) or fresh ones")

    # ---- what the tree holds ---------------------------------------------------------
    def _hold(self, slots: np.ndarray, delta: int) -> None:
        """Count device anchor pages of ``slots`` (the tree's own: whole, distinct) as
        taken (+1: a node or a load in flight) or given back (-1)."""
        fastpath.hold(slots, self.page_size, self._held, delta)

    def _held_pages(self, pages: np.ndarray) -> np.ndarray | None:
        """Mask of ``pages`` some node or load in flight holds, or ``None`` when none is (the
        common case, one lookup). A load of a rolled-back batch whose failed ack is not
        polled yet holds nothing (its slots are free again)."""
        counts = self._held[pages]
        if not np.count_nonzero(counts):
            return None
        rolled_back = self.ctrl.rolled_back_ops()
        gone = [rec.dst[self.anchor].numpy() for op, rec in self._pending.items()
                if op in rolled_back and rec.kind == "load" and self.anchor in rec.dst]
        if gone:
            ps = self.page_size
            counts = counts - np.isin(pages, np.concatenate(gone)[::ps] // ps)
        held = counts > 0
        return held if held.any() else None

    # ---- apply ---------------------------------------------------------------------
    def _apply_insert(self, plan: _Plan, partial, kb: bytes, slots: np.ndarray
                      ) -> tuple[list[TreeNode], bool]:
        """Carry out the plan; (path, reached the end of the key)."""
        path = plan.walked
        if partial is not None and len(path) and path[-1] is partial[0]:
            path = [*path[:-1], self._split(*partial)]
        for i, start, end in plan.revive:
            node = path[i]
            node.device = self._take(slots[start:end])
            self.device_tier.leaves.add(node)
            self.counters["revived_tokens"] += end - start
            self._epoch += 1
        if plan.drop:
            return path, path[-1].end << 3 == len(kb)
        if plan.stop < slots.size:
            parent = path[-1] if path else self.root
            node = TreeNode(key=kb[plan.stop << 3:], end=slots.size, parent=parent,
                            device=self._take(slots[plan.stop:]))
            parent.children[node.key[:self._page_bytes]] = node
            self.device_tier.leaves.add(node)
            path = [*path, node]
        return path, True

    def _take(self, slots: np.ndarray) -> torch.Tensor:
        """A node's own copy of caller slots, counted as held."""
        self._hold(slots, 1)
        return torch.from_numpy(slots.copy())
