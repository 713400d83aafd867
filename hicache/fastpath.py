"""Hot-path slot checks of the radix tree and the controller's edge, compiled when
`hicache._fastpath` is built.

Operations on numpy arrays and the tree's nodes, each one pass in C (one call instead
of several numpy calls of about a microsecond each) or, when the extension is absent (no
C compiler at install time, another Python), the numpy code below, which gives the same
answers:

    same_bytes(a, b)        equal lengths and bytes (arrays or bytes)
    fresh_pages(...)        the pages of a caller's slots past the cached prefix when they
                            are whole aligned pages, strictly ascending, in range,
                            allocated and (``held`` given) held by nobody; None otherwise
                            (the caller's slow path then names the broken rule);
                            ``are_fresh``: whether it would, no pages made
    hold(slots, ps, held, d)  held[page] += d for the pages of the tree's own slots
    walk(node, key, pb, hint)  the nodes below ``node`` matching the key (int64 ids or their
                            bytes) in full, and the next node if it matches only in part;
                            ``hint``: an earlier walk's path, taken without lookups while
                            the key follows it
    touch(nodes, clock, hits)  last_access = clock (hit_count += 1 if hits) on each node of
                            a path; returns how many hold a device copy
    gather(nodes, k, out)   the device slots of the first k nodes, one after another, into
                            out (an int64 array of exactly their length)
    rows(slots, tpr, out)   out = slots[::tpr] // tpr of a 1-D int64 contiguous CPU tensor
    put(dst, index, values) dst[index] = values (int64 arrays, indices in range)

``COMPILED`` says which one runs.
"""
from __future__ import annotations

import numpy as np

try:
    import hicache._fastpath as _c
except ImportError:  # not built: numpy fallbacks
    _c = None

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


def _child_at(children: dict, page: bytes):
    found = children.get(page[:8])
    if type(found) is dict:
        return found.get(page)
    return found if found is not None and found.key[:len(page)] == page else None


def _walk(node, key, page_bytes: int, hint: list | None) -> tuple[list, object]:
    kb = key if type(key) is bytes else memoryview(key).cast("B").tobytes()
    off, path, n = node.end << 3, [], len(kb)
    children, hinted = node.children, len(hint) if hint is not None else 0
    while off + 8 <= n:
        child = hint[len(path)] if len(path) < hinted else None
        if child is None or not child.key or not kb.startswith(child.key, off):
            hinted = 0  # no hint (left): look up
            child = _child_at(children, kb[off:off + page_bytes])
            if child is None:
                break
            if not kb.startswith(child.key, off):  # a shorter or different key: a partial match
                return path, child
        path.append(child)
        off += len(child.key)
        children = child.children
    return path, None


def _touch(nodes: list, clock: int, hits: bool) -> int:
    on_device = 0
    for node in nodes:
        node.last_access = clock
        if hits:
            node.hit_count += 1
        if node._device is not None:
            on_device += 1
    return on_device


def _gather(nodes: list, count: int, out: np.ndarray) -> None:
    parts = [n._device.numpy() for n in nodes[:count]]
    total = sum(p.size for p in parts)
    if total != out.size:
        raise ValueError(f"gather: {total} slots into a buffer of {out.size}")
    if parts:
        np.concatenate(parts, out=out)


def _rows(slots, tokens_per_row: int, out: np.ndarray) -> None:
    rows = slots.numpy()[::tokens_per_row] // tokens_per_row
    if slots.numel() % tokens_per_row or rows.size != out.size:
        raise ValueError(f"rows: {slots.numel()} slots are not {out.size} rows of {tokens_per_row}")
    out[:] = rows


def _put(dst: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    if index.size != values.size or (index.size and (index.min() < 0 or index.max() >= dst.size)):
        raise ValueError(f"put: {index.size} indices (each in [0, {dst.size})) for {values.size} values")
    dst[index] = values


same_bytes = _c.same_bytes if _c is not None else _same_bytes
walk = _c.walk if _c is not None else _walk
hold = _c.hold if _c is not None else _hold
touch = _c.touch if _c is not None else _touch
gather = _c.gather if _c is not None else _gather
rows = _c.rows if _c is not None else _rows
put = _c.put if _c is not None else _put
