"""A caller's slots at the tree's edge: coercion, and the rules an insert checks before the tree changes.

    slots                     rule (a ValueError naming the argument, nothing changed)
    device_slots (anchor)     integers (TypeError otherwise), whole aligned pages in range,
                              no page twice, allocated by the device anchor allocator, and
                              none the tree holds already for other tokens (insert.py)
    extra[pool] (snapshot)    exactly the stack's state roots, the snapshot's size, whole
                              aligned rows in range, no row twice, allocated by the pool's
                              allocator, and none that a node or a load in flight holds —
                              but the snapshot the insert's own end node has, passed back

What the tree holds is a per-page count (`hicache.radix.tiers.SlotLedger`), so "held?" is
one lookup per page, never a walk. A load of a rolled-back batch whose failed ack is not
polled yet holds nothing (the controller freed its slots already).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import torch

from host_pools.allocator import PageAllocator, is_integer_dtype
from hicache.radix.node import TreeNode


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


def held_mask(counts: np.ndarray, pages: np.ndarray, gone: Callable[[], list[np.ndarray]],
              page_size: int) -> np.ndarray | None:
    """Mask of ``pages`` some node or load in flight holds (per-page ``counts``), or
    ``None`` when none is (the common case, one lookup); ``gone()``: slots of rolled-back
    loads not acked yet (they hold nothing), asked only when a page counts as held."""
    got = counts[pages]
    if not np.count_nonzero(got):
        return None
    gone = gone()
    if gone:
        got = got - np.isin(pages, np.concatenate(gone)[::page_size] // page_size)
    held = got > 0
    return held if held.any() else None


class SnapshotCheck:
    """The rules on an insert's ``extra`` (module docstring), for one tree.

    Args:
        device_pools: the device pools by name (each state root allocates).
        state_sizes: slots of one snapshot per state root.
        state_held: per state root, the per-page counts of what the tree holds.
        gone: ``gone(pool)`` -> slots of rolled-back loads not acked yet.
    """

    def __init__(self, device_pools: Mapping[str, Any], state_sizes: Mapping[str, int],
                 state_held: Mapping[str, np.ndarray], gone: Callable[[str], list[np.ndarray]]) -> None:
        self.device_pools, self.state_sizes, self.state_held, self.gone = device_pools, state_sizes, state_held, gone

    def coerce(self, extra: Mapping[str, Any] | None, num_tokens: int) -> dict[str, torch.Tensor]:
        """The snapshot as CPU int64 tensors keyed by state root ({} for none), checked
        for pools, size, rows and allocation (not yet for being held).

        Raises:
            TypeError / ValueError: a rule broken (naming ``extra[pool]``).
        """
        if not extra:
            return {}
        if set(extra) != set(self.state_sizes):
            raise ValueError(f"extra: must name exactly the snapshot pools {sorted(self.state_sizes)}, "
                             f"got {sorted(extra)}")
        if num_tokens == 0:
            raise ValueError("extra: the empty prefix cannot take a snapshot")
        out = {}
        for name, value in extra.items():
            what = f"extra[{name!r}]"
            slots = as_slots(value, what)
            if slots.dim() != 1 or slots.numel() != self.state_sizes[name]:
                raise ValueError(f"{what}: a snapshot is {self.state_sizes[name]} slots, got shape {tuple(slots.shape)}")
            allocated_pages(self.device_pools[name].allocator, slots, what)
            out[name] = slots
        return out

    def refuse_held(self, snap: Mapping[str, torch.Tensor], end_node: TreeNode | None) -> None:
        """Raise if a snapshot slot is held by the tree, unless it is ``end_node``'s own
        snapshot for that pool passed back whole (the node at the insert's end, if it exists).

        Raises:
            ValueError: naming ``extra[pool]`` and the first held slot.
        """
        own = end_node._state_device if end_node is not None else None
        for name, slots in snap.items():
            allocator = self.device_pools[name].allocator
            ps = allocator.page_size
            pages = slots.numpy()[::ps] // ps
            held = held_mask(self.state_held[name], pages, lambda: self.gone(name), ps)
            if held is None or (own is not None and torch.equal(own[name], slots)):
                continue
            first = int(pages[held][0]) * ps
            raise ValueError(f"extra[{name!r}]: slot {first} (and its row) is held by the tree (another "
                             "node's snapshot, or a load in flight); pass fresh slots, or the node's own "
                             "snapshot at its own boundary")
