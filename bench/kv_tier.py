"""A model's KV through hicache's host tier and back: what `host_dtype_accuracy.py` scores.

The KV of one prefix (per layer ``(k, v)``, ``[T, H, D]`` bf16, as a server's device pool
holds it) is written into the device pool of an ``mha`` stack, backed up to the host by the
controller (D2H, quantized there when ``host_dtype`` is ``int8``), the device copy is
overwritten with noise and its slots freed, then loaded back into fresh device slots (H2D,
dequantized there) and read out. The same path a server's hit takes, on CPU.

`reference_round_trip` is the format's definition (`transfer_kernels.quant.reference`) applied
directly: the tier must give the same bytes.
"""
from __future__ import annotations

from typing import Sequence

import torch

import hicache
from hicache.config import HiCacheConfig
from hicache.models.dense import mha
from transfer_kernels.quant.reference import dequantize_int8_ref, quantize_int8_ref

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v), each [T, H, D]


def _check_kv(kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[int, int, int, int]:
    """(layers, tokens, heads, head_dim) of ``kv``; ``ValueError`` when it is not a bf16/fp16 KV."""
    if not kv:
        raise ValueError("kv: needs at least one layer")
    shape, dtype = tuple(kv[0][0].shape), kv[0][0].dtype
    if len(shape) != 3 or dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"kv: layers must be [T, H, D] bf16/fp16, got {shape} {dtype}")
    for i, (k, v) in enumerate(kv):
        if tuple(k.shape) != shape or tuple(v.shape) != shape or k.dtype != dtype or v.dtype != dtype:
            raise ValueError(f"kv[{i}]: k and v must both be {shape} {dtype}")
    return len(kv), *shape


def _host_config(host_dtype: str, backend: str) -> HiCacheConfig:
    """One host token per device token, in ``host_dtype``'s format."""
    return HiCacheConfig(enable_hierarchical_cache=True, hicache_ratio=1.0, io_backend=backend,
                         host_dtype=host_dtype)


def _rows(slots: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    return slots // page, slots % page


def tier_round_trip(kv: Sequence[tuple[torch.Tensor, torch.Tensor]], host_dtype: str = "auto",
                    page_size: int = 64, backend: str = "torch") -> KV:
    """``kv`` backed up to hicache's host tier and loaded back into other device slots.

    Args:
        kv: per layer ``(k, v)``, each ``[T, H, D]`` bf16/fp16 (not changed).
        host_dtype: ``"auto"`` (the device dtype: byte-exact) or ``"int8"``.
        page_size: the stack's page in tokens (the tail of the last page is padding).
        backend: hicache's io backend (``torch``, ``copy_engine``, ``triton``, ``auto``).
    Returns:
        The restored KV, new tensors of ``kv``'s shapes and dtype.
    Raises:
        ValueError: a malformed ``kv``, or a host dtype or backend hicache refuses.
        RuntimeError: a transfer that failed (its ack's error).
    """
    layers, tokens, heads, dim = _check_kv(kv)
    padded = -(-tokens // page_size) * page_size
    stack = mha(layers, heads, dim, kv[0][0].dtype, page_size=page_size)
    cache = hicache.build(stack, 2 * padded, _host_config(host_dtype, backend), device="cpu")
    try:
        pool, ctl = cache.device_pools["kv"], cache.controller
        src = pool.alloc(padded)
        rows, offs = _rows(src[:tokens], page_size)
        for layer, pair in enumerate(kv):
            for buf, t in zip(pool.tensors[layer], pair):
                buf[rows[0]:rows[-1] + 1].zero_()  # padding tokens: zeros (scale 0 in int8)
                buf[rows, offs] = t
        host = ctl.write(src)
        ctl.start_writing()
        _expect_acks(ctl, "d2h")
        for layer in range(layers):  # the device copy is gone: noise, then the slots freed
            for buf in pool.tensors[layer]:
                buf[rows, offs] = torch.randn(tokens, heads, dim).to(buf.dtype)
        pool.free(src)
        dst = ctl.load(host["kv"])
        ctl.start_loading()
        _expect_acks(ctl, "h2d")
        rows, offs = _rows(dst["kv"][:tokens], page_size)
        return [tuple(buf[rows, offs].clone() for buf in pool.tensors[layer]) for layer in range(layers)]
    finally:
        cache.close()


def _expect_acks(ctl, direction: str) -> None:
    acks = ctl.poll()
    bad = [a for a in acks if a.direction != direction or not a.success]
    if not acks or bad:
        raise RuntimeError(f"hicache {direction}: {bad[0].error if bad else 'no ack'}")


def reference_round_trip(kv: Sequence[tuple[torch.Tensor, torch.Tensor]], host_dtype: str = "auto") -> KV:
    """What the host tier must give back: ``kv`` itself, or its int8 round trip by the
    format's definition (`quant_ref`, per token and head)."""
    _check_kv(kv)
    if host_dtype == "auto":
        return [(k.clone(), v.clone()) for k, v in kv]
    if host_dtype != "int8":
        raise ValueError(f"host_dtype: must be one of ('auto', 'int8'), got {host_dtype!r}")
    return [tuple(dequantize_int8_ref(*quantize_int8_ref(t), t.dtype) for t in pair) for pair in kv]


def same_bytes(a: KV, b: KV) -> bool:
    """Whether two KVs are byte for byte equal (never a float comparison)."""
    return len(a) == len(b) and all(
        torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
        for pa, pb in zip(a, b) for x, y in zip(pa, pb))
