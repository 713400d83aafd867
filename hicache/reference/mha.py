"""`MhaModel`: a tiny Llama-style GQA model whose K and V live in an ``mha`` stack's ``kv`` pool.

Token ``p`` of a request is slot ``slots[p]``: row ``slots[p] // page_size`` (a page) and
offset ``slots[p] % page_size`` in both buffers (``k``, ``v``: ``[rows, page, kv_heads,
head_dim]``). A chunk writes its K and V there first, then every query attends causally
to the keys of positions ``[0, p]`` read back from the pool.
"""
from __future__ import annotations

import math

import torch

from hicache.reference.config import MhaConfig
from hicache.reference.ops import gqa_attention, rms_norm, rope_cos_sin, rope_half, swiglu
from hicache.reference.paged import PagedModel, PagedSeq
from hicache.reference.weights import mha_weights


class MhaModel(PagedModel):
    """The reference GQA model (fp32, random weights from ``cfg.seed``), on ``device``."""

    def __init__(self, cfg: MhaConfig, device: str | torch.device = "cpu") -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.w = {k: v.to(self.device) for k, v in mha_weights(cfg).items()}

    def _logits(self, seq: PagedSeq, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        n = ids.numel()
        cos, sin = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
        key_pos = torch.arange(seq.length + n, device=self.device)
        bias = torch.where(key_pos[None, :] <= pos[:, None], 0.0, -math.inf)
        x = w["model.embed_tokens.weight"][ids]
        for layer in range(cfg.num_layers):
            p = f"model.layers.{layer}"
            x = x + self._attention(seq, layer, rms_norm(x, w[f"{p}.input_layernorm.weight"], cfg.rms_eps),
                                    cos, sin, bias)
            h = rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], cfg.rms_eps)
            x = x + swiglu(h @ w[f"{p}.mlp.gate_proj.weight"].T, h @ w[f"{p}.mlp.up_proj.weight"].T, None) \
                @ w[f"{p}.mlp.down_proj.weight"].T
        return rms_norm(x, w["model.norm.weight"], cfg.rms_eps) @ w["lm_head.weight"].T

    def _attention(self, seq: PagedSeq, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   bias: torch.Tensor) -> torch.Tensor:
        cfg, w, p = self.cfg, self.w, f"model.layers.{layer}.self_attn"
        n, d = x.shape[0], cfg.head_dim
        q = rope_half((x @ w[f"{p}.q_proj.weight"].T).view(n, cfg.num_heads, d), cos, sin)
        k = rope_half((x @ w[f"{p}.k_proj.weight"].T).view(n, cfg.num_kv_heads, d), cos, sin)
        v = (x @ w[f"{p}.v_proj.weight"].T).view(n, cfg.num_kv_heads, d)
        # a bf16 pool is read back as fp32: the model computes in fp32 whatever the pool holds
        keys, values = seq.append_kv("kv", layer, k, v)
        out = gqa_attention(q, keys, values, bias).reshape(n, -1)
        return out @ w[f"{p}.o_proj.weight"].T
