"""`NemotronHModel`: a tiny Nemotron-H whose caches live in hicache's device pools.

One forward feeds a chunk of tokens at positions ``[seq.length, seq.length + n)``; each
block is ``x + mixer(rms_norm(x))`` with one mixer per layer:

    mixer        state                                    pools read / written
    Mamba-2      conv window (3 inputs), SSM state         conv, recurrent: the working row
    attention    K, V of every earlier token (no RoPE)     attn_kv: the pages' rows
    MLP          none (relu^2, no gate)                    -

transformers' ``NemotronHForCausalLM`` as is: the Mamba-2 mixer's ``in_proj`` split into
gate, x-B-C (through the biased causal conv and SiLU) and time steps, ``softplus(dt +
dt_bias)`` floored at ``time_step_min``, ``A = -exp(A_log)``, the ``D`` skip, the gated
per-group RMS norm and ``out_proj``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hicache.reference.linear_config import NemotronHConfig
from hicache.reference.linear_ops import causal_conv, mamba2_norm, mamba2_scan
from hicache.reference.linear_weights import nemotron_h_weights
from hicache.reference.ops import gqa_attention, rms_norm
from hicache.reference.paged import PagedModel, PagedSeq


class NemotronHModel(PagedModel):
    """The reference Nemotron-H (float64, random weights from ``cfg.seed``), on ``device``."""

    def __init__(self, cfg: NemotronHConfig, device: str | torch.device = "cpu") -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.w = {k: v.to(self.device, cfg.compute_dtype) for k, v in nemotron_h_weights(cfg).items()}

    def _logits(self, seq: PagedSeq, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        key_pos = torch.arange(seq.length + ids.numel(), device=self.device)
        bias = torch.where(key_pos[None, :] <= pos[:, None], 0.0, -math.inf)
        x = w["model.embeddings.weight"][ids]
        for layer, kind in enumerate(cfg.layer_kinds):
            p = f"model.layers.{layer}.mixer"
            h = rms_norm(x, w[f"model.layers.{layer}.norm.weight"], cfg.rms_eps)
            if kind == "linear":
                x = x + self._mamba2(seq, layer, h)
            elif kind == "full":
                x = x + self._attention(seq, layer, h, bias)
            else:
                x = x + F.relu(h @ w[f"{p}.up_proj.weight"].T).square() @ w[f"{p}.down_proj.weight"].T
        return rms_norm(x, w["model.norm_f.weight"], cfg.rms_eps) @ w["lm_head.weight"].T

    def _mamba2(self, seq: PagedSeq, layer: int, h: torch.Tensor) -> torch.Tensor:
        cfg, w, p = self.cfg, self.w, f"model.layers.{layer}.mixer"
        n, heads, hd, groups = h.shape[0], cfg.mamba_heads, cfg.mamba_head_dim, cfg.n_groups
        inner, bc = heads * hd, groups * cfg.ssm_state
        gate, xbc, dt = (h @ w[f"{p}.in_proj.weight"].T).split([inner, inner + 2 * bc, heads], dim=-1)
        conv, state = seq.state("conv", layer), seq.state("recurrent", layer)
        xbc, conv[:] = causal_conv(xbc, conv, w[f"{p}.conv1d.weight"][:, 0], w[f"{p}.conv1d.bias"])
        x, b, c = xbc.split([inner, bc, bc], dim=-1)
        dt = F.softplus(dt + w[f"{p}.dt_bias"]).clamp(min=cfg.time_step_min)
        y, state[:] = mamba2_scan(x.view(n, heads, hd), dt, -w[f"{p}.A_log"].exp(),
                                  b.view(n, groups, -1), c.view(n, groups, -1), w[f"{p}.D"], state)
        y = mamba2_norm(y.reshape(n, inner), gate, w[f"{p}.norm.weight"], groups, cfg.rms_eps)
        return y @ w[f"{p}.out_proj.weight"].T

    def _attention(self, seq: PagedSeq, layer: int, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        cfg, w, p = self.cfg, self.w, f"model.layers.{layer}.mixer"
        n, d = x.shape[0], cfg.head_dim
        q = (x @ w[f"{p}.q_proj.weight"].T).view(n, cfg.num_heads, d)
        k = (x @ w[f"{p}.k_proj.weight"].T).view(n, cfg.num_kv_heads, d)
        v = (x @ w[f"{p}.v_proj.weight"].T).view(n, cfg.num_kv_heads, d)
        keys, values = seq.append_kv("attn_kv", layer, k, v)
        return gqa_attention(q, keys, values, bias).reshape(n, -1) @ w[f"{p}.o_proj.weight"].T
