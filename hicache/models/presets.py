"""Named model presets: public configs mapped onto the stack builders."""
from __future__ import annotations

from typing import Callable

from host_pools.spec import Stack
from hicache.models.deepseek_v4 import FLASH_RATIOS, PRO_RATIOS, deepseek_v4
from hicache.models.dense import dsa, mha, mla

# preset -> builder(num_layers or None); None keeps the model's real layer count
PRESETS: dict[str, Callable[[int | None], Stack]] = {
    "llama-3.1-8b": lambda n: mha(n or 32, 8, 128, page_size=64, model="llama-3.1-8b"),
    "llama-3.1-8b-fp8": lambda n: mha(n or 32, 8, 128, kv_quant="fp8", page_size=64, model="llama-3.1-8b-fp8"),
    "llama-3.1-8b-int8": lambda n: mha(n or 32, 8, 128, kv_quant="int8", page_size=64,
                                       model="llama-3.1-8b-int8"),
    "deepseek-v3": lambda n: mla(n or 61, page_size=64, model="deepseek-v3"),
    "deepseek-v3-fp8": lambda n: mla(n or 61, fp8=True, page_size=64, model="deepseek-v3-fp8"),
    "deepseek-v3.2": lambda n: dsa(n or 61, page_size=64, model="deepseek-v3.2"),
    "deepseek-v4-flash": lambda n: deepseek_v4(FLASH_RATIOS[:n] if n else FLASH_RATIOS, "deepseek-v4-flash"),
    "deepseek-v4-pro": lambda n: deepseek_v4(PRO_RATIOS[:n] if n else PRO_RATIOS, "deepseek-v4-pro"),
}


def preset(name: str, num_layers: int | None = None) -> Stack:
    """The stack of a named model, optionally cut to its first ``num_layers`` layers.

    Raises:
        ValueError: unknown name (the message lists the known ones) or ``num_layers`` < 1.
    """
    if name not in PRESETS:
        raise ValueError(f"model: unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    if num_layers is not None and num_layers < 1:
        raise ValueError(f"num_layers: must be >= 1, got {num_layers}")
    return PRESETS[name](num_layers)
