"""`PageAllocator`: a thread-safe free list of page-aligned token slots.

Slots come in pages of ``page_size`` consecutive slots; page ``p`` owns slots
``[p * page_size, (p + 1) * page_size)``. The free pages sit on a stack (a numpy
array plus a top pointer) and an ownership bitmap catches double frees, so both
``alloc`` and ``free`` cost O(slots touched), never O(pool size).

    page state:   FREE --alloc (generation += 1)--> OWNED --free--> FREE
                    ^                                  |
                    +--- (free of a FREE page: ValueError, nothing changes)
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from host_pools.compiled import load

# the free stack's compiled core (setup.py builds it; without it, the numpy code below)
_pages = load("host_pools._pages", [Path(__file__).with_name("_pages.c")])

_FEW_PAGES = 64  # up to this many pages, range and repeat checks run on a Python list


class PageAllocator:
    """Free list over ``num_slots`` token slots handed out in whole pages.

    Args:
        num_slots: slots managed; must be a positive multiple of ``page_size``.
        page_size: slots per page (1 for row allocators).
    Raises:
        TypeError: a size that is not an int (a tensor, a float, a bool).
        ValueError: ``page_size`` < 1, or ``num_slots`` negative or not a multiple of it.

    Thread-safe: every public method takes the allocator's lock.
    """

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        num_slots, page_size = _count(num_slots), _count(page_size, "page_size")
        if page_size < 1:
            raise ValueError(f"page_size: must be >= 1, got {page_size}")
        if num_slots < 0 or num_slots % page_size:
            raise ValueError(f"num_slots: must be a non-negative multiple of page_size={page_size}, got {num_slots}")
        self.num_slots = int(num_slots)
        self.page_size = int(page_size)
        self.num_pages = self.num_slots // self.page_size
        self._lock = threading.Lock()
        # Lowest pages on top so a fresh allocator hands out ascending, contiguous runs.
        self._stack = np.arange(self.num_pages - 1, -1, -1, dtype=np.int64)
        self._top = self.num_pages
        # Below this position the stack still holds its first order (never popped since):
        # the top pages there form one ascending run never handed out (generation 0).
        self._fresh = self.num_pages
        self._owned = np.zeros(self.num_pages, dtype=np.bool_)
        # Bumped on every alloc of a page: a holder that remembers a page's generation
        # can tell when it was freed and handed out again behind its back.
        self._generation = np.zeros(self.num_pages, dtype=np.int64)
        self._offsets = np.arange(self.page_size, dtype=np.int64)

    def available(self) -> int:
        """Free slots (a multiple of ``page_size``)."""
        return self._top * self.page_size

    def used(self) -> int:
        return self.num_slots - self.available()

    def alloc(self, num_slots: int) -> torch.Tensor | None:
        """Take ``num_slots`` slots (whole pages, ascending within the call).

        Returns:
            int64 CPU tensor of slots, or ``None`` when fewer are free (nothing changes).
        Raises:
            TypeError: ``num_slots`` not a Python or numpy integer (a tensor, a float, a bool).
            ValueError: ``num_slots`` negative or not a multiple of ``page_size``.
        """
        num_slots = _count(num_slots)
        if num_slots < 0 or num_slots % self.page_size:
            raise ValueError(f"num_slots: must be a non-negative multiple of page_size={self.page_size}, "
                             f"got {num_slots}")
        got = self.alloc_page_slots(num_slots // self.page_size)
        return None if got is None else torch.from_numpy(got[2])

    def alloc_pages(self, num_pages: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Take ``num_pages`` whole pages (ascending) for a holder that keeps page records.

        Args:
            num_pages: a non-negative int (not checked again: `alloc` checks a caller's count).
        Returns:
            ``(pages, generations)``: the page numbers and each page's allocation generation
            after this allocation; ``None`` when fewer are free (nothing changes).
        """
        with self._lock:
            top = self._top
            if num_pages > top:
                return None
            if _pages is not None:  # one pass in C: the same pages and generations
                return self._take(num_pages, 0)[:2]
            if top <= self._fresh and num_pages:  # never handed out yet: the next run, no reads
                first = self.num_pages - top
                self._top = top - num_pages
                run = slice(first, first + num_pages)
                self._owned[run] = True
                self._generation[run] = 1
                gens = np.empty(num_pages, np.int64)
                gens.fill(1)  # np.ones is a Python-level call: twice the cost
                return np.arange(first, first + num_pages, dtype=np.int64), gens
            if num_pages == 1:  # one page (a state pool's, a short load's): Python ints
                page = int(self._stack[top - 1])
                self._top = top - 1
                self._owned[page] = True
                gen = int(self._generation[page]) + 1
                self._generation[page] = gen
                return np.array((page,), np.int64), np.array((gen,), self._generation.dtype)
            pages = self._stack[top - num_pages:top][::-1]  # the top of the stack first
            if 1 < num_pages <= _FEW_PAGES:  # a few: Python lists beat numpy's per-call cost
                few = pages.tolist()
                if few[-1] - few[0] == num_pages - 1 and few == list(range(few[0], few[-1] + 1)):
                    pages = np.arange(few[0], few[-1] + 1, dtype=np.int64)  # one run, in order
                else:
                    pages = np.array(sorted(few), dtype=np.int64)
            elif num_pages > 1 and np.count_nonzero(pages[1:] <= pages[:-1]):  # pushed in order: usually not
                pages = np.sort(pages)
            else:
                pages = pages.copy()
            self._top = top - num_pages
            first = int(pages[0]) if num_pages else 0
            if num_pages and int(pages[-1]) - first == num_pages - 1:  # one run (a fresh pool): slices
                run = slice(first, first + num_pages)
                self._owned[run] = True
                gens = self._generation[run] + 1
                self._generation[run] = gens
                return pages, gens
            self._owned[pages] = True
            gens = self._generation[pages] + 1  # the pages are distinct: one gather, one scatter
            self._generation[pages] = gens
            return pages, gens

    def alloc_page_slots(self, num_pages: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """`alloc_pages` and the pages' slots (`page_slots` of them) in one call: for a
        holder that keeps page records and hands out slots (the controller's destinations).

        Returns:
            ``(pages, generations, slots)``, or ``None`` when fewer pages are free (nothing changes).
        """
        if _pages is None or self.page_size == 1:  # a page is a slot: the pages are the slots
            got = self.alloc_pages(num_pages)
            return None if got is None else (*got, self._pages_to_slots(got[0], ascending=True))
        with self._lock:  # `alloc_pages`'s compiled take, the slots written in the same pass
            return None if num_pages > self._top else self._take(num_pages, self.page_size)

    def _take(self, num_pages: int, slots_of: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The compiled take of ``num_pages`` (at most the top; the lock held): (pages,
        generations, their slots when ``slots_of`` is the page size, else empty), views of
        one array."""
        n, top = num_pages, self._top
        out = np.empty(n * (2 + slots_of), np.int64)
        _pages.take(self._stack, top, self._owned, self._generation, out, *((slots_of,) if slots_of else ()))
        self._top = top - n
        return out[:n], out[n:2 * n], out[2 * n:]

    def page_slots(self, pages: np.ndarray, ascending: bool = False) -> np.ndarray:
        """The slots of ``pages`` (page numbers, e.g. from `alloc_pages` or `pages_of`), in
        order; ``ascending``: they strictly ascend (an `alloc_pages` result), so one run of
        pages becomes one range of slots."""
        return self._pages_to_slots(pages, ascending)

    def free(self, slots: torch.Tensor) -> int:
        """Return slots to the free list.

        Returns:
            The number of slots freed.
        Raises:
            ValueError: slots not 1-D integers, not whole aligned pages, out of range,
                repeated, or not currently owned (double free). Nothing changes then.
        """
        pages = self.pages_of(slots)
        try:
            return self.free_pages(pages)
        except ValueError as exc:
            raise ValueError(f"slots: {str(exc).removeprefix('pages: ')}") from None

    def free_pages(self, pages: np.ndarray) -> int:
        """Return whole pages a holder took from this allocator (its own records: ``pages_of``
        output, distinct and in range, so they are not checked again); a page that is not
        allocated still raises, and nothing changes then.

        Returns:
            The number of slots freed.
        Raises:
            ValueError: a page that is not currently allocated (double free).
        """
        with self._lock:
            top = self._top
            if _pages is not None and pages.dtype == np.int64 and pages.flags.c_contiguous:
                new_top = _pages.give(self._stack, top, self._owned, pages)  # -1: a page not allocated
            else:
                new_top = -1 if np.count_nonzero(self._owned[pages]) != pages.size else top + pages.size
                if new_top >= 0:
                    self._owned[pages] = False
                    self._stack[top:new_top] = pages[::-1]
            if new_top < 0:
                bad = self._unowned(pages)[:4] * self.page_size
                raise ValueError(f"pages: double free (or never allocated) of slots starting at {bad.tolist()}")
            self._fresh = min(self._fresh, top)
            self._top = new_top
        return int(pages.size * self.page_size)

    def is_owned(self, slots: torch.Tensor) -> bool:
        """True when every page of ``slots`` is currently allocated."""
        return self.owns_pages(self.pages_of(slots))

    def owns_pages(self, pages: np.ndarray) -> bool:
        """True when every page in ``pages`` (from ``pages_of``) is currently allocated."""
        with self._lock:
            return np.count_nonzero(self._owned[pages]) == pages.size

    def owned_mask(self) -> np.ndarray:
        """The live per-page "allocated" flags, for a holder's fast membership checks:
        read it, never write it. Read without the lock (a check followed by a use is not
        atomic with the lock either)."""
        return self._owned

    def generations(self, pages: np.ndarray) -> np.ndarray:
        """How many times each page in ``pages`` (from ``pages_of``) has been allocated (a copy)."""
        with self._lock:
            return self._generation[pages]

    def unowned_pages(self, pages: np.ndarray) -> np.ndarray:
        """The pages in ``pages`` (from ``pages_of``) that are free, in their order."""
        with self._lock:
            return self._unowned(pages)

    def _unowned(self, pages: np.ndarray) -> np.ndarray:
        return pages[~self._owned[pages]]

    def pages_of(self, slots: torch.Tensor, what: str = "slots") -> np.ndarray:
        """Validated page numbers of ``slots`` (aligned, in range, no repeats).

        Args:
            what: the argument name errors start with.
        Raises:
            ValueError: not a 1-D tensor of an integer dtype (bool, float and complex are
                refused, never cast), unaligned, out of range, or a page twice.
        """
        if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or not is_integer_dtype(slots.dtype):
            got = f"{slots.dtype} tensor of shape {tuple(slots.shape)}" if isinstance(slots, torch.Tensor) \
                else type(slots).__name__
            raise ValueError(f"{what}: need a 1-D integer tensor, got a {got}")
        if slots.dtype != torch.int64 or slots.device.type != "cpu":
            slots = slots.detach().to("cpu", torch.int64)
        arr = slots.numpy()
        ps = self.page_size
        if arr.size % ps:
            raise ValueError(f"{what}: must be whole pages of {ps} slots, got length {arr.size}")
        pages = arr
        if ps > 1:  # page p is the run p*ps .. p*ps+ps-1: the slots must be exactly those runs
            pages = arr[::ps] // ps
            if not (arr.reshape(-1, ps) == pages[:, None] * ps + self._offsets).all():
                raise ValueError(f"{what}: must be whole pages of {ps} aligned, consecutive slots")
        if pages.size <= _FEW_PAGES:  # Python beats numpy's per-call cost on a few pages
            few = pages.tolist()
            out_of_range = bool(few) and (min(few) < 0 or max(few) >= self.num_pages)
            repeats = len(set(few)) != len(few)
        else:
            out_of_range = bool(pages.min() < 0 or pages.max() >= self.num_pages)
            repeats = _has_repeats(pages)
        if out_of_range:
            raise ValueError(f"{what}: values must be in [0, {self.num_slots}), "
                             f"got min {arr.min()} max {arr.max()}")
        if repeats:
            raise ValueError(f"{what}: the same page appears twice in one call")
        return pages

    def _pages_to_slots(self, pages: np.ndarray, ascending: bool = False) -> np.ndarray:
        """Slots of ``pages`` in order; ``ascending``: the pages strictly ascend (an
        allocation's), so equal endpoints mean one run, one range of slots."""
        if self.page_size == 1:
            return pages
        if ascending and pages.size:
            first, last = int(pages[0]), int(pages[-1])  # Python ints: no numpy scalar arithmetic
            if last - first == pages.size - 1:
                return np.arange(first * self.page_size, (last + 1) * self.page_size, dtype=np.int64)
        return (pages[:, None] * self.page_size + self._offsets).reshape(-1)

    def check_integrity(self) -> None:
        """Raise ``RuntimeError`` if free + used != total or a page is both free and owned."""
        with self._lock:
            free = self._stack[:self._top]
            n_owned = int(self._owned.sum())
            n_free = int(free.size)
            if n_owned + n_free != self.num_pages:
                raise RuntimeError(f"allocator: {n_free=} + {n_owned=} != num_pages={self.num_pages}")
            if self._owned[free].any() or _has_repeats(free):
                raise RuntimeError("allocator: a free page is owned or listed twice")


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """True for torch's integer dtypes; False for bool, floating and complex ones."""
    return dtype != torch.bool and not dtype.is_floating_point and not dtype.is_complex


def _count(value: object, what: str = "num_slots") -> int:
    """``value`` as an int; a 0-d tensor, a float or a bool is a caller's mistake (TypeError)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what}: need an int, got {type(value).__name__} {value!r}")
    return int(value)


def _has_repeats(values: np.ndarray) -> bool:
    """True if any value occurs twice (a sort beats np.unique several times over here)."""
    ordered = np.sort(values)
    return bool((ordered[1:] == ordered[:-1]).any())
