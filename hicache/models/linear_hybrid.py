"""Linear-attention hybrids: Qwen3.5 / Qwen3-Next (Gated DeltaNet) and Nemotron-H (Mamba-2).

A few full-attention layers keep K and V of every token; every linear layer keeps, per
sequence, a causal-conv window and a recurrent state of fixed size, whatever the length.
The stack is DeepSeek-V4's shape with recurrent state roots (DESIGN §3, the STATE family):

    pool       kind     source  tokens/row  row (one layer)                      layers
    kv         ANCHOR   -       1 (page P)  -                                    -
    attn_kv    HISTORY  kv      P           k, v [P, kv_heads, head_dim] bf16    full attention
    conv       STATE    own     1           conv [kernel - 1, conv_dim] bf16     linear (recurrent)
    recurrent  STATE    conv    1           state [heads, d_k, d_v] fp32         linear (recurrent)

A snapshot is one ``conv`` row and the ``recurrent`` row of the same index: the state of
every linear layer after the boundary's last token. A hit must end on a boundary with a
snapshot (`hicache.radix.hybrid`); a server saves one every ``--hicache-state-interval``
tokens and at the prompt's end. Layers without a cache (Nemotron-H's MLP blocks) are in
no pool. The recurrent state is fp32, as the configs' ``mamba_ssm_dtype`` /
``mamba_ssm_cache_dtype`` say (Qwen3-Next's config names none: fp32 too, the dtype
transformers' torch path computes it in and SGLang's default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from host_pools.spec import BufferSpec, PoolKind, PoolSpec, Stack
from hicache.models.shape import Attention, ModelShape, layered_shape

LAYER_KINDS = ("full", "linear", "mlp")  # full attention, a linear (DeltaNet / Mamba-2) mixer, no cache
PAGE_SIZE = 64


@dataclass(frozen=True)
class HybridGeometry:
    """The cache of one linear-attention hybrid.

    Attributes:
        layer_kinds: per model layer, one of `LAYER_KINDS`.
        num_kv_heads / head_dim: the full-attention layers' K and V.
        conv_dim / conv_kernel: the causal conv's channels and width (``kernel - 1``
            inputs are its state).
        state_shape: one linear layer's recurrent state (DeltaNet ``[v_heads, d_k, d_v]``,
            Mamba-2 ``[heads, head_dim, ssm_state]``).
        page_size: anchor tokens per page.
        kv_dtype / conv_dtype / state_dtype: the pools' element types.
    """

    layer_kinds: tuple[str, ...]
    num_kv_heads: int
    head_dim: int
    conv_dim: int
    conv_kernel: int
    state_shape: tuple[int, ...]
    page_size: int = PAGE_SIZE
    kv_dtype: torch.dtype = torch.bfloat16
    conv_dtype: torch.dtype = torch.bfloat16
    state_dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_kinds", tuple(self.layer_kinds))
        bad = sorted({k for k in self.layer_kinds if k not in LAYER_KINDS})
        if not self.layer_kinds or bad:
            raise ValueError(f"layer_kinds: need one of {LAYER_KINDS} per layer, got {bad or 'no layers'}")
        for name in ("num_kv_heads", "head_dim", "conv_dim", "page_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"HybridGeometry.{name}: must be >= 1, got {getattr(self, name)}")
        if self.conv_kernel < 2:
            raise ValueError(f"HybridGeometry.conv_kernel: must be >= 2 (its state is kernel - 1 inputs), "
                             f"got {self.conv_kernel}")

    def layers(self, kind: str) -> tuple[int, ...]:
        """Model layers of ``kind``."""
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == kind)

    def cut(self, num_layers: int) -> "HybridGeometry":
        """The first ``num_layers`` layers (``ValueError`` outside [1, all])."""
        if not 1 <= num_layers <= len(self.layer_kinds):
            raise ValueError(f"num_layers: must be in [1, {len(self.layer_kinds)}], got {num_layers}")
        return replace(self, layer_kinds=self.layer_kinds[:num_layers])


def every_nth_full(num_layers: int, interval: int) -> tuple[str, ...]:
    """Qwen3.5 / Qwen3-Next: layer ``i`` is full attention when ``(i + 1) % interval == 0``
    (transformers' ``full_attention_interval``), linear otherwise."""
    return tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(num_layers))


