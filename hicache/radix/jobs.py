"""`StoreJob` and `BusyClock`: the records of the storage tier's work, free of any storage import.

A job is one lookup, read or write of the tree (`hicache.radix.store`), made of one
`StorageIO` operation per pool; the tree holds jobs and checks their kind without
importing the storage layer, so a tree without a store never loads it (nor its
checksum library).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from hicache.storage import IOResult, StorageOp

LOOKUP, READ, WRITE = "lookup", "read", "write"


@dataclass(slots=True, eq=False)
class StoreJob:
    """Operations of one lookup, read or write, finished when every one has a result.

    Attributes:
        kind: ``"lookup"``, ``"read"`` or ``"write"``.
        ops: the `StorageOp` of each pool (lookup: ``"history"`` and ``"state"``).
        owner: the tree's record this job belongs to.
        results: each op's `IOResult` once polled.
        pins: host pages a read or write pinned until it is done, per own-indexed pool (`HostPins`).
        keys: a write's page and snapshot keys (a lookup of one of them runs after the write).
    """

    kind: str
    ops: dict[str, StorageOp]
    owner: Any
    results: dict[str, IOResult] = field(default_factory=dict)
    pins: dict[str, np.ndarray] = field(default_factory=dict)
    keys: tuple = ()

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.ops)

    @property
    def stopped(self) -> bool:
        """Whether a cancel or a deadline ended some operation early."""
        return any(r.stopped for r in self.results.values())

    def cancel(self) -> None:
        for op in self.ops.values():
            op.cancel()


class BusyClock:
    """Seconds during which at least one operation was outstanding (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outstanding, self._since, self.seconds = 0, 0.0, 0.0

    def start(self) -> None:
        with self._lock:
            if self._outstanding == 0:
                self._since = time.perf_counter()
            self._outstanding += 1

    def stop(self) -> None:
        with self._lock:
            self._outstanding -= 1
            if self._outstanding == 0:
                self.seconds += time.perf_counter() - self._since
