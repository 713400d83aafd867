"""`HostPins`: host pages a storage write still reads, and frees of them deferred until it ends.

The tree frees host slots whenever a node leaves the host (eviction, a deleted subtree),
also while a storage write on an I/O thread still reads them. Handing such a page out
again would let the write store someone else's bytes under this page's key, so:

    page state     free(slots)                   unpin (a write ended)
    not pinned     freed now                     -
    pinned (n>0)   deferred: stays allocated     n -= 1; at 0 a deferred page is freed

The counts are per allocator page of each own-indexed host pool (the anchor, state
roots); all calls come from the scheduler thread (the allocators themselves are
thread-safe).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch


class HostPins:
    """Pin counts and deferred frees per allocator page of some host pools.

    Args:
        pools: the own-indexed host pools by name (each has an ``allocator``).
    """

    def __init__(self, pools: Mapping[str, Any]) -> None:
        self.pools = dict(pools)
        self._refs = {n: np.zeros(p.allocator.num_pages, np.int32) for n, p in self.pools.items()}
        self._deferred = {n: np.zeros(p.allocator.num_pages, np.bool_) for n, p in self.pools.items()}
        self._num_pinned = 0

    def _pages(self, name: str, slots: torch.Tensor) -> np.ndarray:
        ps = self.pools[name].allocator.page_size
        return slots.numpy()[::ps] // ps

    def _slots(self, name: str, pages: np.ndarray) -> torch.Tensor:
        ps = self.pools[name].allocator.page_size
        return torch.from_numpy((pages[:, None] * ps + np.arange(ps)).reshape(-1))

    def pin(self, name: str, slots: torch.Tensor) -> np.ndarray:
        """Pin the pages of ``slots`` (whole pages of pool ``name``); returns them for `unpin`."""
        pages = self._pages(name, slots)
        np.add.at(self._refs[name], pages, 1)
        self._num_pinned += pages.size
        return pages

    def unpin(self, name: str, pages: np.ndarray) -> None:
        """Undo one `pin`; pages freed meanwhile and now unpinned go back to the allocator."""
        refs = self._refs[name]
        np.subtract.at(refs, pages, 1)
        self._num_pinned -= pages.size
        ready = pages[(refs[pages] == 0) & self._deferred[name][pages]]
        if ready.size:
            ready = np.unique(ready)
            self._deferred[name][ready] = False
            self.pools[name].free(self._slots(name, ready))

    def free(self, name: str, slots: torch.Tensor) -> None:
        """Free ``slots`` of pool ``name`` now, except pinned pages (freed at their last unpin)."""
        if not self._num_pinned or name not in self._refs:
            self.pools[name].free(slots)
            return
        pages = self._pages(name, slots)
        pinned = self._refs[name][pages] > 0
        if not pinned.any():
            self.pools[name].free(slots)
            return
        self._deferred[name][pages[pinned]] = True
        if not pinned.all():
            self.pools[name].free(self._slots(name, pages[~pinned]))

    def deferred_slots(self) -> dict[str, torch.Tensor]:
        """Slots freed but held for a write, per pool (empty pools left out)."""
        return {n: self._slots(n, np.flatnonzero(d)) for n, d in self._deferred.items() if d.any()}
