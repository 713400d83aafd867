"""`Tiered`: each tier its own order — aging LFU on the device, LRU on the host.

Under the write-through policies a device eviction loses nothing (the host holds a
copy): what the device should keep is what is reused most, so that it is not loaded
again and again; `AgedFrequency` keeps that and still forgets what stopped being
reused. A host eviction deletes the prefix: the last tier keeps recency. Measured on the
shipped workloads (docs/RESULTS.md): the built-in chat at host ratio 1 0.369 of prompt
tokens vs LRU's 0.298, equal to LRU within 0.001 at ratios 2 and 4.

Each tier's events go to its own order; the counts' history (ghosts) is this policy's,
so a prefix deleted on the host keeps its count as one deleted on the device does.
"""
from __future__ import annotations

from typing import Iterable

from hicache.radix.policies.base import EvictionPolicy, Victims
from hicache.radix.policies.ghosts import Ghosts


class Tiered(EvictionPolicy):
    """A policy per tier.

    Args:
        orders: the policy of each tier, keyed by tier name (``"device"``, ``"host"``),
            built without a history.
        history: the ghosts of items that left (every tier's deletions).
    """

    name = "tiered"

    def __init__(self, orders: dict[str, EvictionPolicy], history: Ghosts | None = None) -> None:
        super().__init__({t: o.scores[t] for t, o in orders.items()}, history)
        self.orders = dict(orders)

    @property
    def live(self) -> str:
        return ",".join(f"{t}:{o.scores[t].name}" for t, o in self.orders.items())

    def entry(self, tier: str, item) -> tuple:
        return self.orders[tier].entry(tier, item)

    def victims(self, tier: str, items: Iterable) -> Victims:
        return self.orders[tier].victims(tier, items)

    def dropped(self, tier: str, item) -> None:
        self.orders[tier].dropped(tier, item)

    def deleted(self, tier: str, items: list) -> None:
        self.orders[tier].deleted(tier, items)  # its aging (no history of its own)
        if self.history is not None:
            for item in items:
                self.history.add(item, item.hit_count, item.num_tokens)

    def regained(self, tier: str, items: Iterable) -> None:
        self.orders[tier].regained(tier, items)
