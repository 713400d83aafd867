"""Slot arguments at the controller's edge: coercion and the checks made once per call.

Slots a server passes (``write(device_indices)``, ``load(host_indices)``) may be int
tensors on the CPU, lists or numpy arrays; they come back as int64 CPU tensors. CUDA
tensors are refused: reading their values (to validate them and derive rows) would
synchronize the device in the middle of the scheduler's step.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from hicache.slot_arrays import fresh_pages
from host_pools.allocator import PageAllocator
from host_pools.spec import Stack, slots_to_rows


def as_slots(value: Any, what: str) -> torch.Tensor:
    """``value`` as a 1-D int64 CPU tensor of its own (never the caller's tensor: a
    caller that reuses its buffer after queueing cannot change what was checked).

    Args:
        value: a 1-D integer tensor on the CPU, a sequence of ints or an integer numpy array.
        what: the argument's name for error messages (``"host_indices"``).

    Raises:
        ValueError: a CUDA tensor, a non-integer dtype (bool and floats included), or not 1-D.
        TypeError: something that is not a tensor, array or sequence.
    """
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ValueError(f"{what}: must be a CPU tensor, got one on {value.device} (reading "
                             f"device slots would synchronize the device; pass a CPU copy)")
        if value.dtype == torch.bool or value.dtype.is_floating_point or value.dtype.is_complex:
            raise ValueError(f"{what}: dtype must be an integer type, got {value.dtype}")
        tensor = value
    else:
        if not isinstance(value, (list, tuple, np.ndarray)):
            raise TypeError(f"{what}: must be a tensor, numpy array or sequence of ints, "
                            f"got {type(value).__name__}")
        arr = np.asarray(value)
        if arr.size == 0:
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"{what}: must hold integers, got dtype {arr.dtype}")
        tensor = torch.from_numpy(arr.astype(np.int64, copy=arr is value))  # never the caller's array
    if tensor.dim() != 1:
        raise ValueError(f"{what}: must be 1-D, got shape {tuple(tensor.shape)}")
    if tensor is value:  # the caller's own tensor: a copy (int64, contiguous)
        return value.clone(memory_format=torch.contiguous_format) if value.dtype == torch.int64 \
            else value.to(torch.int64)
    return tensor


def check_pages(slots: torch.Tensor, unit: int, num_slots: int, what: str) -> None:
    """Whole aligned runs of ``unit`` slots, all in ``[0, num_slots)``.

    Raises:
        ValueError: naming ``what``, the unit and the range.
    """
    slots_to_rows(slots, unit, what=f"{what} (whole pages of {unit})")
    arr = slots.numpy()
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= num_slots):
        raise ValueError(f"{what}: slots must be in [0, {num_slots}), got "
                         f"[{int(arr.min())}, {int(arr.max())}]")


def check_owned(alloc: PageAllocator, slots: torch.Tensor, what: str,
                why: str = "never handed out, or freed") -> np.ndarray:
    """The pages of ``slots``, which must be allocated (and not repeated) in ``alloc``.

    Raises:
        ValueError: a page is free (never handed out, or already freed) or repeated.
    """
    arr = slots.numpy()
    if arr.flags.c_contiguous:  # ascending whole pages (what allocators hand out): one pass
        pages = fresh_pages(arr, 0, 0, alloc.page_size, alloc.owned_mask(), None)
        if pages is not None:
            return pages
    pages = _scattered_pages(arr, alloc)  # whole pages in any order (a prefix's host pages)
    if pages is not None:
        return pages
    try:  # anything else: the allocator's full check names what is wrong
        pages = alloc.pages_of(slots)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    if not alloc.owns_pages(pages):
        raise ValueError(f"{what}: slots that are not allocated ({why})")
    return pages


def _scattered_pages(arr: np.ndarray, alloc: PageAllocator) -> np.ndarray | None:
    """The pages of ``arr`` when it is whole aligned pages, in range, distinct and all
    allocated, in any order; ``None`` otherwise (the slow path then names what is wrong)."""
    ps = alloc.page_size
    if not arr.size or arr.size % ps:
        return None
    pages = arr[::ps] // ps
    if ps > 1 and arr.tobytes() != (pages[:, None] * ps + np.arange(ps, dtype=np.int64)).tobytes():
        return None
    few = pages.tolist()  # a few pages: Python beats numpy's per-call cost
    if min(few) < 0 or max(few) >= alloc.num_pages or len(set(few)) != len(few):
        return None
    if np.count_nonzero(alloc.owned_mask()[pages]) != pages.size:
        return None
    return pages


def edge_slots(stack: Stack, anchor: Any, extra: Mapping[str, Any] | None,
               what: str) -> dict[str, torch.Tensor]:
    """The own-indexed slots of one ``write``/``load`` call, keyed by pool, empty ones dropped.

    Raises:
        ValueError: a pool in ``extra`` that is not own-indexed (or is the anchor), bad
            slots (see :func:`as_slots`), or nothing to transfer at all.
        TypeError: ``extra`` is not a mapping, or slots of an unsupported type.
    """
    own, anchor_name = stack.own_names, stack.anchor.name
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"extra: must be a mapping of pool name to slots, got {type(extra).__name__}")
    slots = {anchor_name: as_slots(anchor, what)} if anchor is not None else {}
    for name, s in (extra or {}).items():
        if name not in own or name == anchor_name:
            raise ValueError(f"extra: {name!r} is not an own-indexed pool other than the anchor; "
                             f"allowed: {sorted(own - {anchor_name})}")
        slots[name] = as_slots(s, f"extra[{name!r}]")
    slots = {n: s for n, s in slots.items() if s.numel()}
    if not slots:
        raise ValueError(f"{what}: nothing to transfer (empty anchor slots and no extra)")
    return slots


def requests_of(requests: Any) -> list[tuple[Any, Any]]:
    """``requests`` as a list of ``(slots, extra)`` pairs (``TypeError`` naming the bad one)."""
    if not isinstance(requests, (list, tuple)):
        raise TypeError(f"requests: must be a list of (slots, extra) pairs, got {type(requests).__name__}")
    for i, req in enumerate(requests):
        if not isinstance(req, tuple) or len(req) != 2:
            raise TypeError(f"requests[{i}]: must be a (slots, extra) pair, got {type(req).__name__}")
    return list(requests)


def label(what: str, pool: str) -> str:
    """An argument's name in errors: ``host_indices (pool 'kv')``."""
    return f"{what} (pool {pool!r})"
