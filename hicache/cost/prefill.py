"""`PrefillModel`: the time to prefill ``n`` new tokens after ``c`` cached ones, from a model's shape.

FLOPs (`hicache.models.shape` says what a token computes) summed over the new tokens'
positions in closed form, then over the profile's achieved rates, with a floor at reading
the active weights once from HBM and a fixed cost per forward::

    positions     c+1 ... c+n            (context L of each new token, itself included)
    linear        2 x linear_params x n  + 2 x head_params (the last token's logits)
    attention     sum over L of 2 x heads x (qk + v) x attended(L) + indexer(L) + state
    seconds       fixed_s + max(linear / gemm rate + attention / attention rate,
                                weight_bytes / hbm)

``attended(L) = min(L, window) + min(L // ratio, topk)``: each sum is a difference of
prefix sums (``S(c+n) - S(c)``), so a prefill of any length costs a few dozen operations.
A prefill of no new token (the whole prompt cached) still runs one forward: the prompt's
last token is recomputed for its logits, as servers do.
"""
from __future__ import annotations

from hicache.cost.profile import PrefillRates
from hicache.models.shape import Attention, ModelShape


def _tri(n: int) -> int:
    """1 + 2 + ... + n."""
    return n * (n + 1) // 2


def _sum_min(n: int, w: int) -> int:
    """sum over L = 1..n of min(L, w)."""
    return _tri(n) if n <= w else _tri(w) + w * (n - w)


def _sum_floor(n: int, r: int) -> int:
    """sum over L = 1..n of L // r."""
    q = n // r
    return r * q * (q - 1) // 2 + q * (n - q * r + 1)


def _sum_floor_cap(n: int, r: int, k: int) -> int:
    """sum over L = 1..n of min(L // r, k)."""
    last = (k + 1) * r - 1  # the last L with L // r <= k
    return _sum_floor(n, r) if n <= last else _sum_floor(last, r) + k * (n - last)


class _Term:
    """One layer kind's attention FLOPs over positions 1..L, as prefix sums (`at`)."""

    __slots__ = ("window", "ratio", "topk", "entry", "index", "state")

    def __init__(self, a: Attention, count: int) -> None:
        self.window, self.ratio, self.topk = a.window, a.ratio, a.topk
        self.entry = count * 2 * a.heads * (a.qk_dim + a.v_dim)  # per attended entry, all layers of the kind
        self.index = count * 2 * a.index_heads * a.index_dim  # per compressed entry scored
        self.state = count * a.state_flops

    def at(self, n: int) -> int:
        """FLOPs of positions 1..n."""
        w = self.window
        attended = _tri(n) if w is None else (_sum_min(n, w) if w else 0)
        out = self.state * n
        if self.ratio:
            entries = _sum_floor(n, self.ratio)
            out += self.index * entries
            attended += entries if self.topk is None else _sum_floor_cap(n, self.ratio, self.topk)
        return out + self.entry * attended


class PrefillModel:
    """Prefill time of one model on one device (module docstring).

    Args:
        shape: what the model computes per token.
        rates: the device's achieved rates (a `DeviceProfile`'s ``prefill``).
    Immutable after construction; thread-safe.
    """

    def __init__(self, shape: ModelShape, rates: PrefillRates) -> None:
        self.shape, self.rates = shape, rates
        gemm = rates.fp8_tflops if shape.weight_dtype == "fp8" else rates.bf16_tflops
        self._linear_s = self.linear_s = 2 * shape.linear_params / (gemm * 1e12)  # seconds per token
        self._head_s = 2 * shape.head_params / (gemm * 1e12)
        self._attn_per_flop = 1 / (rates.attention_tflops * 1e12)
        self._floor_s = shape.weight_bytes / (rates.hbm_gbps * 1e9)
        self._terms = tuple(_Term(g.attention, g.count) for g in shape.groups)
        # full attention alone (Llama, Qwen): sum of L over the new positions, one closed form
        full = all(t.window is None and not t.ratio and not t.state and not t.index for t in self._terms)
        self._full_s = sum(t.entry for t in self._terms) * self._attn_per_flop if full else None
        self.fixed_s = rates.fixed_s
        self.floor_s = rates.fixed_s + self._floor_s  # the least a forward takes

    def attention_flops(self, n: int, cached: int) -> int:
        """Attention FLOPs of ``n`` new tokens after ``cached`` ones (every layer)."""
        end = cached + n
        return sum(t.at(end) - t.at(cached) for t in self._terms)

    def flops(self, n: int, cached: int = 0) -> int:
        """Every FLOP of the prefill (linear, logits, attention; ``n`` of 0 as `seconds`)."""
        if n <= 0:
            n, cached = 1, max(cached - 1, 0)
        return 2 * (self.shape.linear_params * n + self.shape.head_params) + self.attention_flops(n, cached)

    def seconds(self, n: int, cached: int = 0) -> float:
        """Estimated seconds to prefill ``n`` new tokens after ``cached`` cached ones (module
        docstring; ``n`` of 0 runs the last prompt token again)."""
        if n <= 0:
            n, cached = 1, (cached - 1 if cached else 0)
        full = self._full_s
        if full is not None:  # the decision's hot path: no call below this one
            attention = full * (n * cached + n * (n + 1) // 2)
        else:
            attention = self.attention_flops(n, cached) * self._attn_per_flop
        compute = self._linear_s * n + self._head_s + attention
        return self.fixed_s + (compute if compute > self._floor_s else self._floor_s)
