"""Stateless pieces of the linear-attention reference models (fp32, token-major tensors).

Each is transformers' pure-torch path written over a state passed in and handed back, so
the paged models keep the state in hicache's pools between chunks:

    causal_conv      the depthwise causal conv over the previous ``kernel - 1`` inputs
                     (transformers' ``causal_conv1d_update``: the inputs before it, then conv)
    gated_delta      Qwen3.5 / Qwen3-Next's gated delta rule, token by token
                     (``torch_recurrent_gated_delta_rule``, the same operations in the same order)
    mamba2_scan      Nemotron-H's Mamba-2 SSM, token by token (``mamba2_selective_state_update``)
    gated_rms_norm   the DeltaNet output norm (norm, weight, then the SiLU gate) and Mamba-2's
                     (gate first, then a norm per group, then weight)

Token by token, a state carried across any cut of a sequence gives the same numbers as
one pass: a request restored at a boundary computes what an uninterrupted run does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU(depthwise causal conv) of ``x`` ``[n, C]`` after the ``state`` ``[kernel - 1, C]``
    (the inputs before it; zeros at the start), weight ``[C, kernel]``. Returns the output
    ``[n, C]`` and the new state (the last ``kernel - 1`` inputs)."""
    full = torch.cat([state.to(x.dtype), x])
    out = F.conv1d(full.T.unsqueeze(0), weight.unsqueeze(1), bias, groups=x.shape[1])[0].T
    return F.silu(out), full[-state.shape[0]:]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over ``n`` tokens.

    Args:
        q, k: ``[n, key_heads, d_k]`` (L2-normalised here, q scaled by ``d_k ** -0.5``;
            each key head serves ``value_heads // key_heads`` value heads).
        v: ``[n, value_heads, d_v]``; g (log decay, <= 0), beta: ``[n, value_heads]``.
        state: ``[value_heads, d_k, d_v]`` before the first token.
    Returns:
        ``[n, value_heads, d_v]`` and the state after the last token.
    """
    rep = v.shape[1] // k.shape[1]
    q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
    q, k = l2norm(q), l2norm(k)
    q = q / (q.shape[-1] ** 0.5)
    s = state.to(v.dtype)
    out = torch.empty_like(v)
    for t in range(v.shape[0]):
        s = s * g[t].exp()[:, None, None]
        kv_mem = (s * k[t][:, :, None]).sum(dim=-2)
        delta = (v[t] - kv_mem) * beta[t][:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        out[t] = (s * q[t][:, :, None]).sum(dim=-2)
    return out, s


def mamba2_scan(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                d: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Mamba-2 selective scan over ``n`` tokens.

    Args:
        x: ``[n, heads, head_dim]``; dt: ``[n, heads]`` (after softplus and the floor);
        a: ``[heads]`` (negative); b, c: ``[n, groups, ssm_state]`` (each group serves
        ``heads // groups`` heads); d: ``[heads]`` skip; state: ``[heads, head_dim, ssm_state]``.
    Returns:
        ``[n, heads, head_dim]`` and the state after the last token.
    """
    heads, groups = x.shape[1], b.shape[1]
    b, c = b.repeat_interleave(heads // groups, dim=1), c.repeat_interleave(heads // groups, dim=1)
    s = state.to(x.dtype)
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        step = dt[t][:, None, None]
        s = s * torch.exp(step * a[:, None, None]) + (step * b[t][:, None, :]) * x[t][:, :, None]
        out[t] = torch.bmm(s, c[t][:, :, None])[..., 0] + x[t] * d[:, None]
    return out, s


def deltanet_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's ``RMSNormGated`` over the last dim: ``weight * x / rms(x) * silu(gate)``."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y * F.silu(gate)


def mamba2_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """Nemotron-H's ``RMSNormGated``: ``x * silu(gate)``, RMS-normalised per group, times ``weight``."""
    y = x * F.silu(gate)
    grouped = y.view(*y.shape[:-1], groups, -1)
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    return weight * grouped.view_as(y)
