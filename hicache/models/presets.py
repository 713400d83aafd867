"""Named model presets: public configs mapped onto the stack builders."""
from __future__ import annotations

from typing import Callable, NamedTuple

from host_pools.spec import Stack
from hicache.models.deepseek_v4 import FLASH_RATIOS, PRO_RATIOS, deepseek_v4
from hicache.models.dense import dsa, mha, mla
from hicache.models.linear_hybrid import (NEMOTRON_H_8B, QWEN3_5_27B, QWEN3_5_35B_A3B, QWEN3_NEXT_80B_A3B,
                                          HybridGeometry, linear_hybrid)


class Preset(NamedTuple):
    """A model's real layer count and a builder of its first ``n`` layers."""

    num_layers: int
    build: Callable[[int], Stack]


def _hybrid(name: str, geometry: HybridGeometry) -> Preset:
    return Preset(len(geometry.layer_kinds), lambda n: linear_hybrid(geometry.cut(n), name))


PRESETS: dict[str, Preset] = {
    "llama-3.1-8b": Preset(32, lambda n: mha(n, 8, 128, page_size=64, model="llama-3.1-8b")),
    "llama-3.1-8b-fp8": Preset(32, lambda n: mha(n, 8, 128, kv_quant="fp8", page_size=64,
                                                 model="llama-3.1-8b-fp8")),
    "llama-3.1-8b-int8": Preset(32, lambda n: mha(n, 8, 128, kv_quant="int8", page_size=64,
                                                  model="llama-3.1-8b-int8")),
    "deepseek-v3": Preset(61, lambda n: mla(n, page_size=64, model="deepseek-v3")),
    "deepseek-v3-fp8": Preset(61, lambda n: mla(n, fp8=True, page_size=64, model="deepseek-v3-fp8")),
    "deepseek-v3.2": Preset(61, lambda n: dsa(n, page_size=64, model="deepseek-v3.2")),
    "deepseek-v4-flash": Preset(len(FLASH_RATIOS), lambda n: deepseek_v4(FLASH_RATIOS[:n], "deepseek-v4-flash")),
    "deepseek-v4-pro": Preset(len(PRO_RATIOS), lambda n: deepseek_v4(PRO_RATIOS[:n], "deepseek-v4-pro")),
    # linear-attention hybrids (hicache/models/linear_hybrid.py cites each config)
    "qwen3.5-27b": _hybrid("qwen3.5-27b", QWEN3_5_27B),
    "qwen3.5-35b-a3b": _hybrid("qwen3.5-35b-a3b", QWEN3_5_35B_A3B),
    "qwen3-next-80b-a3b": _hybrid("qwen3-next-80b-a3b", QWEN3_NEXT_80B_A3B),
    "nemotron-h-8b": _hybrid("nemotron-h-8b", NEMOTRON_H_8B),
}


def preset(name: str, num_layers: int | None = None) -> Stack:
    """The stack of a named model, optionally cut to its first ``num_layers`` layers.

    Raises:
        ValueError: unknown name (the message lists the known ones), or ``num_layers``
            outside [1, the model's layer count].
    """
    if name not in PRESETS:
        raise ValueError(f"model: unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    total, build = PRESETS[name]
    if num_layers is not None and not 1 <= num_layers <= total:
        raise ValueError(f"num_layers: {name} has {total} layers; must be in [1, {total}], got {num_layers}")
    return build(total if num_layers is None else num_layers)
