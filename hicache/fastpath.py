"""Hot-path slot checks of the radix tree and the controller's edge, compiled when
`hicache._fastpath` is built.

Three operations on numpy arrays, each one pass in C (one call instead of several numpy
calls of about a microsecond each) or, when the extension is absent (no C compiler at
install time, another Python), the numpy code below, which gives the same answers:

    same_bytes(a, b)        equal lengths and bytes
    fresh_pages(...)        the pages of a caller's slots past the cached prefix when they
                            are whole aligned pages, strictly ascending, in range,
                            allocated and (``held`` given) held by nobody; None otherwise
                            (the caller's slow path then names the broken rule)
    hold(slots, ps, held, d)  held[page] += d for the pages of the tree's own slots
    walk(node, kb, pb)      the nodes below ``node`` matching the key bytes ``kb`` in full,
                            and the next node if it matches only in part

``COMPILED`` says which one runs.
"""
from __future__ import annotations

import numpy as np

try:
    import hicache._fastpath as _c
except ImportError:  # not built: numpy fallbacks
    _c = None

COMPILED = _c is not None


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.tobytes() == b.tobytes()


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


def _walk(node, kb: bytes, page_bytes: int) -> tuple[list, object]:
    off, path, n = node.end << 3, [], len(kb)
    children = node.children
    while off < n:
        child = children.get(kb[off:off + page_bytes])
        if child is None:
            break
        if not kb.startswith(child.key, off):  # a shorter or different key: a partial match
            return path, child
        path.append(child)
        off += len(child.key)
        children = child.children
    return path, None


same_bytes = _c.same_bytes if _c is not None else _same_bytes
walk = _c.walk if _c is not None else _walk
hold = _c.hold if _c is not None else _hold
