"""The reference models' configs: dims, layer schedule, pool stack and identity.

Two tiny random-weight models run on hicache's own device pools:

    arch          pools it reads and writes                      layer schedule
    deepseek-v4   swa, c4_kv, c4_indexer, c128_kv (HCA ratio     0 (SWA only), then 4 (CSA)
                  16: the pool keeps the name c128_kv), c4_state, and 16 (HCA) alternating:
                  c4_indexer_state                               [0, 4, 16, 4, 16, ...]
    mha           kv (k and v, GQA)                              every layer full attention
    qwen3.5,      attn_kv, conv, recurrent                       `hicache.reference.linear_config`
    nemotron-h

DeepSeek-V4 keeps the real model's proportions where they decide what a cache must hold:
page 32 : HCA ratio 16 = 2, as 256 : 128 (a page boundary never cuts an HCA window, so the
HCA compressor's partial window is empty there and is not offloaded: the running request
keeps it in request-local scratch), while the CSA ratio 4 overlaps windows, so its
compressor state (``c4_state``, ``c4_indexer_state``) is needed at every page boundary.

``kv_format`` picks the rows of DeepSeek-V4's history and window pools: ``fp32`` (typed rows,
the default) or ``fp8_ds_mla``, the real model's byte rows (fp8 NoPE with UE8M0 tile scales,
bf16 RoPE, fp8 indexer keys with fp32 scales; `hicache.reference.fp8_ds_mla`), scaled to the
toy's dims. The compressor state rings stay fp32 in both.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from host_pools.spec import Stack
from hicache.reference import fp8_ds_mla
from hicache.reference.linear_config import LinearConfig, NemotronHConfig, Qwen35Config, check_positive
from hicache.models.deepseek_v4 import V4Geometry, deepseek_v4, geometry_for_dims
from hicache.models.dense import mha

ARCHS = ("deepseek-v4", "mha", "qwen3.5", "nemotron-h")
KV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # the MHA toy's kv pool (--kv-dtype)
KV_DTYPE_NAMES = {v: k for k, v in KV_DTYPES.items()}
KV_FORMATS = ("fp32", "fp8_ds_mla")  # DeepSeek-V4's pool rows


@dataclass(frozen=True)
class Dsv4Config:
    """A tiny DeepSeek-V4 (transformers' ``DeepseekV4Config`` fields, small dims).

    Attributes:
        num_layers: decoder layers (ratios ``[0, 4, 16, 4, 16, ...]``).
        hidden_size / vocab_size: residual width and vocabulary.
        num_heads / head_dim / rope_dim: query heads, the one K=V head's dim and its
            trailing rotary slice.
        window: sliding-window tokens; page_size: anchor tokens per page.
        c4_ratio / hca_ratio: CSA and HCA compression ratios.
        q_lora_rank, o_groups, o_lora_rank: low-rank query and grouped output projection.
        index_n_heads / index_head_dim / index_topk: the Lightning indexer (top-k below the
            number of compressed entries of a conversation, so the selection is exercised).
        num_experts / experts_per_token / moe_intermediate / num_hash_layers: the MoE
            (the first ``num_hash_layers`` route by a token-id table).
        hc_mult / hc_sinkhorn_iters: hyper-connection streams and Sinkhorn iterations.
        seed: the weights' seed.
        kv_format: ``fp32`` or ``fp8_ds_mla`` (`KV_FORMATS`); fp8_tile: NoPE channels per
            UE8M0 scale in ``fp8_ds_mla`` (the real model's 64 of 448; here 16 of 48).
    """

    num_layers: int = 4
    hidden_size: int = 64
    vocab_size: int = 256
    num_heads: int = 2
    head_dim: int = 64
    rope_dim: int = 16
    window: int = 16
    page_size: int = 32
    c4_ratio: int = 4
    hca_ratio: int = 16
    q_lora_rank: int = 32
    o_groups: int = 2
    o_lora_rank: int = 16
    index_n_heads: int = 16
    index_head_dim: int = 32
    index_topk: int = 4
    num_experts: int = 4
    experts_per_token: int = 2
    moe_intermediate: int = 32
    num_hash_layers: int = 1
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rms_eps: float = 1e-6
    hc_eps: float = 1e-6
    swiglu_limit: float = 10.0
    routed_scaling: float = 1.5
    seed: int = 0
    kv_format: str = "fp32"
    fp8_tile: int = 16

    arch = "deepseek-v4"

    def __post_init__(self) -> None:
        check_positive(self, ("num_layers", "hidden_size", "vocab_size", "num_heads", "head_dim", "rope_dim",
                               "window", "page_size", "q_lora_rank", "o_groups", "o_lora_rank", "index_n_heads",
                               "index_head_dim", "index_topk", "num_experts", "experts_per_token",
                               "moe_intermediate", "hc_mult", "hc_sinkhorn_iters"))
        if self.rope_dim % 2 or self.rope_dim > min(self.head_dim, self.index_head_dim):
            raise ValueError(f"Dsv4Config.rope_dim: must be even and <= head_dim and index_head_dim, got {self.rope_dim}")
        if (self.num_heads * self.head_dim) % self.o_groups:
            raise ValueError(f"Dsv4Config.o_groups: must divide num_heads * head_dim, got {self.o_groups}")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"Dsv4Config.experts_per_token: must be <= num_experts={self.num_experts}")
        if self.kv_format not in KV_FORMATS:
            raise ValueError(f"kv_format (--kv-format): must be one of {', '.join(KV_FORMATS)}, got {self.kv_format!r}")
        self.geometry()  # page / window / ratio checks

    @property
    def compress_ratios(self) -> tuple[int, ...]:
        """Per layer: 0 for layer 0, then the CSA and HCA ratios alternating."""
        pattern = (self.c4_ratio, self.hca_ratio)
        return tuple(0 if i == 0 else pattern[(i - 1) % 2] for i in range(self.num_layers))

    @property
    def identity(self) -> str:
        """The model identity (storage namespaces): arch, dims and seed."""
        return (f"hicache-reference/deepseek-v4-L{self.num_layers}-h{self.hidden_size}-d{self.head_dim}"
                f"-w{self.window}-p{self.page_size}-r{self.c4_ratio}x{self.hca_ratio}-k{self.index_topk}"
                f"-v{self.vocab_size}-seed{self.seed}"
                + ("" if self.kv_format == "fp32" else f"-{self.kv_format}-t{self.fp8_tile}"))

    @property
    def compute_dtype(self) -> torch.dtype:
        """The model's math: fp32, or float64 with fp8 pools. Quantizing turns a last-bit
        difference (a chunk computed in one matmul or in several) into a whole fp8 / bf16 step;
        in float64 a token's values round to the same fp32 whatever the chunking, so its fp8
        bytes are the same in a served request and in its recompute."""
        return torch.float32 if self.kv_format == "fp32" else torch.float64

    def geometry(self) -> V4Geometry:
        """The stack's geometry: page, window, ratios and rows shaped by the head dims (fp32, or
        ``fp8_ds_mla`` byte rows for swa and the history pools)."""
        g = geometry_for_dims(self.page_size, self.window, self.c4_ratio, self.hca_ratio, self.head_dim,
                              self.index_head_dim, torch.float32)
        if self.kv_format == "fp32":
            return g
        rows = {name: replace(getattr(g, name), row_shape=(lay.row_bytes,), dtype=torch.uint8)
                for name, lay in fp8_ds_mla.layouts(self).items()}
        return replace(g, **rows)

    def stack(self) -> Stack:
        """The hicache stack whose pools this model reads and writes."""
        return deepseek_v4(self.compress_ratios, self.identity, geometry=self.geometry())


@dataclass(frozen=True)
class MhaConfig:
    """A tiny Llama-style GQA model on an ``mha`` stack (``k`` and ``v`` per page row).

    Attributes:
        num_layers, hidden_size, vocab_size, intermediate_size: the usual.
        num_heads / num_kv_heads / head_dim: GQA shape.
        page_size: tokens per page (one row of the ``kv`` pool).
        seed: the weights' seed.
        kv_dtype: the ``kv`` pool's dtype: fp32 (default), or bf16 (a server's KV, the one an
            int8 host tier quantizes); the model computes in fp32 either way.
    """

    num_layers: int = 4
    hidden_size: int = 64
    vocab_size: int = 256
    intermediate_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    page_size: int = 32
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    seed: int = 0
    kv_dtype: torch.dtype = torch.float32

    arch = "mha"

    def __post_init__(self) -> None:
        check_positive(self, ("num_layers", "hidden_size", "vocab_size", "intermediate_size", "num_heads",
                               "num_kv_heads", "head_dim", "page_size"))
        if self.num_heads % self.num_kv_heads or self.head_dim % 2:
            raise ValueError(f"MhaConfig.num_kv_heads: must divide num_heads={self.num_heads} "
                             f"(and head_dim={self.head_dim} must be even)")
        if self.kv_dtype not in KV_DTYPES.values():
            raise ValueError(f"MhaConfig.kv_dtype: must be one of {tuple(KV_DTYPES.values())}, got {self.kv_dtype}")

    @property
    def identity(self) -> str:
        """The model identity (storage namespaces); a bf16 pool's pages differ, so it says so."""
        kv = "" if self.kv_dtype == torch.float32 else "-" + KV_DTYPE_NAMES[self.kv_dtype]
        return (f"hicache-reference/mha-L{self.num_layers}-h{self.hidden_size}-q{self.num_heads}"
                f"-kv{self.num_kv_heads}-d{self.head_dim}-p{self.page_size}-v{self.vocab_size}-seed{self.seed}{kv}")

    def stack(self) -> Stack:
        return mha(self.num_layers, self.num_kv_heads, self.head_dim, self.kv_dtype, page_size=self.page_size,
                   model=self.identity)


