"""Stateless pieces of the reference models (fp32, token-major ``[tokens, ...]`` tensors).

The math is transformers' DeepSeek-V4 and Llama, written over plain tensors so the
paged models can feed it keys read from hicache's pools: RMS norms, the two RoPE
layouts, sink attention, hyper-connections (mHC with Sinkhorn), the MoE and SwiGLU.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

W = dict[str, torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``weight * x / rms(x)`` over the last dim (no weight: the unweighted norm)."""
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return y if weight is None else weight * y


def rope_cos_sin(positions: torch.Tensor, rope_dim: int, theta: float, dtype: torch.dtype = torch.float32
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-size cos / sin ``[n, rope_dim // 2]`` at ``positions`` (one angle per pair), in ``dtype``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=dtype) / rope_dim))
    freqs = positions.to(dtype)[:, None] * inv_freq.to(positions.device)[None, :]
    return freqs.cos(), freqs.sin()


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V4 RoPE on the trailing ``2 * cos.shape[-1]`` channels, pairs interleaved.

    ``x`` is ``[n, ..., dim]``; ``cos`` / ``sin`` are ``[n, half]`` (broadcast over heads).
    """
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (-1,)
    c = cos.repeat_interleave(2, dim=-1).reshape(shape)
    s = sin.repeat_interleave(2, dim=-1).reshape(shape)
    d = c.shape[-1]
    nope, rope = x[..., :-d], x[..., -d:]
    rotated = torch.stack((-rope[..., 1::2], rope[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat([nope, rope * c + rotated * s], dim=-1)


def rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama RoPE over the whole head dim (``x`` ``[n, heads, dim]``, halves rotated)."""
    c = torch.cat([cos, cos], dim=-1)[:, None, :]
    s = torch.cat([sin, sin], dim=-1)[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * c + rotated * s


def sink_attention(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, sinks: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """One shared K=V head, a learned sink logit per head.

    Args:
        q: ``[n, heads, dim]``; k: ``[keys, dim]`` (also the values).
        bias: ``[n, keys]`` additive mask (0 or -inf); sinks: ``[heads]``.
    Returns:
        ``[n, heads, dim]``.
    """
    logits = torch.einsum("nhd,kd->nhk", q, k) * scale + bias[:, None, :]
    sink = sinks.view(1, -1, 1).expand(q.shape[0], -1, 1)
    combined = torch.cat([logits, sink], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = F.softmax(combined, dim=-1)[..., :-1]
    return torch.einsum("nhk,kd->nhd", probs, k)


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Llama attention: ``q`` ``[n, heads, d]``, ``k``/``v`` ``[keys, kv_heads, d]``, ``bias`` ``[n, keys]``."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    logits = torch.einsum("nhd,khd->hnk", q, k) * q.shape[-1] ** -0.5 + bias[None]
    probs = F.softmax(logits, dim=-1)
    return torch.einsum("hnk,khd->nhd", probs, v)


def hyper_connection(w: W, p: str, h: torch.Tensor, iters: int, eps: float, rms_eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mHC weights of the streams ``h`` ``[n, hc, hidden]``: (post ``[n, hc]``, comb
    ``[n, hc, hc]``, the collapsed block input ``[n, hidden]``)."""
    n, hc, _ = h.shape
    flat = rms_norm(h.reshape(n, -1), None, rms_eps) @ w[f"{p}.fn"].T
    pre_w, post_w, comb_w = flat.split([hc, hc, hc * hc], dim=-1)
    pre_b, post_b, comb_b = w[f"{p}.base"].split([hc, hc, hc * hc])
    scale = w[f"{p}.scale"]
    pre = torch.sigmoid(pre_w * scale[0] + pre_b) + eps
    post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
    comb = torch.softmax(comb_w.view(n, hc, hc) * scale[2] + comb_b.view(hc, hc), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return post, comb, (pre.unsqueeze(-1) * h).sum(dim=1)


def hyper_mix(post: torch.Tensor, comb: torch.Tensor, out: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The streams after a block: ``post * out`` plus the residual streams mixed by ``comb``."""
    return post.unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), h)


def hyper_head(w: W, h: torch.Tensor, eps: float, rms_eps: float) -> torch.Tensor:
    """The final collapse of the streams ``[n, hc, hidden]`` to ``[n, hidden]``."""
    n = h.shape[0]
    mixes = rms_norm(h.reshape(n, -1), None, rms_eps) @ w["model.hc_head.hc_fn"].T
    pre = torch.sigmoid(mixes * w["model.hc_head.hc_scale"] + w["model.hc_head.hc_base"]) + eps
    return (pre.unsqueeze(-1) * h).sum(dim=1)


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> torch.Tensor:
    """``silu(gate) * up``, DeepSeek-V4 clamping both first (``limit``)."""
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return F.silu(gate) * up


def moe(w: W, p: str, x: torch.Tensor, token_ids: torch.Tensor, top_k: int, scaling: float,
        limit: float) -> torch.Tensor:
    """DeepSeek-V4 MoE: routed experts (hash table or sqrt-softplus top-k) plus the shared one."""
    scores = F.softplus(x @ w[f"{p}.gate.weight"].T).sqrt()
    if f"{p}.gate.tid2eid" in w:
        idx = w[f"{p}.gate.tid2eid"][token_ids].long()
    else:
        idx = torch.topk(scores + w[f"{p}.gate.e_score_correction_bias"], top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, idx)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * scaling
    out = torch.zeros_like(x)
    gate_up, down = w[f"{p}.experts.gate_up_proj"], w[f"{p}.experts.down_proj"]
    for e in idx.unique().tolist():
        tok, slot = torch.where(idx == e)
        g, u = (x[tok] @ gate_up[e].T).chunk(2, dim=-1)
        out.index_add_(0, tok, (swiglu(g, u, limit) @ down[e].T) * weights[tok, slot, None])
    s = f"{p}.shared_experts"
    shared = swiglu(x @ w[f"{s}.gate_proj.weight"].T, x @ w[f"{s}.up_proj.weight"].T, limit)
    return out + shared @ w[f"{s}.down_proj.weight"].T
