"""Eviction policies of `HiRadixCache`'s tiers and of the vLLM plugin's host index
(``--hicache-eviction-policy``; one implementation for both, `base`).

    name       order, lowest first (ties: least recent, then deepest)
    lru        last access
    lfu        requests that carried the prefix (hit or miss, kept across eviction)
    lfuda      requests + the tier's age at the last access (dynamic aging)
    rf1 rf4    last access + W x log2(1 + requests), W = 1, 4 or 16 x the clock ticks
    rf16       in which the traffic carries a cache's worth of tokens
    tiered     the device as lfuda, the host as lru
    adaptive   (default) the candidate among lru, lfuda, rf1, rf4 and rf16 that hits most
               in mini caches fed a sample of the live traffic, with hysteresis

Every policy keeps the counts of prefixes that left (`ghosts`). `hicache.config.
EVICTION_POLICIES` is the one list of names (the config imports no torch); `make_policy`
builds one.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

from hicache.config import EVICTION_POLICIES
from hicache.radix.policies.adaptive import Adaptive
from hicache.radix.policies.base import LRU, EvictionPolicy, Victims
from hicache.radix.policies.ghosts import GHOST_SPAN, Ghosts
from hicache.radix.policies.scores import AgedFrequency, Pace, make_score
from hicache.radix.policies.tiered import Tiered

NAMES = EVICTION_POLICIES

__all__ = ["NAMES", "Adaptive", "EvictionPolicy", "LRU", "Paced", "Tiered", "Victims", "make_policy"]


class Paced(EvictionPolicy):
    """A fixed score that follows the traffic's pace (the blends' W): it hears requests."""

    hears_requests = True

    def __init__(self, name: str, tiers: tuple[str, ...], distinct_tokens: int, chains, history: Ghosts | None,
                 clock: Callable[[], int]) -> None:
        self.pace, self.chains, self.name = Pace(distinct_tokens, clock), chains, name
        super().__init__({t: make_score(name, self.pace) for t in tiers}, history, clock)

    def requested(self, request) -> None:
        heard = self.chains.heard(request)
        if heard is not None:
            self.pace.add(heard[0])


def make_policy(name: str, capacity_tokens: dict[str, int], clock: Callable[[], int] = lambda: 0, *,
                distinct_tokens: int | None = None, ghost_key: Callable[[Any], Hashable] | None = None,
                chains=None) -> EvictionPolicy:
    """The policy ``name`` for an owner whose tiers hold ``capacity_tokens``.

    Args:
        name: one of `NAMES`.
        capacity_tokens: tokens of each tier, keyed by tier name (the tree: ``"device"``,
            ``"host"``; the plugin: ``"host"``).
        clock: the owner's clock (the tree's LRU clock; the plugin's request count).
        distinct_tokens: tokens the tiers hold together, counting a copy once (default: the
            sum): the ghosts' and the mini caches' scale.
        ghost_key: the ghost key of an item (`ghosts.tree_key`, a chunk's key); None: no
            ghosts (counts restart after an eviction).
        chains: the owner's requests as chains (`requests.TokenChains` / `KeyChains`);
            needed by ``adaptive`` and the ``rf*`` blends.
    Returns:
        A fresh policy (one per owner: it keeps that owner's history).
    Raises:
        ValueError: an unknown name (the allowed ones listed), or a blend or ``adaptive``
            without ``chains``.
    """
    if name not in NAMES:
        raise ValueError(f"eviction_policy (--hicache-eviction-policy): must be one of {', '.join(NAMES)}, "
                         f"got {name!r}")
    tiers = tuple(capacity_tokens)
    distinct = max(1, distinct_tokens if distinct_tokens is not None else sum(capacity_tokens.values()))
    history = None if ghost_key is None else Ghosts(GHOST_SPAN * distinct, ghost_key)
    if (name == "adaptive" or name.startswith("rf")) and chains is None:
        raise ValueError(f"chains: the {name!r} policy hears requests; pass the owner's chains")
    if name == "lru":
        return LRU(history, tiers)
    if name == "tiered":
        return Tiered({t: EvictionPolicy({t: AgedFrequency()}, clock=clock) if t == "device" else LRU(tiers=(t,))
                       for t in tiers}, history)
    if name == "adaptive":
        return Adaptive(tiers, distinct, chains, history, clock)
    if name.startswith("rf"):
        return Paced(name, tiers, distinct, chains, history, clock)
    policy = EvictionPolicy({t: make_score(name, Pace(distinct, clock)) for t in tiers}, history, clock)
    policy.name = name
    return policy