ToyConfig = Dsv4Config | MhaConfig | LinearConfig
LINEAR_ARCHS = {"qwen3.5": Qwen35Config, "nemotron-h": NemotronHConfig}


def toy_config(arch: str, num_layers: int, seed: int, kv_format: str = "fp32",
               kv_dtype: str = "float32") -> ToyConfig:
    """The default config of ``arch`` with ``num_layers`` layers, weights from ``seed`` and
    (DeepSeek-V4) pool rows in ``kv_format`` / (MHA) a ``kv`` pool of ``kv_dtype``.

    Args:
        kv_format: DeepSeek-V4's pool rows, one of `KV_FORMATS` (the others: fp32 only).
        kv_dtype: the MHA toy's ``kv`` pool dtype, a key of `KV_DTYPES` (the others: float32 only).
    Raises:
        ValueError: unknown ``arch``, ``kv_format`` or ``kv_dtype`` (naming the allowed ones), a
            ``kv_format`` other than fp32 for mha or a ``kv_dtype`` other than float32 for
            deepseek-v4, ``num_layers`` < 1 or ``seed`` < 0.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch (--arch): must be one of {', '.join(ARCHS)}, got {arch!r}")
    if num_layers < 1:
        raise ValueError(f"num_layers (--layers): must be >= 1, got {num_layers}")
    if seed < 0:
        raise ValueError(f"seed (--seed): must be >= 0, got {seed}")
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype (--kv-dtype): must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    if arch in LINEAR_ARCHS:
        if kv_format != "fp32":
            raise ValueError(f"kv_format (--kv-format): {kv_format!r} is a DeepSeek-V4 format; the {arch} toy's "
                             "pools are float64")
        if kv_dtype != "float32":
            raise ValueError(f"kv_dtype (--kv-dtype): {kv_dtype} is for --arch mha; the {arch} toy's pools are float64")
        return LINEAR_ARCHS[arch](num_layers=num_layers, seed=seed)
    if arch == "deepseek-v4":
        if kv_dtype != "float32":
            raise ValueError(f"kv_dtype (--kv-dtype): {kv_dtype} is for --arch mha; deepseek-v4's pools are "
                             "set by --kv-format")
        return Dsv4Config(num_layers=num_layers, seed=seed, kv_format=kv_format)
    if kv_format != "fp32":
        raise ValueError(f"kv_format (--kv-format): {kv_format!r} is a DeepSeek-V4 format; the mha model "
                         "takes fp32 only (its kv pool's dtype: --kv-dtype)")
    return MhaConfig(num_layers=num_layers, seed=seed, kv_dtype=KV_DTYPES[kv_dtype])