def from_pattern(pattern: str) -> tuple[str, ...]:
    """Nemotron-H's ``hybrid_override_pattern``: ``M`` Mamba-2, ``*`` attention, ``-`` MLP."""
    kinds = {"M": "linear", "*": "full", "-": "mlp"}
    bad = sorted(set(pattern) - set(kinds))
    if bad:
        raise ValueError(f"hybrid_override_pattern: characters must be M, * or -, got {bad}")
    return tuple(kinds[c] for c in pattern)


def linear_hybrid(geometry: HybridGeometry, model: str = "linear-hybrid") -> Stack:
    """The stack of ``geometry`` (module docstring): a data-less anchor, the full-attention
    KV as a HISTORY sidecar, conv and recurrent state as recurrent STATE pools.

    Raises:
        ValueError: no layer with a cache (only MLP layers).
    """
    g = geometry
    full, linear = g.layers("full"), g.layers("linear")
    if not full and not linear:
        raise ValueError(f"layer_kinds: {len(g.layer_kinds)} layers hold no cache (only MLP layers)")
    pools = [PoolSpec("kv", PoolKind.ANCHOR, 0, (), tokens_per_row=1)]
    if full:
        shape = (g.page_size, g.num_kv_heads, g.head_dim)
        pools.append(PoolSpec("attn_kv", PoolKind.HISTORY, len(full),
                              (BufferSpec("k", shape, g.kv_dtype), BufferSpec("v", shape, g.kv_dtype)),
                              g.page_size, indices_from="kv", layer_ids=full))
    if linear:
        pools += [PoolSpec("conv", PoolKind.STATE, len(linear),
                           (BufferSpec("conv_state", (g.conv_kernel - 1, g.conv_dim), g.conv_dtype),), 1,
                           window_tokens=1, layer_ids=linear, recurrent=True),
                  PoolSpec("recurrent", PoolKind.STATE, len(linear),
                           (BufferSpec("state", g.state_shape, g.state_dtype),), 1, indices_from="conv",
                           window_tokens=1, layer_ids=linear, recurrent=True)]
    return Stack(tuple(pools), page_size=g.page_size, model=model)


def deltanet(layer_kinds: Sequence[str], num_kv_heads: int, head_dim: int, key_heads: int, value_heads: int,
             key_dim: int = 128, value_dim: int = 128, conv_kernel: int = 4, **options) -> HybridGeometry:
    """A Gated DeltaNet hybrid (Qwen3.5, Qwen3-Next): the conv runs over q, k and v
    (``2 key_heads key_dim + value_heads value_dim`` channels), the state is
    ``[value_heads, key_dim, value_dim]``; ``options``: page size and dtypes (`HybridGeometry`)."""
    return HybridGeometry(tuple(layer_kinds), num_kv_heads, head_dim, 2 * key_heads * key_dim + value_heads * value_dim,
                          conv_kernel, (value_heads, key_dim, value_dim), **options)


def mamba2(layer_kinds: Sequence[str], num_kv_heads: int, head_dim: int, heads: int, mamba_head_dim: int,
           n_groups: int, ssm_state: int, conv_kernel: int = 4, **options) -> HybridGeometry:
    """A Mamba-2 hybrid (Nemotron-H): the conv runs over x, B and C (``heads mamba_head_dim +
    2 n_groups ssm_state`` channels), the state is ``[heads, mamba_head_dim, ssm_state]``;
    ``options``: page size and dtypes (`HybridGeometry`)."""
    return HybridGeometry(tuple(layer_kinds), num_kv_heads, head_dim, heads * mamba_head_dim + 2 * n_groups * ssm_state,
                          conv_kernel, (heads, mamba_head_dim, ssm_state), **options)


