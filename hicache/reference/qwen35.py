"""`Qwen35Model`: a tiny Qwen3.5 whose caches live in hicache's device pools.

One forward feeds a chunk of tokens at positions ``[seq.length, seq.length + n)``:

    layer kind            state                                   pools read / written
    Gated DeltaNet        conv window (3 inputs), recurrent state  conv, recurrent: the working row
    full attention        K, V of every earlier token              attn_kv: the pages' rows

The rest is transformers' ``Qwen3_5ForCausalLM`` (text) as is: zero-centred RMS norms
(``x * (1 + w)``), the attention's per-head query / output gate split, q / k norms and
partial RoPE on the first ``rotary`` channels (rotate-half), the DeltaNet's L2-normalised
q / k, decay ``-exp(A_log) softplus(a + dt_bias)``, gated output norm, SwiGLU MLP.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hicache.reference.linear_config import Qwen35Config
from hicache.reference.linear_ops import causal_conv, deltanet_norm, gated_delta
from hicache.reference.linear_weights import qwen35_weights
from hicache.reference.ops import gqa_attention, rms_norm, rope_cos_sin, rope_half
from hicache.reference.paged import PagedModel, PagedSeq


def zc_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's zero-centred RMS norm: ``x / rms(x) * (1 + weight)``."""
    return rms_norm(x, None, eps) * (1.0 + weight)


class Qwen35Model(PagedModel):
    """The reference Qwen3.5 (float64, random weights from ``cfg.seed``), on ``device``."""

    def __init__(self, cfg: Qwen35Config, device: str | torch.device = "cpu") -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.w = {k: v.to(self.device, cfg.compute_dtype) for k, v in qwen35_weights(cfg).items()}

    def _logits(self, seq: PagedSeq, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        cos, sin = rope_cos_sin(pos, cfg.rotary, cfg.rope_theta, cfg.compute_dtype)
        key_pos = torch.arange(seq.length + ids.numel(), device=self.device)
        bias = torch.where(key_pos[None, :] <= pos[:, None], 0.0, -math.inf)
        x = w["model.embed_tokens.weight"][ids]
        for layer, kind in enumerate(cfg.layer_kinds):
            p = f"model.layers.{layer}"
            h = zc_norm(x, w[f"{p}.input_layernorm.weight"], cfg.rms_eps)
            x = x + (self._deltanet(seq, layer, h) if kind == "linear" else self._attention(seq, layer, h, cos, sin, bias))
            h = zc_norm(x, w[f"{p}.post_attention_layernorm.weight"], cfg.rms_eps)
            x = x + (F.silu(h @ w[f"{p}.mlp.gate_proj.weight"].T) * (h @ w[f"{p}.mlp.up_proj.weight"].T)) \
                @ w[f"{p}.mlp.down_proj.weight"].T
        return zc_norm(x, w["model.norm.weight"], cfg.rms_eps) @ w["lm_head.weight"].T

    def _deltanet(self, seq: PagedSeq, layer: int, h: torch.Tensor) -> torch.Tensor:
        cfg, w, p = self.cfg, self.w, f"model.layers.{layer}.linear_attn"
        n, kd, vd = h.shape[0], cfg.key_heads * cfg.key_dim, cfg.value_heads * cfg.value_dim
        conv, state = seq.state("conv", layer), seq.state("recurrent", layer)
        mixed, conv[:] = causal_conv(h @ w[f"{p}.in_proj_qkv.weight"].T, conv, w[f"{p}.conv1d.weight"][:, 0], None)
        q, k, v = mixed.split([kd, kd, vd], dim=-1)
        beta = torch.sigmoid(h @ w[f"{p}.in_proj_b.weight"].T)
        g = -w[f"{p}.A_log"].exp() * F.softplus(h @ w[f"{p}.in_proj_a.weight"].T + w[f"{p}.dt_bias"])
        out, state[:] = gated_delta(q.view(n, cfg.key_heads, cfg.key_dim), k.view(n, cfg.key_heads, cfg.key_dim),
                                    v.view(n, cfg.value_heads, cfg.value_dim), g, beta, state)
        z = (h @ w[f"{p}.in_proj_z.weight"].T).view(n, cfg.value_heads, cfg.value_dim)
        out = deltanet_norm(out, z, w[f"{p}.norm.weight"], cfg.rms_eps)
        return out.reshape(n, vd) @ w[f"{p}.out_proj.weight"].T

    def _attention(self, seq: PagedSeq, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   bias: torch.Tensor) -> torch.Tensor:
        cfg, w, p = self.cfg, self.w, f"model.layers.{layer}.self_attn"
        n, d, r = x.shape[0], cfg.head_dim, cfg.rotary
        q, gate = (x @ w[f"{p}.q_proj.weight"].T).view(n, cfg.num_heads, 2 * d).chunk(2, dim=-1)
        q = zc_norm(q, w[f"{p}.q_norm.weight"], cfg.rms_eps)
        k = zc_norm((x @ w[f"{p}.k_proj.weight"].T).view(n, cfg.num_kv_heads, d), w[f"{p}.k_norm.weight"], cfg.rms_eps)
        v = (x @ w[f"{p}.v_proj.weight"].T).view(n, cfg.num_kv_heads, d)
        q = torch.cat([rope_half(q[..., :r], cos, sin), q[..., r:]], dim=-1)
        k = torch.cat([rope_half(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        keys, values = seq.append_kv("attn_kv", layer, k, v)
        out = gqa_attention(q, keys, values, bias).reshape(n, -1) * torch.sigmoid(gate.reshape(n, -1))
        return out @ w[f"{p}.o_proj.weight"].T
