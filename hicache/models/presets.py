"""Named model presets: public configs mapped onto the stack builders."""
from __future__ import annotations

from typing import Callable, NamedTuple

from host_pools.spec import Stack
from hicache.models.deepseek_v4 import FLASH_RATIOS, PRO_RATIOS, deepseek_v4
from hicache.models.dense import dsa, mha, mla
from hicache.models.linear_hybrid import HYBRIDS, hybrid_shape, linear_hybrid
from hicache.models.shape import ModelShape, deepseek_v3_shape, deepseek_v4_shape, dense_shape


class Preset(NamedTuple):
    """A model's real layer count, a builder of its first ``n`` layers' stack and what the
    whole model computes per token (`hicache.models.shape`; None: not described)."""

    num_layers: int
    build: Callable[[int], Stack]
    shape: ModelShape | None = None


_LLAMA_8B = dense_shape("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256)  # the public config.json


def _hybrid(name: str) -> Preset:
    geometry, *dims = HYBRIDS[name]
    return Preset(len(geometry.layer_kinds), lambda n: linear_hybrid(geometry.cut(n), name),
                  hybrid_shape(name, geometry, *dims))


PRESETS: dict[str, Preset] = {
    "llama-3.1-8b": Preset(32, lambda n: mha(n, 8, 128, page_size=64, model="llama-3.1-8b"), _LLAMA_8B),
    "llama-3.1-8b-fp8": Preset(32, lambda n: mha(n, 8, 128, kv_quant="fp8", page_size=64,
                                                 model="llama-3.1-8b-fp8"), _LLAMA_8B),
    "llama-3.1-8b-int8": Preset(32, lambda n: mha(n, 8, 128, kv_quant="int8", page_size=64,
                                                  model="llama-3.1-8b-int8"), _LLAMA_8B),
    "deepseek-v3": Preset(61, lambda n: mla(n, page_size=64, model="deepseek-v3"), deepseek_v3_shape()),
    "deepseek-v3-fp8": Preset(61, lambda n: mla(n, fp8=True, page_size=64, model="deepseek-v3-fp8"),
                              deepseek_v3_shape("deepseek-v3-fp8")),
    "deepseek-v3.2": Preset(61, lambda n: dsa(n, page_size=64, model="deepseek-v3.2"),
                            deepseek_v3_shape("deepseek-v3.2", sparse=True)),
    "deepseek-v4-flash": Preset(len(FLASH_RATIOS), lambda n: deepseek_v4(FLASH_RATIOS[:n], "deepseek-v4-flash"),
                                deepseek_v4_shape("deepseek-v4-flash", FLASH_RATIOS)),
    "deepseek-v4-pro": Preset(len(PRO_RATIOS), lambda n: deepseek_v4(PRO_RATIOS[:n], "deepseek-v4-pro"),
                              deepseek_v4_shape("deepseek-v4-pro", PRO_RATIOS)),
    # linear-attention hybrids (hicache/models/linear_hybrid.py cites each config)
    "qwen3.5-27b": _hybrid("qwen3.5-27b"),
    "qwen3.5-35b-a3b": _hybrid("qwen3.5-35b-a3b"),
    "qwen3-next-80b-a3b": _hybrid("qwen3-next-80b-a3b"),
    "nemotron-h-8b": _hybrid("nemotron-h-8b"),
}


def preset(name: str, num_layers: int | None = None) -> Stack:
    """The stack of a named model, optionally cut to its first ``num_layers`` layers.

    Raises:
        ValueError: unknown name (the message lists the known ones), or ``num_layers``
            outside [1, the model's layer count].
    """
    if name not in PRESETS:
        raise ValueError(f"model: unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    total, build = PRESETS[name][:2]
    if num_layers is not None and not 1 <= num_layers <= total:
        raise ValueError(f"num_layers: {name} has {total} layers; must be in [1, {total}], got {num_layers}")
    return build(total if num_layers is None else num_layers)
