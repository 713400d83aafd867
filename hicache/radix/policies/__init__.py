"""Eviction policies of `HiRadixCache`'s device and host tiers (``--hicache-eviction-policy``).

    name       order of a tier's leaves, first evicted first               history
    lru        last access                                                 none
    lfu        hit count, then last access                                 none
    adaptive   LRU or LFU (counts kept across evictions), drawn by         ghosts of evicted nodes
               weights that the misses each caused lower
    lfuda      hit count + the tier's age at the last access (the          ghosts' hit counts
               priority of its last victim), then last access
    tiered     the device as lfuda, the host as lru                        the device's (lfuda)

`hicache.config.EVICTION_POLICIES` lists the names; `make_policy` builds one.
"""
from __future__ import annotations

from typing import Callable

from hicache.radix.policies.adaptive import Adaptive
from hicache.radix.policies.base import LFU, LRU, EvictionPolicy, Victims
from hicache.radix.policies.lfuda import LFUDA
from hicache.radix.policies.tiered import Tiered

_MAKERS: dict[str, Callable[[dict[str, int], int, Callable[[], int]], EvictionPolicy]] = {
    "lru": lambda capacity, page_bytes, clock: LRU(),
    "lfu": lambda capacity, page_bytes, clock: LFU(),
    "adaptive": lambda capacity, page_bytes, clock: Adaptive(capacity, page_bytes),
    "lfuda": lambda capacity, page_bytes, clock: LFUDA(capacity, page_bytes, clock),
    "tiered": lambda capacity, page_bytes, clock: Tiered({"device": LFUDA(capacity, page_bytes, clock),
                                                          "host": LRU()}),
}
NAMES = tuple(_MAKERS)  # = hicache.config.EVICTION_POLICIES (the config imports no torch)

__all__ = ["NAMES", "Adaptive", "EvictionPolicy", "LFU", "LFUDA", "LRU", "Tiered", "Victims", "make_policy"]


def make_policy(name: str, capacity_tokens: dict[str, int], page_size: int,
                clock: Callable[[], int] = lambda: 0) -> EvictionPolicy:
    """The policy ``name`` for a tree whose tiers hold ``capacity_tokens`` anchor tokens.

    Args:
        name: one of `NAMES`.
        capacity_tokens: anchor tokens of each tier, keyed ``"device"`` / ``"host"``
            (bounds the ghosts of the policies that keep them).
        page_size: tokens per page; clock: the tree's LRU clock (``RadixIndex.clock``).
    Returns:
        A fresh policy (one per tree: it keeps that tree's history).
    Raises:
        ValueError: an unknown name (the allowed ones listed).
    """
    maker = _MAKERS.get(name)
    if maker is None:
        raise ValueError(f"eviction_policy (--hicache-eviction-policy): must be one of {', '.join(NAMES)}, "
                         f"got {name!r}")
    return maker(capacity_tokens, page_size * 8, clock)
