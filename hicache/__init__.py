"""hicache: hierarchical KV cache — device pools mirrored by pinned host pools."""
from hicache.build import HiCache, build
from hicache.config import HiCacheConfig, add_hicache_args
from hicache.controller import Ack, HybridCacheController
from hicache.device_pool import DevicePool
from hicache.layer_sync import LayerDoneCounter
from hicache.radix import HiRadixCache

__all__ = [
    "Ack", "DevicePool", "HiCache", "HiCacheConfig", "HiRadixCache", "HybridCacheController",
    "LayerDoneCounter",
    "add_hicache_args", "build",
]
