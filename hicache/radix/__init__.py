"""The radix tree of the hierarchical cache: `HiRadixCache` over device, host and storage tiers.

The storage tier itself (`TierStore`, `open_store`) is in `hicache.radix.store`, imported
only where a store is used (it loads the storage layer and its checksum library).
"""
from hicache.radix.cache import HiRadixCache
from hicache.radix.node import InsertResult, MatchResult, TreeNode
from hicache.radix.prefetch import Prefetch, PrefetchOutcome, PrefetchResult

__all__ = ["HiRadixCache", "InsertResult", "MatchResult", "Prefetch", "PrefetchOutcome", "PrefetchResult",
           "TreeNode"]
