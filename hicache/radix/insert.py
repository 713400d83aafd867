"""`Inserter`: `HiRadixCache.insert` — the caller's slots checked and the walk planned before the tree changes.

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
Rules on ``device_slots`` and ``extra`` (a ValueError naming the argument, and the tree
and allocators unchanged): `hicache.radix.slotcheck`; no slot of a revive or new segment
may be one the tree already holds (for this prefix or another: it would hold it twice),
nor a snapshot slot another node or a load in flight holds. When the cached prefix is
given as the tree's own slots (the common case), only the rest is checked, at a cost
proportional to the rest: the tree's slots are valid by construction. The slots a match
returned are the caller's (never a node's tensor); the match keeps them as a hint only
(`hicache.radix.index`): the keep segments always take the tree's own slots, and a
caller page is freed only when no node holds it.

Only *provable duplicates* are freed: candidates no node and no load in flight holds.
The tree's own slots passed back in another order are kept, never freed.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, NamedTuple

import numpy as np
import torch

from hicache import slot_arrays
from hicache.radix.index import Partial, RadixIndex
from hicache.radix.node import InsertResult, TreeNode, as_key
from hicache.radix.policies import LRU, EvictionPolicy
from hicache.radix.slotcheck import SnapshotCheck, allocated_pages, held_mask, slots_array
from hicache.radix.tiers import SlotLedger
from hicache.radix.transfers import Transfers


class _Plan(NamedTuple):
    """Where an insert's key goes (module docstring), found before anything changes."""

    walked: list  # the nodes matched, in order (a partly matched one last, before its split)
    keep: int  # tokens [0, keep) stay on the tree's device slots (the first num_keep nodes)
    num_keep: int
    revive: list  # (index into walked, start, end) of host-only nodes taking the caller's slots
    stop: int  # tokens [stop, len): a new leaf, or (drop) candidates to free
    drop: bool  # walked[-1] has a load in flight: nothing may hang below it


