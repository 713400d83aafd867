"""Alias kept for the public name `hicache.radix_cache.HiRadixCache` (API); the tree lives in `hicache.radix`."""
from hicache.radix import HiRadixCache, InsertResult, MatchResult, TreeNode

__all__ = ["HiRadixCache", "InsertResult", "MatchResult", "TreeNode"]
