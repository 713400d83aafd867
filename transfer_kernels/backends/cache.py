"""The small LRU map of the backends' per-shape layout caches, and the weak table
references that tell a cache hit from a new table at a reused id (no pool kept alive)."""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Sequence

from transfer_kernels.rows import PlannedJob


class Lru:
    """A small thread-safe LRU map."""

    def __init__(self, size: int) -> None:
        self.size, self.items, self.lock = size, OrderedDict(), threading.Lock()

    def get(self, key: tuple) -> Any:
        """The value under ``key`` (made the most recent), or ``None``."""
        with self.lock:
            value = self.items.get(key)
            if value is not None:
                self.items.move_to_end(key)
            return value

    def put(self, key: tuple, value: Any) -> None:
        """Store ``value``; the least recent entry goes beyond ``size``."""
        with self.lock:
            self.items[key] = value
            if len(self.items) > self.size:
                self.items.popitem(last=False)


def table_refs(jobs: Sequence[PlannedJob]) -> tuple[tuple[weakref.ref, weakref.ref], ...]:
    """Per job, weak references to its (src, dst) tables: a cache keyed by table ids keeps
    these to tell a hit from a new table at a reused id, without keeping a pool alive."""
    return tuple((weakref.ref(j.src), weakref.ref(j.dst)) for j in jobs)


def same_tables(jobs: Sequence[PlannedJob], refs: tuple) -> bool:
    """True when ``refs`` (from :func:`table_refs`) still name ``jobs``' tables."""
    for job, (src, dst) in zip(jobs, refs):
        if src() is not job.src or dst() is not job.dst:
            return False
    return True