class Inserter:
    """`insert` of `HiRadixCache`: checks, the plan, and applying it (scheduler thread).

    Args:
        index, ledger, transfers: the node structure, the tiers' slots, the transfers
            (loads in flight; the write policy's backups).
        device_pools: the device pools by name; counters: the tree's counters.
        policy: the eviction policy (hears of new nodes and revived device copies).
    """

    def __init__(self, index: RadixIndex, ledger: SlotLedger, transfers: Transfers,
                 device_pools: Mapping[str, Any], counters: Counter, policy: EvictionPolicy | None = None) -> None:
        self.index, self.ledger, self.transfers, self.counters = index, ledger, transfers, counters
        self.policy = LRU() if policy is None else policy
        self.page_size, self.device_pools = index.page_size, device_pools
        self.device_pool = ledger.device_pool
        self.snapshots = SnapshotCheck(device_pools, ledger.state_sizes, ledger.state_held,
                                       transfers.rolled_back_loads)

    def insert(self, token_ids: Any, device_slots: Any,
               extra: Mapping[str, torch.Tensor] | None = None) -> InsertResult:
        """`HiRadixCache.insert` (its docstring says what it does and raises)."""
        key = as_key(token_ids, self.page_size, strict=True)
        slots = np.ascontiguousarray(slots_array(device_slots, "device_slots"))
        if slots.ndim != 1 or slots.size != key.size:
            raise ValueError(f"device_slots: need {key.size} slots (one per token), got shape {tuple(slots.shape)}")
        snap = self.snapshots.coerce(extra, key.size) if extra else {}
        path, partial, matched = self.index.continue_walk(key)
        if partial is None and matched is not None and matched.size == (path[-1].end if path else 0):
            # the continued match reached the last node on the device, and nothing changed
            # since: every node is kept (what _plan_insert would find, without the loop)
            plan = tuple.__new__(_Plan, (path, matched.size, len(path), [], matched.size, False))  # no Python __new__
        else:
            plan = self._plan_insert(path, partial)
        to_free = self._insert_frees(plan, slots, matched, partial)  # raises before anything changes
        end = None  # the node ending at the key's end before the insert, if any
        if snap:
            end = path[-1] if partial is None and path and path[-1].end == key.size else None
            self.snapshots.refuse_held(snap, end)  # raises before anything changes
        path, complete = self._apply_insert(plan, partial, key, slots)
        if to_free is not None:
            self.device_pool.free(torch.from_numpy(to_free))
        last = path[-1] if path else self.index.root
        if snap:
            self._attach_snapshot(last, snap, complete, end)
        index = self.index
        index.clock += 1
        index.read.touch(path, index.clock, True)  # touched (LRU) and counted (hit_count) in one pass
        self.transfers.backup_path(path)
        return tuple.__new__(InsertResult, (plan.keep, last))  # the named tuple without its Python __new__

    def _attach_snapshot(self, node: TreeNode, snap: dict[str, torch.Tensor], complete: bool,
                         end: TreeNode | None) -> None:
        """Give ``node`` (the insert's last) the caller's device snapshot, or free it when
        the insert stopped short, the node has one, has no device history or a load (which
        may bring one) is in flight. Slots equal to ``end``'s own snapshot (passed back)
        stay the tree's; any other slots were checked: no node holds them."""
        if complete and node._state_device is None and node._device is not None and not self.transfers.is_loading(node):
            self.ledger.give_snapshot(self.ledger.device, node, dict(snap))
            return
        own = end._state_device if end is not None else None
        for name, slots in snap.items():
            if own is None or not torch.equal(own[name], slots):
                self.device_pools[name].free(slots)

    # ---- plan ----------------------------------------------------------------------
    @staticmethod
    def _plan_insert(path: list[TreeNode], partial: Partial | None) -> _Plan:
        """The plan of an insert along its walk (``path``, ``partial``), changing nothing."""
        walked = path if partial is None else [*path, partial[0]]
        start = keep = num_keep = 0
        revive = []
        last = len(walked) - 1
        for i, node in enumerate(walked):
            length = partial[1] if i == last and partial is not None else node.num_tokens
            if node._device is not None:  # device nodes are closed under parent: they come first
                num_keep, keep = i + 1, start + length
            elif node.pending is not None:  # a load is bringing it back
                return _Plan(walked[:i + 1], keep, num_keep, revive, start, True)
            else:
                revive.append((i, start, start + length))
            start += length
        return _Plan(walked, keep, num_keep, revive, start, False)

    def _insert_frees(self, plan: _Plan, slots: np.ndarray, matched: np.ndarray | None,
                      partial: Partial | None) -> np.ndarray | None:
        """Check the caller's slots against the plan; returns the ones to free (or None).

        Args:
            matched: the tree's device slots along the kept match (nothing changed since),
                or ``None``.
        Raises:
            ValueError: a rule of the module docstring broken (before anything changes).
        """
        k, ps = plan.keep, self.page_size
        if matched is not None and matched.size == k:
            own = matched
        elif k:
            parts = [n._device for n in plan.walked[:plan.num_keep]]
            if partial is not None and plan.num_keep == len(plan.walked):
                parts[-1] = parts[-1][:partial[1]]
            own = (torch.cat(parts) if len(parts) > 1 else parts[0]).numpy()
        else:
            own = slots[:0]
        stop = plan.stop if plan.drop else slots.size  # slots of revive and new segments end here
        allocator = self.device_pool.allocator
        if slot_arrays.same_bytes(own, slots[:k]):  # the common case: the tree's own slots, valid by construction
            cand = []
            owned, held = allocator.owned_mask(), self.ledger.held
            if not plan.drop and slot_arrays.are_fresh(slots, k, stop, ps, owned, held):
                return None  # the rest is fresh and nothing is dropped: nothing to free
            pages = slot_arrays.fresh_pages(slots, k, stop, ps, owned, held) if plan.drop else None
            if pages is None:  # not the fast case: check the rest the long way (names what is wrong)
                pages = allocated_pages(allocator, torch.from_numpy(slots[k:]), "device_slots")
                self._refuse_held(pages[:(stop - k) // ps])
        else:  # the cached prefix given as other slots: check them all
            pages = allocated_pages(allocator, torch.from_numpy(slots), "device_slots")
            mine = pages[:k // ps]
            cand = [mine[mine != own[::ps] // ps]]
            pages = pages[k // ps:]
            self._refuse_held(pages[:(stop - k) // ps])
        if plan.drop:
            cand.append(pages[(stop - k) // ps:])
        if not cand:
            return None
        cand = np.concatenate(cand) if len(cand) > 1 else cand[0]
        held = self._held_pages(cand)
        cand = cand if held is None else cand[~held]  # only provable duplicates go back
        return allocator.page_slots(cand) if cand.size else None

    def _refuse_held(self, pages: np.ndarray) -> None:
        """Raise if a page the caller gives for a revive or new segment is already held."""
        held = self._held_pages(pages)
        if held is not None:
            first = int(pages[held][0]) * self.page_size
            raise ValueError(f"device_slots: slot {first} (and its page) is the tree's own slot for other tokens "
                             "(of this prefix or another); pass the tree's slots at their positions "
                             "(match_prefix) or fresh ones")

    def _held_pages(self, pages: np.ndarray) -> np.ndarray | None:
        """Mask of anchor ``pages`` some node or load in flight holds, or ``None``."""
        return held_mask(self.ledger.held, pages, lambda: self.transfers.rolled_back_loads(self.ledger.anchor),
                         self.page_size)

    # ---- apply ---------------------------------------------------------------------
    def _apply_insert(self, plan: _Plan, partial: Partial | None, key: np.ndarray, slots: np.ndarray
                      ) -> tuple[list[TreeNode], bool]:
        """Carry out the plan; (path, reached the end of the key)."""
        path = plan.walked
        if partial is not None and len(path) and path[-1] is partial[0]:
            path = [*path[:-1], self.index.split(*partial)]
        leaves = self.ledger.device.leaves
        for i, start, end in plan.revive:
            node = path[i]
            node._device = self.ledger.take(slots[start:end])
            leaves.add(node)
            self.counters["revived_tokens"] += end - start
            self.index.changed()
        if plan.revive:
            self.policy.regained("device", [path[i] for i, _, _ in plan.revive])
        if plan.drop:
            return path, path[-1].end == key.size
        if plan.stop < slots.size:
            parent = path[-1] if path else self.index.root
            # positional (key, end, parent, children, _device): keywords cost a third more
            node = TreeNode(key[plan.stop:].tobytes(), slots.size, parent, {}, self.ledger.take(slots[plan.stop:]))
            self.index.add_child(parent, node)
            self.policy.created(node)
            leaves.add(node)
            path = [*path, node]
        return path, True
