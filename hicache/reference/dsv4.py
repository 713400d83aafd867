"""`Dsv4Model`: a tiny DeepSeek-V4 whose attention state lives in hicache's device pools.

One forward feeds a chunk of tokens at positions ``[seq.length, seq.length + n)`` (a
prefill, a piece of one, or one decode token) and returns their logits. Per layer:

    layer kind   keys attended by query p                        pools read / written
    SWA only     K=V of tokens (p - window, p]                   swa ring
    CSA (4)      + the indexer's top-k of entries e < (p+1)//4    + c4_kv, c4_indexer entries,
                                                                   c4_state, c4_indexer_state rings
    HCA (16)     + every entry e < (p+1)//16                     + c128_kv entries (+ scratch)

The rest is transformers' DeepSeek-V4 as is: low-rank query with per-head RMS norm,
partial interleaved RoPE (main base for SWA-only layers, the compress base elsewhere),
sink attention, the conjugate rotation of the output, the grouped output projection,
hyper-connections around attention and MoE, and the hyper head.

With ``kv_format="fp8_ds_mla"`` the swa ring and the c4_kv / c4_indexer / c128_kv entries are
the real model's fp8 byte rows (`hicache.reference.fp8_ds_mla`): writes quantize, reads
dequantize, and the chunk's own window keys are attended as a read would return them, so a
token's keys are the same whether it came from the pool or from the chunk being computed.
"""
from __future__ import annotations

import math

import torch

from hicache.reference import fp8_ds_mla
from hicache.reference.compressor import Compressor, Rope, TopkStats, compress, index_bias
from hicache.reference.config import Dsv4Config
from hicache.reference.ops import (hyper_connection, hyper_head, hyper_mix, moe, rms_norm, rope_cos_sin,
                                   rope_interleaved, sink_attention)
from hicache.reference.paged import PagedModel, PagedSeq
from hicache.reference.weights import dsv4_weights


