"""`StorageAdmission`: which prefixes the storage tier takes (``--hicache-storage-admission N``).

Every page the host drops used to be written to storage. With admission a node's pages
(and its snapshot) are written only once its prefix has been carried by ``N`` requests
(``N = 1``: every page, as before). The count is the tree's own (``hit_count``: the
requests whose insert went through the node) plus what a `Doorkeeper` remembers of the
prefix from before it left the tree: a prefix refused, deleted and computed again starts
from its old count, so a prefix that keeps coming back earns its place.

    offered when                              admitted           refused
    its host copy is acked (storage           written at once    offered again when it
      write_through)                                             leaves the host
    it leaves the host (storage write_back,   written, then      the doorkeeper keeps its
      or refused at its ack)                  dropped            count; it is dropped

A client's ``persist`` hint, and a retained prefix leaving the host, pass it: the client
asked (`hicache.radix.storage.StorageSide.save`'s ``asked``).

A prefix's count never falls along a path (every request carrying a child carries its
parent), so an admitted child's parent is admitted no later than when it is offered.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hicache.radix.node import TreeNode

MAX_COUNT = 255  # a doorkeeper counter is one byte; --hicache-storage-admission stays below it
_MULTIPLIERS = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5],
                        dtype=np.uint64)  # one odd multiplier per row (multiplicative hashing)


class Doorkeeper:
    """A bounded count-min sketch of prefix counts, keyed by page hash (TinyLFU's frequency
    sketch with conservative update and its periodic halving, so old counts fade).

    Args:
        width_bits: log2 of the counters per row (4 rows of one byte each).
        sample: records between halvings (default ten times a row's width, as TinyLFU).
    Not thread-safe: the scheduler thread's.
    """

    def __init__(self, width_bits: int = 16, sample: int | None = None) -> None:
        if not 4 <= width_bits <= 24:
            raise ValueError(f"width_bits: must be in [4, 24], got {width_bits}")
        self.shift = np.uint64(64 - width_bits)
        self.table = np.zeros((len(_MULTIPLIERS), 1 << width_bits), dtype=np.uint8)
        self.sample = 10 << width_bits if sample is None else sample
        self.records = 0
        self._rows = np.arange(len(_MULTIPLIERS))[:, None]

    @property
    def nbytes(self) -> int:
        """Memory of the counters."""
        return self.table.nbytes

    def _slots(self, keys: list[str]) -> np.ndarray:
        ints = np.array([int(k[:16], 16) for k in keys], dtype=np.uint64)
        return (ints[None, :] * _MULTIPLIERS[:, None]) >> self.shift  # (rows, keys)

    def count(self, key: str) -> int:
        """The remembered count of ``key`` (never below the truth while it lasts; 0: unknown)."""
        return int(self.table[self._rows[:, 0], self._slots([key])[:, 0]].min())

    def record(self, keys: list[str], count: int) -> None:
        """Remember ``count`` for every key (a counter only grows: the max of the two)."""
        if not keys:
            return
        slots = self._slots(keys)
        rows = np.broadcast_to(self._rows, slots.shape)
        np.maximum.at(self.table, (rows, slots), np.uint8(min(count, MAX_COUNT)))
        self.records += len(keys)
        if self.records >= self.sample:  # TinyLFU's reset: halve, so the sketch follows the traffic
            self.table >>= 1
            self.records = 0


class StorageAdmission:
    """Whether the storage tier takes a node (scheduler thread; one per tree).

    Args:
        threshold: requests a prefix must have been carried by (>= 2; 1 needs no admission).
        hashes: the node's page hashes (the storage side's, cached on the node).
        count: the tree's count of a node (default ``hit_count``).
        doorkeeper: the memory of refused prefixes (default: a 256 KiB `Doorkeeper`).
    Raises:
        ValueError: ``threshold`` outside [2, `MAX_COUNT`].
    """

    def __init__(self, threshold: int, hashes: Callable[[TreeNode], list[str]],
                 count: Callable[[TreeNode], int] | None = None, doorkeeper: Doorkeeper | None = None) -> None:
        if not 2 <= threshold <= MAX_COUNT:
            raise ValueError(f"threshold: must be in [2, {MAX_COUNT}], got {threshold}")
        self.threshold, self.hashes = threshold, hashes
        self.own_count = count or (lambda node: node.hit_count)
        self.doorkeeper = Doorkeeper() if doorkeeper is None else doorkeeper

    def count(self, node: TreeNode) -> int:
        """``node``'s requests: the tree's count plus what the doorkeeper remembers of its prefix."""
        return self.own_count(node) + self.doorkeeper.count(self.hashes(node)[-1])

    def admits(self, node: TreeNode) -> bool:
        """Whether ``node``'s prefix has earned the storage tier (changes nothing)."""
        return self.own_count(node) >= self.threshold or self.count(node) >= self.threshold

    def refuse(self, node: TreeNode) -> None:
        """``node`` leaves the host without being stored: remember its count (every page's key)."""
        self.doorkeeper.record(self.hashes(node), self.count(node))
