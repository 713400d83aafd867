"""DeepSeek-V4's compressors and Lightning indexer over hicache's pools.

A compressor turns every ``r`` tokens into one entry: per token a kv and a gate
projection, a softmax over the window's gates (plus a learned position bias), an RMS
norm and RoPE at the window's first position. CSA (``r = 4``) overlaps windows: entry
``w`` pools window ``w - 1``'s first series (Ca) with window ``w``'s second (Cb), so it
needs the previous window's tokens; HCA (``r = 16`` here, 128 in the real model) does not
overlap.

    positions   ... | window w-1 (Ca half) | window w (Cb half) | partial window ... |
    CSA entry w      <------ 2r slots, softmax over both ------>
    ring (2r slots)  the last 2r tokens' [kv | gate]: Ca of the last window + the partial one
    HCA entry w                            <--- r slots --->
    scratch          the partial HCA window's tokens (request-local; empty at page boundaries)

Entries go to their page's row of the entry pool (``c4_kv``, ``c4_indexer``, ``c128_kv``);
the CSA per-token state goes to the working row's ring (``c4_state``,
``c4_indexer_state``). The indexer scores every causally visible entry with
``sum_h w_h * ReLU(q_h . k)`` and keeps the top ``index_topk``: the attention's mask over
the CSA entries.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from hicache.reference.ops import W, rms_norm, rope_cos_sin, rope_interleaved
from hicache.reference.paged import PagedSeq


class Compressor(NamedTuple):
    """One compressor of a layer: its weights' prefix and where its outputs live."""

    prefix: str  # weight names: {prefix}.kv_proj.weight, .gate_proj.weight, .position_bias, .kv_norm.weight
    ratio: int
    dim: int  # entry width
    pool: str  # the entries' pool
    ring: str | None  # the CSA state ring's pool; None: non-overlapping (HCA), state in scratch


class Rope(NamedTuple):
    """The compressed layers' RoPE: rotary dims and base."""

    dim: int
    theta: float


def compress(w: W, c: Compressor, seq: PagedSeq, layer: int, x: torch.Tensor, rope: Rope, eps: float) -> int:
    """Feed the chunk ``x`` (positions ``[seq.length, +len(x))``) to ``c``; write the entries of
    every window it completes. Mutates the pools (entries, ring) and ``seq.scratch``.

    Returns:
        Entries emitted so far (``end // ratio``).
    """
    start, r = seq.length, c.ratio
    end = start + x.shape[0]
    kv, gate = x @ w[f"{c.prefix}.kv_proj.weight"].T, x @ w[f"{c.prefix}.gate_proj.weight"].T
    first, last = start // r, end // r
    if c.ring is not None:  # the ring holds [base, start): Ca of the last window + the partial one
        base = max(0, (first - 1) * r)
        old = seq.read_ring(c.ring, layer, base, start).to(x.dtype)
        # the chunk's own tokens as the ring holds them (fp32 under a float64 model): the same
        # values whether a later window reads them from this chunk or from the ring
        new = seq.round_trip(c.ring, torch.cat([kv, gate], dim=-1))
        seq.write_ring(c.ring, layer, start, new)
        kv, gate = new.split(kv.shape[-1], dim=-1)
        old_kv, old_gate = old.split(kv.shape[-1], dim=-1)
    else:
        base = first * r
        old_kv, old_gate = seq.scratch.get(layer, (kv[:0], gate[:0]))
    all_kv, all_gate = torch.cat([old_kv, kv]), torch.cat([old_gate, gate])
    if c.ring is None:
        seq.scratch[layer] = (all_kv[last * r - base:], all_gate[last * r - base:])
    if last > first:
        windows = torch.arange(first, last, device=x.device)
        entries = _pool(w, c, all_kv, all_gate, windows, base)
        entries = rms_norm(entries, w[f"{c.prefix}.kv_norm.weight"], eps)
        entries = rope_interleaved(entries, *rope_cos_sin(windows * r, rope.dim, rope.theta, x.dtype))
        seq.write_entries(c.pool, layer, first, entries)
    return last