def hybrid_shape(name: str, g: HybridGeometry, hidden: int, heads: int, mixer_out: int, mlp_params: int,
                 vocab: int, qwen: bool) -> ModelShape:
    """What ``g``'s model computes per token (`hicache.models.shape`), every layer.

    A full layer: q/k/v/o over every token (Qwen's output gate doubles q). A linear layer:
    its input projection into the conv channels, the ``mixer_out`` wide value path and two
    per-head gates, the output projection back, and no attention read but its state update
    (about 6 FLOPs per state element: decay, read, write, output) and the conv. ``qwen``:
    every layer has an MLP of ``mlp_params`` weights; otherwise (Nemotron-H) its ``mlp``
    layers alone. The LM head is untied (``vocab x hidden``).
    """
    hd, kv, mlp = g.head_dim, g.num_kv_heads, mlp_params if qwen else 0
    full = hidden * hd * ((2 if qwen else 1) * heads + 2 * kv) + heads * hd * hidden + mlp
    mixer = hidden * (g.conv_dim + mixer_out + 2 * g.state_shape[0]) + mixer_out * hidden + mlp
    state = 6 * math.prod(g.state_shape) + 2 * g.conv_kernel * g.conv_dim
    return layered_shape(name, g.layer_kinds, {"full": (Attention(heads, hd, hd), full),
                                               "linear": (Attention(0, 0, 0, window=0, state_flops=state), mixer),
                                               "mlp": (Attention(0, 0, 0, window=0), mlp_params)}, hidden * vocab)


# The public configs (each cited where its numbers come from).
# Qwen/Qwen3.5-27B config.json, text_config: 64 layers, full_attention_interval 4, 24 query /
# 4 KV heads of 256, linear 16 key heads / 48 value heads of 128, conv kernel 4, mamba_ssm_dtype float32.
QWEN3_5_27B = deltanet(every_nth_full(64, 4), 4, 256, 16, 48)
# Qwen/Qwen3.5-35B-A3B: transformers 5.23 Qwen3_5MoeTextConfig defaults (its checkpoint): 40 layers,
# interval 4, 16 query / 2 KV heads of 256, linear 16 key / 32 value heads of 128, kernel 4.
QWEN3_5_35B_A3B = deltanet(every_nth_full(40, 4), 2, 256, 16, 32)
# Qwen/Qwen3-Next-80B-A3B-Instruct: transformers 5.23 Qwen3NextConfig defaults (its checkpoint):
# 48 layers, interval 4, 16 query / 2 KV heads of 256, linear 16 key / 32 value heads of 128, kernel 4.
QWEN3_NEXT_80B_A3B = deltanet(every_nth_full(48, 4), 2, 256, 16, 32)
# nvidia/Nemotron-H-8B-Base-8K config.json: 52 layers, hybrid_override_pattern below (24 Mamba-2,
# 4 attention, 24 MLP), 32 query / 8 KV heads of 128, mamba 128 heads of 64, 8 groups, ssm state
# 128, conv kernel 4, mamba_ssm_cache_dtype float32.
NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
NEMOTRON_H_8B = mamba2(from_pattern(NEMOTRON_H_8B_PATTERN), 8, 128, 128, 64, 8, 128)


# Per preset its geometry and what `hybrid_shape` needs beyond it, from the same configs: hidden size,
# query heads, the linear mixer's value width, the MLP weights a token multiplies (Qwen3.5-27B:
# a gated 17,408 MLP; the MoE models: 8 / 10 routed experts of 512 + a shared one of 512 and the
# router; Nemotron-H: a squared-ReLU 21,504 MLP, up and down) and the vocabulary.
HYBRIDS = {
    "qwen3.5-27b": (QWEN3_5_27B, 5120, 24, 48 * 128, 3 * 5120 * 17408, 248320, True),
    "qwen3.5-35b-a3b": (QWEN3_5_35B_A3B, 2048, 16, 32 * 128, 3 * 2048 * 512 * 9 + 2048 * 257, 248320, True),
    "qwen3-next-80b-a3b": (QWEN3_NEXT_80B_A3B, 2048, 16, 32 * 128, 3 * 2048 * 512 * 11 + 2048 * 513, 151936, True),
    "nemotron-h-8b": (NEMOTRON_H_8B, 4096, 32, 128 * 64, 2 * 4096 * 21504, 131072, False),
}
