"""Slot arguments at the controller's edge: coercion and the checks made once per call.

Slots a server passes (``write(device_indices)``, ``load(host_indices)``) may be int
tensors on the CPU, lists or numpy arrays; they come back as int64 CPU tensors. CUDA
tensors are refused: reading their values (to validate them and derive rows) would
synchronize the device in the middle of the scheduler's step.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Container, Mapping, NamedTuple, Sequence

import numpy as np
import torch

from host_pools.allocator import PageAllocator
from host_pools.spec import Stack, slots_to_rows
from hicache import fastpath

log = logging.getLogger(__name__)


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
        pages = fastpath.fresh_pages(arr, 0, 0, alloc.page_size, alloc.owned_mask(), None)
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


_OFFSETS: dict[int, np.ndarray] = {}


def _scattered_pages(arr: np.ndarray, alloc: PageAllocator) -> np.ndarray | None:
    """The pages of ``arr`` when it is whole aligned pages, in range, distinct and all
    allocated, in any order; ``None`` otherwise (the slow path then names what is wrong)."""
    ps = alloc.page_size
    if not arr.size or arr.size % ps:
        return None
    pages = arr[::ps] // ps
    if ps > 1:
        offsets = _OFFSETS.get(ps)
        if offsets is None:
            offsets = _OFFSETS[ps] = np.arange(ps, dtype=np.int64)
        if arr.tobytes() != (pages[:, None] * ps + offsets).tobytes():
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


def alloc_all(src: Mapping[str, torch.Tensor], alloc: Callable, free: Callable,
              coerce: Container[str] | None = None) -> dict[str, torch.Tensor] | None:
    """``alloc(name, n)`` for every pool of ``src``, all or nothing.

    Args:
        coerce: pools whose allocator is not trusted to return int64 CPU tensors: their
            slots go through :func:`as_slots`; ``None`` means every pool.
    Returns:
        The slots per pool (int64 CPU tensors), or ``None`` when one allocator is short
        (everything taken so far is given back first).
    Raises:
        Whatever an allocator raises, or ValueError for slots of a bad type it handed out;
        everything taken so far is given back first.
    """
    taken: dict[str, Any] = {}
    try:
        for name, slots in src.items():
            got = alloc(name, slots.numel())
            if got is None:
                free_all(taken, free)
                return None
            taken[name] = got
        for name in [n for n in taken if coerce is None or n in coerce]:
            taken[name] = as_slots(taken[name], f"allocated slots of {name!r}")
        return taken
    except BaseException:  # an allocator raised (or returned junk): give back the rest
        free_all(taken, free)
        raise


def free_all(taken: Mapping[str, Any], free: Callable) -> list[str]:
    """``free(name, slots)`` for every entry even if some raise; returns those errors
    (each also logged): a rollback must give back everything it can."""
    errors = []
    for name, slots in taken.items():
        try:
            free(name, slots)
        except Exception as exc:  # keep freeing the others; the caller reports these
            errors.append(f"free of {name!r} raised {type(exc).__name__}: {exc}")
            log.error("hicache: %s", errors[-1])
    return errors


class OwnPages(NamedTuple):
    """Destination pages of several ops taken with one allocator call per pool."""

    slots: list[dict[str, torch.Tensor]]  # per op: its slots per pool (views of ``merged``)
    stamps: list[dict[str, tuple[np.ndarray, np.ndarray]]]  # per op: (pages, generations)
    merged: dict[str, torch.Tensor]  # per pool: every op's slots, op after op


def alloc_pages_many(allocators: Mapping[str, PageAllocator], srcs: Sequence[Mapping[str, torch.Tensor]],
                     label: Callable[[int, str], str], tier: str) -> OwnPages | None:
    """Whole pages for every op of ``srcs`` (source slots per pool): ONE ``alloc_pages``
    per pool for all ops together, split op after op, all or nothing.

    The pages of one call ascend, so every op's share ascends too, and its slots are a
    view of the pool's merged slots (the batch needs no further merge of them).

    Args:
        label: ``(op index, pool) -> argument name`` for errors.
        tier: ``"host"`` or ``"device"`` (for errors).
    Returns:
        The pages, or ``None`` when one pool is short (everything taken is given back).
    Raises:
        ValueError: an op's slots are not whole pages of the destination's page size
            (checked before anything is taken).
        Whatever an allocator raises, after everything taken so far is given back.
    """
    if len(srcs) == 1:
        return _alloc_one(allocators, srcs[0], label, tier)
    counts, totals = [], {}
    for i, src in enumerate(srcs):
        per = {}
        for name, slots in src.items():
            page = allocators[name].page_size
            per[name], rest = divmod(slots.numel(), page)
            if rest:
                raise ValueError(f"{label(i, name)}: {slots.numel()} slots are not whole {tier} "
                                 f"pages of {page}")
            totals[name] = totals.get(name, 0) + per[name]
        counts.append(per)
    taken: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    give_back = lambda n, got: allocators[n].free_pages(got[0])  # noqa: E731
    try:
        for name, total in totals.items():
            got = allocators[name].alloc_pages(total)
            if got is None:
                free_all(taken, give_back)
                return None
            taken[name] = got
    except BaseException:  # an allocator raised: give back what the others handed out
        free_all(taken, give_back)
        raise
    return _split(allocators, taken, counts)


def _alloc_one(allocators: Mapping[str, PageAllocator], src: Mapping[str, torch.Tensor],
               label: Callable[[int, str], str], tier: str) -> OwnPages | None:
    """:func:`alloc_pages_many` for one op (``write`` / ``load``: the hot path, lean)."""
    slots, taken = {}, {}
    try:
        for name, wanted in src.items():
            alloc = allocators[name]
            count, rest = divmod(wanted.numel(), alloc.page_size)
            got = None if rest else alloc.alloc_pages(count)
            if got is None:
                free_all(taken, lambda n, g: allocators[n].free_pages(g[0]))
                taken.clear()  # given back: the handler below must not free them again
                if rest:
                    raise ValueError(f"{label(0, name)}: {wanted.numel()} slots are not whole "
                                     f"{tier} pages of {alloc.page_size}")
                return None
            taken[name] = got
            slots[name] = torch.from_numpy(alloc.page_slots(got[0], ascending=True))
    except BaseException:  # an allocator raised: give back what the others handed out
        free_all(taken, lambda n, g: allocators[n].free_pages(g[0]))
        raise
    return OwnPages([slots], [taken], slots)


def _split(allocators: Mapping[str, PageAllocator], taken: Mapping[str, tuple[np.ndarray, np.ndarray]],
           counts: list[dict[str, int]]) -> OwnPages:
    """Each op's consecutive share of the pages taken per pool."""
    merged = {n: torch.from_numpy(allocators[n].page_slots(p, ascending=True)) for n, (p, _) in taken.items()}
    at = dict.fromkeys(taken, 0)
    slots, stamps = [], []
    for per in counts:
        op_slots, op_stamps = {}, {}
        for name, k in per.items():
            a, page = at[name], allocators[name].page_size
            pages, gens = taken[name]
            op_slots[name] = merged[name][a * page:(a + k) * page]
            op_stamps[name] = (pages[a:a + k], gens[a:a + k])
            at[name] = a + k
        slots.append(op_slots)
        stamps.append(op_stamps)
    return OwnPages(slots, stamps, merged)
