"""The tree's read path: how a node files its children, and the walk, touch and gather of
a match, as one operation in two forms.

The Python form below is the reference. The compiled form (`hicache.radix._read`, built
from ``_read.c`` by setup.py) is a drop-in that gives the same answers
(tests/hicache/radix/test_read.py drives both over random trees and compares them); it
reads a node through TreeNode's declared ``__slots__`` layout, checked when it is imported.

Filing, the one rule (`file_child` and `unfile_child` write it; `child_at`, `child_nodes`
and `only_child` read it; ``_read.c`` mirrors `child_at`): a node's ``children`` dict files
each child under the bytes of its first token id (8 bytes hash in a few dozen instructions,
where a 64-token page's 512 cost a walk about a microsecond per level); children sharing a
first token (pages of more than one token) are filed together under it, in a dict keyed by
the bytes of their first page.

    walk(node, key, page_bytes, hint)  the nodes below ``node`` matching ``key`` (the whole
                                       key from the root: int64 ids or their bytes) in full,
                                       and the next node if it matches only in part;
                                       ``hint``: an earlier walk's path, taken without
                                       lookups while the key follows it
    touch(nodes, clock, hits)          last_access = clock (hit_count += 1 if hits) on each
                                       node of a path; returns how many hold a device copy
    gather(nodes, count, out)          the device slots of the first ``count`` nodes, one
                                       after another, into ``out`` (int64, exactly their length)

`PYTHON` and `COMPILED` are the two forms (`COMPILED` is None when the module is not built,
is switched off by ``HICACHE_NO_C=1``, or is stale: `host_pools.compiled`); `READ` is the
one a tree uses unless told otherwise. Scheduler thread only, like the tree they read.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

from host_pools.compiled import load

if TYPE_CHECKING:
    from hicache.radix.node import TreeNode


# ---- filing ---------------------------------------------------------------------------
def file_child(children: dict, node: TreeNode, page_bytes: int) -> None:
    """File ``node`` in its parent's ``children``, replacing a child of the same first page."""
    key = node.key
    tok = key[:8]
    there = children.get(tok)
    if there is None or page_bytes == 8:
        children[tok] = node
    elif type(there) is dict:
        there[key[:page_bytes]] = node
    elif there.key[:page_bytes] == key[:page_bytes]:
        children[tok] = node
    else:
        children[tok] = {there.key[:page_bytes]: there, key[:page_bytes]: node}


def unfile_child(children: dict, node: TreeNode, page_bytes: int) -> None:
    """Remove ``node`` (filed) from its parent's ``children``."""
    tok = node.key[:8]
    there = children[tok]
    if there is node:
        del children[tok]
        return
    del there[node.key[:page_bytes]]
    if len(there) == 1:
        children[tok] = next(iter(there.values()))


def child_nodes(node: TreeNode) -> list[TreeNode]:
    """The children of ``node``."""
    out = []
    for there in node.children.values():
        if type(there) is dict:
            out.extend(there.values())
        else:
            out.append(there)
    return out


def only_child(node: TreeNode) -> bool:
    """Whether ``node`` has exactly one child (a nested dict files two or more)."""
    children = node.children
    return len(children) == 1 and type(next(iter(children.values()))) is not dict


def child_at(children: dict, page: bytes) -> TreeNode | None:
    """The child filed under ``page`` (a page's bytes, or what is left of the key when
    shorter): the child of its first page, or ``None``."""
    found = children.get(page[:8])
    if type(found) is dict:
        return found.get(page)
    return found if found is not None and found.key[:len(page)] == page else None


# ---- the read path, Python form (the reference) ---------------------------------------
def walk(node: TreeNode, key: np.ndarray | bytes, page_bytes: int,
         hint: list[TreeNode] | None) -> tuple[list[TreeNode], TreeNode | None]:
    """The fully matched nodes below ``node`` and the node matched only in part (or None).

    Raises:
        TypeError: a key that is not bytes nor a contiguous buffer of 8-byte items.
        ValueError: ``page_bytes`` not a positive multiple of 8; ``node.end`` negative.
    """
    if type(key) is bytes:
        kb = key
    else:
        view = memoryview(key)
        if view.itemsize != 8 or not view.c_contiguous:
            raise TypeError(f"key: need bytes or a C-contiguous int64 array, got {type(key).__name__}")
        kb = view.cast("B").tobytes()
    if page_bytes < 8 or page_bytes % 8 or node.end < 0:
        raise ValueError(f"page_bytes, node.end: need a positive multiple of 8 and an end >= 0, "
                         f"got {page_bytes}, {node.end}")
    off, path, n = node.end << 3, [], len(kb)
    children, hinted = node.children, len(hint) if hint is not None else 0
    while off + 8 <= n:
        child = hint[len(path)] if len(path) < hinted else None
        if child is None or not child.key or not kb.startswith(child.key, off):
            hinted = 0  # no hint (left): look up
            child = child_at(children, kb[off:off + page_bytes])
            if child is None:
                break
            if not kb.startswith(child.key, off):  # a shorter or different key: a partial match
                return path, child
        path.append(child)
        off += len(child.key)
        children = child.children
    return path, None


def touch(nodes: list[TreeNode], clock: int, hits: bool) -> int:
    """Mark ``nodes`` used at ``clock`` (and count a hit on each if ``hits``); returns how
    many hold a device copy (a prefix of a path: device copies are closed under parent)."""
    on_device = 0
    for node in nodes:
        node.last_access = clock
        if hits:
            node.hit_count += 1
        if node._device is not None:
            on_device += 1
    return on_device


def gather(nodes: list[TreeNode], count: int, out: np.ndarray) -> None:
    """Copy the device slots of the first ``count`` nodes, one after another, into ``out``.

    Raises:
        ValueError: ``out`` is not exactly their length (nothing written).
    """
    parts = [n._device.numpy() for n in nodes[:count]]
    total = sum(p.size for p in parts)
    if total != out.size:
        raise ValueError(f"out: {total} slots into a buffer of {out.size}")
    if parts:
        np.concatenate(parts, out=out)


class ReadPath(NamedTuple):
    """One form of the read path (immutable): its three operations and its name."""

    name: str
    walk: Callable[..., tuple[list, object]]
    touch: Callable[[list, int, bool], int]
    gather: Callable[[list, int, np.ndarray], None]


PYTHON = ReadPath("python", walk, touch, gather)
_c = load("hicache.radix._read", [Path(__file__).with_name("_read.c"), Path(__file__).parents[1] / "_tensor.h"])
COMPILED = None if _c is None else ReadPath("compiled", _c.walk, _c.touch, _c.gather)
READ = COMPILED or PYTHON
