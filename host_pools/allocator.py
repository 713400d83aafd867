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

import numpy as np
import torch


class PageAllocator:
    """Free list over ``num_slots`` token slots handed out in whole pages.

    Args:
        num_slots: slots managed; must be a positive multiple of ``page_size``.
        page_size: slots per page (1 for row allocators).

    Thread-safe: every public method takes the allocator's lock.
    """

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
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
            ValueError: ``num_slots`` negative or not a multiple of ``page_size``.
        """
        if num_slots < 0 or num_slots % self.page_size:
            raise ValueError(f"num_slots: must be a non-negative multiple of page_size={self.page_size}, "
                             f"got {num_slots}")
        k = num_slots // self.page_size
        with self._lock:
            if k > self._top:
                return None
            pages = np.sort(self._stack[self._top - k:self._top])
            self._top -= k
            self._owned[pages] = True
            self._generation[pages] += 1
        return torch.from_numpy(self._pages_to_slots(pages))

    def free(self, slots: torch.Tensor) -> int:
        """Return slots to the free list.

        Returns:
            The number of slots freed.
        Raises:
            ValueError: slots not 1-D integers, not whole aligned pages, out of range,
                repeated, or not currently owned (double free). Nothing changes then.
        """
        pages = self.pages_of(slots)
        with self._lock:
            if not self._owned[pages].all():
                bad = pages[~self._owned[pages]][:4] * self.page_size
                raise ValueError(f"slots: double free (or never allocated) of slots starting at {bad.tolist()}")
            self._owned[pages] = False
            self._stack[self._top:self._top + pages.size] = pages[::-1]
            self._top += pages.size
        return int(pages.size * self.page_size)

    def is_owned(self, slots: torch.Tensor) -> bool:
        """True when every page of ``slots`` is currently allocated."""
        return self.owns_pages(self.pages_of(slots))

    def owns_pages(self, pages: np.ndarray) -> bool:
        """True when every page in ``pages`` (from ``pages_of``) is currently allocated."""
        with self._lock:
            return bool(self._owned[pages].all())

    def generations(self, pages: np.ndarray) -> np.ndarray:
        """How many times each page in ``pages`` (from ``pages_of``) has been allocated (a copy)."""
        with self._lock:
            return self._generation[pages]

    def pages_of(self, slots: torch.Tensor) -> np.ndarray:
        """Validated page numbers of ``slots`` (aligned, in range, no repeats)."""
        if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.is_floating_point():
            raise ValueError("slots: need a 1-D integer tensor")
        arr = slots.detach().to("cpu", torch.int64).numpy()
        ps = self.page_size
        if arr.size % ps:
            raise ValueError(f"slots: must be whole pages of {ps} slots, got length {arr.size}")
        if arr.size and (arr.min() < 0 or arr.max() >= self.num_slots):
            raise ValueError(f"slots: values must be in [0, {self.num_slots}), "
                             f"got min {arr.min()} max {arr.max()}")
        runs = arr.reshape(-1, ps)
        if ps > 1 and not ((runs[:, 0] % ps == 0).all() and (runs == runs[:, :1] + self._offsets).all()):
            raise ValueError(f"slots: must be whole pages of {ps} aligned, consecutive slots "
                             f"(aligned runs of {ps})")
        pages = runs[:, 0] // ps
        if _has_repeats(pages):
            raise ValueError("slots: the same page appears twice in one call")
        return pages

    def _pages_to_slots(self, pages: np.ndarray) -> np.ndarray:
        if self.page_size == 1:
            return pages
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


def _has_repeats(values: np.ndarray) -> bool:
    """True if any value occurs twice (a sort beats np.unique several times over here)."""
    ordered = np.sort(values)
    return bool((ordered[1:] == ordered[:-1]).any())