def _pool(w: W, c: Compressor, kv: torch.Tensor, gate: torch.Tensor, windows: torch.Tensor, base: int
          ) -> torch.Tensor:
    """Softmax-gated sum over each window's slots (``kv``/``gate`` hold positions ``[base, ...)``)."""
    r, d = c.ratio, c.dim
    bias = w[f"{c.prefix}.position_bias"]
    cur = windows[:, None] * r + torch.arange(r, device=kv.device)[None, :] - base
    if c.ring is None:
        slot_kv, slot_gate = kv[cur], gate[cur] + bias
    else:  # [Ca of window w-1 | Cb of window w]; window 0 has no Ca (zero kv, -inf gate)
        prev = (cur - r).clamp(min=0)
        has_prev = (windows > 0)[:, None, None]
        ca_kv = torch.where(has_prev, kv[prev][..., :d], 0.0)
        ca_gate = torch.where(has_prev, gate[prev][..., :d] + bias[:, :d], -math.inf)
        slot_kv = torch.cat([ca_kv, kv[cur][..., d:]], dim=1)
        slot_gate = torch.cat([ca_gate, gate[cur][..., d:] + bias[:, d:]], dim=1)
    return (slot_kv * slot_gate.softmax(dim=1)).sum(dim=1)


class TopkStats:
    """How the indexer's top-k went: queries with more visible entries than ``k`` (the
    selection was exercised) and the smallest score gap at the selection boundary (a gap
    near 0 would make the selection depend on rounding)."""

    def __init__(self) -> None:
        self.queries = 0
        self.exercised = 0
        self.min_gap = math.inf

    def add(self, scores: torch.Tensor, visible: torch.Tensor, k: int) -> None:
        self.queries += scores.shape[0]
        over = visible > k
        self.exercised += int(over.sum())
        if over.any():
            top = scores[over].topk(k + 1, dim=-1).values
            self.min_gap = min(self.min_gap, float((top[:, k - 1] - top[:, k]).min()))


def index_bias(w: W, p: str, seq: PagedSeq, layer: int, x: torch.Tensor, q_res: torch.Tensor,
               rope: Rope, topk: int, eps: float, stats: TopkStats | None) -> torch.Tensor:
    """The CSA mask ``[n, entries]``: 0 on each query's top-k visible entries, -inf elsewhere.

    Runs the indexer's own compressor first (``c4_indexer`` entries, ``c4_indexer_state`` ring).
    """
    heads, dim = w[f"{p}.scorer.weights_proj.weight"].shape[0], w[f"{p}.kv_norm.weight"].shape[0]
    ratio = w[f"{p}.position_bias"].shape[0]
    count = compress(w, Compressor(p, ratio, dim, "c4_indexer", "c4_indexer_state"), seq, layer, x, rope, eps)
    n = x.shape[0]
    pos = torch.arange(seq.length, seq.length + n, device=x.device)
    keys = seq.read_entries("c4_indexer", layer, count).to(x.dtype)
    q = (q_res @ w[f"{p}.q_b_proj.weight"].T).view(n, heads, dim)
    q = rope_interleaved(q, *rope_cos_sin(pos, rope.dim, rope.theta, x.dtype))
    scores = F.relu(torch.einsum("nhd,ed->nhe", q, keys)) * dim ** -0.5
    weights = (x @ w[f"{p}.scorer.weights_proj.weight"].T) * heads ** -0.5
    scores = (scores * weights.unsqueeze(-1)).sum(dim=1)
    visible = (pos + 1) // ratio
    future = torch.arange(count, device=x.device)[None, :] >= visible[:, None]
    scores = scores.masked_fill(future, -math.inf)
    bias = torch.full((n, count + 1), -math.inf, device=x.device)
    if count:
        k = min(topk, count)
        top = scores.topk(k, dim=-1).indices
        top = torch.where(top < visible[:, None], top, count)  # invalid picks land in the spare column
        bias.scatter_(-1, top, 0.0)
        if stats is not None:
            stats.add(scores, visible, k)
    return bias[:, :count]
