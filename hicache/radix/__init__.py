"""The radix tree of the hierarchical cache: `HiRadixCache` over device, host and storage tiers."""
from hicache.radix.cache import HiRadixCache
from hicache.radix.node import InsertResult, MatchResult, TreeNode
from hicache.radix.prefetch import Prefetch, PrefetchOutcome, PrefetchResult
from hicache.radix.store import TierStore, open_store

__all__ = ["HiRadixCache", "InsertResult", "MatchResult", "Prefetch", "PrefetchOutcome", "PrefetchResult",
           "TierStore", "TreeNode", "open_store"]