class Dsv4Model(PagedModel):
    """The reference DeepSeek-V4 (random weights from ``cfg.seed``), on ``device``, computing in
    ``dtype`` (default ``cfg.compute_dtype``: fp32, float64 with fp8 pools).

    Attributes:
        topk: statistics of the indexer's selections since construction (`TopkStats`).
        codecs: the fp8 pools' codecs (``kv_format="fp8_ds_mla"``), else none.
    """

    def __init__(self, cfg: Dsv4Config, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
                 ) -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.dtype = cfg.compute_dtype if dtype is None else dtype
        self.w = {k: v.to(self.device, self.dtype if v.is_floating_point() else v.dtype)
                  for k, v in dsv4_weights(cfg).items()}
        self.compress_rope = Rope(cfg.rope_dim, cfg.compress_rope_theta)
        self.topk = TopkStats()
        self.codecs = fp8_ds_mla.codecs(cfg) if cfg.kv_format == "fp8_ds_mla" else {}

    def _logits(self, seq: PagedSeq, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        h = w["model.embed_tokens.weight"][ids].unsqueeze(1).expand(ids.numel(), cfg.hc_mult, -1)
        for layer, ratio in enumerate(cfg.compress_ratios):
            h = self._layer(seq, layer, ratio, h, ids, pos)
        x = rms_norm(hyper_head(w, h, cfg.hc_eps, cfg.rms_eps), w["model.norm.weight"], cfg.rms_eps)
        return x @ w["lm_head.weight"].T

    def _layer(self, seq: PagedSeq, layer: int, ratio: int, h: torch.Tensor, ids: torch.Tensor,
               pos: torch.Tensor) -> torch.Tensor:
        cfg, w, p = self.cfg, self.w, f"model.layers.{layer}"
        post, comb, x = hyper_connection(w, f"{p}.attn_hc", h, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_eps)
        out = self._attention(seq, layer, ratio, rms_norm(x, w[f"{p}.input_layernorm.weight"], cfg.rms_eps), pos)
        h = hyper_mix(post, comb, out, h)
        post, comb, x = hyper_connection(w, f"{p}.ffn_hc", h, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_eps)
        x = rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], cfg.rms_eps)
        out = moe(w, f"{p}.mlp", x, ids, cfg.experts_per_token, cfg.routed_scaling, cfg.swiglu_limit)
        return hyper_mix(post, comb, out, h)

    def _attention(self, seq: PagedSeq, layer: int, ratio: int, x: torch.Tensor, pos: torch.Tensor
                   ) -> torch.Tensor:
        cfg, w, p = self.cfg, self.w, f"model.layers.{layer}.self_attn"
        n, hd = x.shape[0], cfg.head_dim
        theta = cfg.rope_theta if ratio == 0 else cfg.compress_rope_theta
        cos, sin = rope_cos_sin(pos, cfg.rope_dim, theta, self.dtype)
        q_res = rms_norm(x @ w[f"{p}.q_a_proj.weight"].T, w[f"{p}.q_a_norm.weight"], cfg.rms_eps)
        q = rms_norm((q_res @ w[f"{p}.q_b_proj.weight"].T).view(n, cfg.num_heads, hd), None, cfg.rms_eps)
        q = rope_interleaved(q, cos, sin)
        kv = rope_interleaved(rms_norm(x @ w[f"{p}.kv_proj.weight"].T, w[f"{p}.kv_norm.weight"], cfg.rms_eps),
                              cos, sin)
        keys, bias = self._window(seq, layer, kv, pos)
        if ratio:
            entries, entry_bias = self._compressed(seq, layer, ratio, x, q_res, pos)
            keys, bias = torch.cat([keys, entries]), torch.cat([bias, entry_bias], dim=1)
        out = sink_attention(q, keys, bias, w[f"{p}.sinks"], hd ** -0.5)
        out = rope_interleaved(out, cos, -sin)  # K = V carried RoPE: rotate it back at the query
        groups = out.reshape(n, cfg.o_groups, -1)
        wa = w[f"{p}.o_a_proj.weight"].view(cfg.o_groups, cfg.o_lora_rank, -1)
        return torch.einsum("ngi,goi->ngo", groups, wa).reshape(n, -1) @ w[f"{p}.o_b_proj.weight"].T

    def _window(self, seq: PagedSeq, layer: int, kv: torch.Tensor, pos: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys of the sliding window (the ring's last ``window - 1`` tokens, then the chunk's)
        and their mask; the chunk's K=V goes into the ring (and is attended as read back)."""
        start = seq.length
        first = max(0, start - self.cfg.window + 1)
        keys = torch.cat([seq.read_ring("swa", layer, first, start).to(kv.dtype), seq.round_trip("swa", kv)])
        seq.write_ring("swa", layer, start, kv)
        key_pos = torch.arange(first, start + kv.shape[0], device=kv.device)
        seen = (key_pos[None, :] <= pos[:, None]) & (key_pos[None, :] > pos[:, None] - self.cfg.window)
        return keys, torch.where(seen, 0.0, -math.inf)

    def _compressed(self, seq: PagedSeq, layer: int, ratio: int, x: torch.Tensor, q_res: torch.Tensor,
                    pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's compressed entries (from its pool, this chunk's written first) and their mask."""
        cfg, p = self.cfg, f"model.layers.{layer}.self_attn.compressor"
        csa = ratio == cfg.c4_ratio
        c = Compressor(p, ratio, cfg.head_dim, "c4_kv" if csa else "c128_kv", "c4_state" if csa else None)
        count = compress(self.w, c, seq, layer, x, self.compress_rope, cfg.rms_eps)
        entries = seq.read_entries(c.pool, layer, count).to(x.dtype)
        if csa:
            bias = index_bias(self.w, f"{p}.indexer", seq, layer, x, q_res, self.compress_rope, cfg.index_topk,
                              cfg.rms_eps, self.topk)
        else:
            visible = torch.arange(count, device=x.device)[None, :] < ((pos + 1) // ratio)[:, None]
            bias = torch.where(visible, 0.0, -math.inf)
        return entries, bias
