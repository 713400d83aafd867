"""The links' backlog: seconds of work queued on a link before a new load can move.

Two sources, one signature (``backlog(link) -> seconds``, the `LoadGate`'s):

    LiveBacklog   a running server: the bytes the controller (H2D loads queued or in
                  flight) and the storage I/O pool (reads and writes submitted, not
                  finished) report, over the profile's GB/s
    LinkClocks    the replay's event simulation: per link the time its queued work ends,
                  advanced request by request in arrival order; the backlog is how far
                  that lies past the current request's arrival

    link      carries                              a transfer occupies it for
    h2d       loads (host -> device)               bytes / GB/s (its enqueue and first
    d2h       backups (device -> host)             byte are the request's, not the link's)
    storage   prefetch reads and backup writes     bytes / read or write GB/s
"""
from __future__ import annotations

from typing import Any

from hicache.cost.decide import H2D, STORAGE
from hicache.cost.profile import Link, Store

D2H = "d2h"
LINKS = (H2D, D2H, STORAGE)


class LinkClocks:
    """Per link, the (simulated) time its queued work ends; ``now`` is the current request's
    arrival. Not thread-safe (the replay's loop)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.free = dict.fromkeys(LINKS, 0.0)

    def backlog(self, link: str) -> float:
        """Seconds of work on ``link`` still ahead of ``now``."""
        ahead = self.free[link] - self.now
        return ahead if ahead > 0 else 0.0

    def occupy(self, link: str, start: float, seconds: float) -> float:
        """Queue ``seconds`` of work on ``link``, ready at ``start``; returns when it ends."""
        free = self.free[link]
        end = (start if start > free else free) + seconds
        self.free[link] = end
        return end


class LiveBacklog:
    """A server's backlog (module docstring).

    Args:
        controller: has ``backlog_bytes("h2d")`` (the `HybridCacheController`).
        store: has ``backlog_bytes()`` (a `TierStore`), or None.
        h2d: the profile's host -> device link; storage: its store's figures, or None.
    Reads the controller (scheduler thread) and the store's counter (thread-safe).
    """

    def __init__(self, controller: Any, store: Any, h2d: Link, storage: Store | None) -> None:
        self.controller, self.store = controller, store
        self._h2d = h2d.gbps * 1e9
        self._storage = storage.read_gbps * 1e9 if storage is not None else 0.0

    def __call__(self, link: str) -> float:
        if link == H2D:
            return self.controller.backlog_bytes(H2D) / self._h2d
        if link == STORAGE and self.store is not None and self._storage:
            return self.store.backlog_bytes() / self._storage
        return 0.0
