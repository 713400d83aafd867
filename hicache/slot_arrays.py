"""One-pass operations on int64 slot and page arrays: the tree's insert checks and the
controller's rows and stamps, compiled when `hicache._slot_arrays` is built.

Each is one pass in C (one call instead of several numpy calls of about a microsecond
each) or, when the module is absent (no C compiler at install time, ``HICACHE_NO_C=1``, a
stale build: `host_pools.compiled`), the numpy code below, which gives the same answers:

    same_bytes(a, b)        equal lengths and bytes (arrays or bytes)
    fresh_pages(...)        the pages of a caller's slots past the cached prefix when they
                            are whole aligned pages, strictly ascending, in range,
                            allocated and (``held`` given) held by nobody; None otherwise
                            (the caller's slow path then names the broken rule);
                            ``are_fresh``: whether it would, no pages made
    hold(slots, ps, held, d)  held[page] += d for the pages of the tree's own slots
    rows(slots, tpr, out)   out = slots[::tpr] // tpr (a 1-D int64 contiguous CPU tensor, whole
                            rows, into an int64 array)
    put(dst, index, values) dst[index] = values (int64 arrays, indices in range)

The compiled form checks every argument (types, item widths, contiguity, sizes) and
raises TypeError/ValueError naming it, never undefined behaviour (docs/DESIGN.md,
"Compiled modules"). ``COMPILED`` says which form runs. Stateless and thread-safe; the
arrays written are the caller's to guard.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from host_pools.compiled import load

if TYPE_CHECKING:
    import torch

_c = load("hicache._slot_arrays", [Path(__file__).with_name("_slot_arrays.c"), Path(__file__).with_name("_tensor.h")])
COMPILED = _c is not None


def _same_bytes(a: np.ndarray | bytes, b: np.ndarray | bytes) -> bool:
    return memoryview(a).cast("B") == memoryview(b).cast("B")


def fresh_pages(slots: np.ndarray, start: int, free_from: int, page_size: int,
                owned: np.ndarray, held: np.ndarray | None) -> np.ndarray | None:
    """Pages of ``slots[start:]`` if every page is whole, aligned, strictly ascending, in
    ``[0, owned.size)``, allocated (``owned``) and, before ``free_from``, held by nobody
    (``held == 0``; ``held=None``: not asked); else ``None``."""
    if _c is not None:
        out = np.empty((slots.size - start) // page_size, np.int64)
        n = _c.fresh_pages(slots, start, free_from, page_size, owned, held, out)
        return out if n == out.size else None
    return _fresh_pages(slots, start, free_from, page_size, owned, held)


def are_fresh(slots: np.ndarray, start: int, free_from: int, page_size: int,
              owned: np.ndarray, held: np.ndarray | None) -> bool:
    """Whether `fresh_pages` would return the pages (without making them)."""
    if _c is not None:
        return _c.fresh_pages(slots, start, free_from, page_size, owned, held, None) == (slots.size - start) // page_size
    return _fresh_pages(slots, start, free_from, page_size, owned, held) is not None


def _fresh_pages(slots: np.ndarray, start: int, free_from: int, page_size: int,
                 owned: np.ndarray, held: np.ndarray | None) -> np.ndarray | None:
    rest = slots[start:]
    if not rest.size:
        return rest
    if page_size > 1:
        pages = rest[::page_size] // page_size
        if rest.tobytes() != (pages[:, None] * page_size + np.arange(page_size)).tobytes():
            return None
    else:
        pages = rest
    if pages[0] < 0 or pages[-1] >= owned.size or np.count_nonzero(pages[1:] <= pages[:-1]) \
            or np.count_nonzero(owned[pages]) != pages.size:
        return None
    before = max(0, -(-(free_from - start) // page_size))  # pages starting before free_from
    if held is not None and np.count_nonzero(held[pages[:before]]):
        return None
    return pages


def _hold(slots: np.ndarray, page_size: int, held: np.ndarray, delta: int) -> None:
    held[slots if page_size == 1 else slots[::page_size] // page_size] += delta


def _rows(slots: torch.Tensor, tokens_per_row: int, out: np.ndarray) -> None:
    rows = slots.numpy()[::tokens_per_row] // tokens_per_row
    if slots.numel() % tokens_per_row or rows.size != out.size:
        raise ValueError(f"rows: {slots.numel()} slots are not {out.size} rows of {tokens_per_row}")
    out[:] = rows


def _put(dst: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    if index.size != values.size or (index.size and (index.min() < 0 or index.max() >= dst.size)):
        raise ValueError(f"put: {index.size} indices (each in [0, {dst.size})) for {values.size} values")
    dst[index] = values


same_bytes = _c.same_bytes if _c is not None else _same_bytes
hold = _c.hold if _c is not None else _hold
rows = _c.rows if _c is not None else _rows
put = _c.put if _c is not None else _put
