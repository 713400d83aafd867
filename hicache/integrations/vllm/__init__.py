"""hicache as vLLM's KV offloading tier (tested against vLLM 0.32.0 and 0.33.0).

``kv_transfer_config(config)`` and ``SpecConfig`` need no vLLM. ``HiCacheOffloadingSpec``
and ``HiCacheOffloadingConnector`` import vLLM, so they load on first access: vLLM's
``getattr(import_module("hicache.integrations.vllm"), name)`` is that access.
"""
from __future__ import annotations

from typing import Any

from hicache.integrations.vllm.config import (
    CONNECTOR_NAME,
    MODULE_PATH,
    SPEC_NAME,
    VLLM_VERSION,
    VLLM_VERSIONS,
    SpecConfig,
    kv_transfer_config,
)

_LAZY = ("HiCacheOffloadingSpec", "HiCacheOffloadingConnector")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from hicache.integrations.vllm import spec
        return getattr(spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CONNECTOR_NAME", "HiCacheOffloadingConnector", "HiCacheOffloadingSpec", "MODULE_PATH",
           "SPEC_NAME", "SpecConfig", "VLLM_VERSION", "VLLM_VERSIONS", "kv_transfer_config"]
