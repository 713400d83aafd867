"""hicache: hierarchical KV cache — device pools mirrored by pinned host pools.

The names below load on first access (PEP 562), so ``import hicache`` (and the
``hicache`` command's ``--help``) does not import torch. ``build`` and ``HiCache`` are
imported at once: ``hicache.build`` must be the function, never the submodule of the same
name (``hicache/build.py`` imports torch only when it runs).
"""
from __future__ import annotations

import importlib
from typing import Any

from hicache.build import HiCache, build
from hicache.config import HiCacheConfig, add_hicache_args

# public name -> the module that defines it
_LAZY = {
    "Ack": "hicache.controller",
    "HybridCacheController": "hicache.controller",
    "DevicePool": "hicache.device_pool",
    "LayerDoneCounter": "hicache.controller",
    "HiRadixCache": "hicache.radix",
}


def capabilities(config: HiCacheConfig | None = None) -> dict:
    """The client-hint capability report (API) of a cache built from ``config`` (default:
    the defaults): the actions it takes, why not the others, and its limits
    (`hicache.radix.hints.envelope.capabilities`; `HiRadixCache.capabilities` is a built
    tree's own, which knows whether it has a host tier)."""
    from hicache.radix.hints.envelope import capabilities as report
    config = HiCacheConfig() if config is None else config
    unavailable = {"persist": "no storage tier"} if config.storage_backend == "none" else {}
    return report(config.max_retained_ratio, config.max_hint_ttl_s, unavailable)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):  # a submodule not imported yet: `hicache.controller` after `import hicache`
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Ack", "DevicePool", "HiCache", "HiCacheConfig", "HiRadixCache", "HybridCacheController",
    "LayerDoneCounter",
    "add_hicache_args", "build", "capabilities",
]
