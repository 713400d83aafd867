"""The int8 host format: what every backend's fused quantize / dequantize must reproduce.

An opt-in host tier (``--hicache-host-dtype int8``) stores a bf16/fp16 device buffer whose
rows are ``[..., D]`` (``D`` = head_dim, or the MLA latent width) as int8 values plus one
fp32 absmax scale per leading index (per token and head):

    device row  x: [..., D] bf16/fp16
    host row    q: [..., D] int8   then   s: [...] fp32     (s follows q, as scales follow data)

These two functions DEFINE the bytes; a kernel, a DMA staging path or any other backend is
correct only when it gives the same bytes (tests compare bytes, never floats).

Quantize (D2H), per vector ``v = x[i, :]`` computed in fp32:
    f      = v where finite, else 0          (NaN and +-inf are stored as 0)
    absmax = max |f|, or 0 when below TINY = 2**-121 (127 / absmax would overflow fp32:
             such a vector is stored as zeros with scale 0)
    s      = absmax / 127                   (IEEE division, fp32)
    inv    = 127 / absmax, or 0 when absmax == 0   (IEEE division, fp32)
    q      = clamp(round_half_even(f * inv), -127, 127)   (the product is one fp32 multiply)
Dequantize (H2D): ``x' = (float32(q) * s).to(device dtype)`` (one fp32 multiply, then the
round-to-nearest-even cast).

-128 is never produced; a row of zeros has scale 0 and comes back as zeros.

Both divisions are tensor / tensor: torch's CPU ``scalar / tensor`` multiplies by a
reciprocal and is not the IEEE quotient (measured: it differs in the last bit).
"""
from __future__ import annotations

import torch

HOST_DTYPES = ("auto", "int8")  # "auto": the device dtype, byte-exact (the default)
QUANTIZABLE = (torch.bfloat16, torch.float16)
QMAX = 127.0
TINY = 2.0 ** -121  # the smallest absmax kept: 127 / TINY < 2**128 (no fp32 overflow)


def int8_row_bytes(row_shape: tuple[int, ...]) -> tuple[int, int]:
    """(int8 data bytes, fp32 scale bytes) of one host row of a ``row_shape`` device buffer."""
    n = 1
    for s in row_shape:
        n *= int(s)
    return n, 4 * (n // int(row_shape[-1]))


def quantize_int8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` (bf16/fp16, last dim = the vector) to int8 values and fp32 scales.

    Returns:
        ``(q, s)``: ``q`` int8 of ``x``'s shape, ``s`` fp32 of ``x.shape[:-1]``; new tensors
        on ``x``'s device. Does not mutate ``x``.
    Raises:
        ValueError: ``x`` is not bf16/fp16 or is 0-dimensional.
    """
    if x.dtype not in QUANTIZABLE:
        raise ValueError(f"x: must be one of {QUANTIZABLE}, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError("x: needs at least one dimension (the quantized vector)")
    # One pass each, in place on the fp32 copy (x.float() copies: x is never written):
    # nan_to_num(0, 0, 0) is where(isfinite(f), f, 0); round_ is round-half-even.
    f = torch.nan_to_num(x.float(), nan=0.0, posinf=0.0, neginf=0.0)
    absmax = f.abs().amax(dim=-1)
    absmax = torch.where(absmax >= TINY, absmax, torch.zeros_like(absmax))
    qmax = torch.full_like(absmax, QMAX)
    s = absmax / qmax
    inv = torch.where(absmax > 0, qmax / torch.where(absmax > 0, absmax, torch.ones_like(absmax)),
                      torch.zeros_like(absmax))
    q = f.mul_(inv.unsqueeze(-1)).round_().clamp_(-QMAX, QMAX).to(torch.int8)
    return q, s


def dequantize_int8_ref(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The device values of host rows ``(q, s)``: ``(float32(q) * s).to(dtype)``.

    Raises:
        ValueError: ``q`` not int8, ``s`` not fp32 of ``q.shape[:-1]``, or ``dtype`` not bf16/fp16.
    """
    if q.dtype != torch.int8:
        raise ValueError(f"q: must be int8, got {q.dtype}")
    if s.dtype != torch.float32 or tuple(s.shape) != tuple(q.shape[:-1]):
        raise ValueError(f"s: must be float32 of shape {tuple(q.shape[:-1])}, "
                         f"got {s.dtype} {tuple(s.shape)}")
    if dtype not in QUANTIZABLE:
        raise ValueError(f"dtype: must be one of {QUANTIZABLE}, got {dtype}")
    return (q.float() * s.unsqueeze(-1)).to(dtype)
