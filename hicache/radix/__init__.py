"""The radix tree of the hierarchical cache: `HiRadixCache` and the records it returns."""
from hicache.radix.cache import HiRadixCache
from hicache.radix.node import InsertResult, MatchResult, TreeNode

__all__ = ["HiRadixCache", "InsertResult", "MatchResult", "TreeNode"]
