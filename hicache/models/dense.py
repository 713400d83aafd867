"""Stacks for models whose anchor holds data: MHA/GQA (optionally quantized), MLA and DSA.

Rows are whole pages by default (``tokens_per_row = page_size``): a device tensor
``[num_tokens, H, D]`` is adopted as ``[num_tokens // page, page, H, D]``, which makes
every transfer unit a page and keeps copies large.
"""
from __future__ import annotations

import torch

from host_pools.spec import BufferSpec, PoolKind, PoolSpec, Stack

KV_QUANT = (None, "int8", "fp8")
FP8 = getattr(torch, "float8_e4m3fn", torch.uint8)


def _anchor(name: str, num_layers: int, buffers: list[BufferSpec], rows: int) -> PoolSpec:
    return PoolSpec(name, PoolKind.ANCHOR, num_layers, tuple(buffers), tokens_per_row=rows)


def _rows(page_size: int, tokens_per_row: int | None) -> int:
    if page_size < 1:
        raise ValueError(f"page_size: must be >= 1, got {page_size}")
    return page_size if tokens_per_row is None else tokens_per_row


def mha(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16,
        kv_quant: str | None = None, page_size: int = 64, tokens_per_row: int | None = None,
        model: str = "mha") -> Stack:
    """MHA/GQA: per layer a ``k`` and a ``v`` buffer, each followed by its scales when quantized.

    Args:
        kv_quant: ``None`` (``dtype`` KV), ``"int8"`` (one fp16 scale per 8 elements) or
            ``"fp8"`` (e4m3 KV, one fp32 scale per token and head).
    Raises:
        ValueError: unknown ``kv_quant``, or ``head_dim`` not a multiple of 8 for int8.
    """
    if kv_quant not in KV_QUANT:
        raise ValueError(f"kv_quant: must be one of {KV_QUANT}, got {kv_quant!r}")
    t = _rows(page_size, tokens_per_row)
    bufs: list[BufferSpec] = []
    for role in ("k", "v"):
        if kv_quant is None:
            bufs.append(BufferSpec(role, (t, num_kv_heads, head_dim), dtype))
        elif kv_quant == "int8":
            if head_dim % 8:
                raise ValueError(f"head_dim: int8 KV needs a multiple of 8, got {head_dim}")
            bufs += [BufferSpec(role, (t, num_kv_heads, head_dim), torch.int8),
                     BufferSpec(f"{role}_scale", (t, num_kv_heads, head_dim // 8), torch.float16)]
        else:
            bufs += [BufferSpec(role, (t, num_kv_heads, head_dim), FP8),
                     BufferSpec(f"{role}_scale", (t, num_kv_heads), torch.float32)]
    return Stack((_anchor("kv", num_layers, bufs, t),), page_size=page_size, model=model)


def mla(num_layers: int, kv_lora_rank: int = 512, rope_dim: int = 64, fp8: bool = False,
        page_size: int = 64, tokens_per_row: int | None = None, model: str = "mla") -> Stack:
    """MLA: one latent ``kv`` buffer per layer.

    bf16: ``kv_lora_rank + rope_dim`` bf16 elements per token (576 -> 1152 B). fp8: one
    opaque 656 B row per token (512 fp8 nope + 4 fp32 scales + 64 bf16 rope), scales inline.
    """
    t = _rows(page_size, tokens_per_row)
    if fp8:
        buf = BufferSpec("kv", (t, kv_lora_rank + 4 * (kv_lora_rank // 128) + 2 * rope_dim), torch.uint8)
    else:
        buf = BufferSpec("kv", (t, kv_lora_rank + rope_dim), torch.bfloat16)
    return Stack((_anchor("kv", num_layers, [buf], t),), page_size=page_size, model=model)


def dsa(num_layers: int, kv_lora_rank: int = 512, rope_dim: int = 64, index_head_dim: int = 128,
        page_size: int = 64, tokens_per_row: int | None = None, model: str = "dsa") -> Stack:
    """DSA (DeepSeek-V3.2): fp8 MLA ``kv`` plus an fp8 ``indexer`` key and its fp32 ``indexer_scale``."""
    t = _rows(page_size, tokens_per_row)
    base = mla(num_layers, kv_lora_rank, rope_dim, fp8=True, page_size=page_size, tokens_per_row=t).anchor
    bufs = [*base.buffers, BufferSpec("indexer", (t, index_head_dim), FP8),
            BufferSpec("indexer_scale", (t, max(1, index_head_dim // 128)), torch.float32)]
    return Stack((_anchor("kv", num_layers, bufs, t),), page_size=page_size, model=model)
