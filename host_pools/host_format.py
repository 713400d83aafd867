"""The host format of a pool: its device rows byte for byte (``auto``), or int8 (opt-in).

With ``--hicache-host-dtype int8`` a bf16/fp16 history pool (MHA/GQA ``k`` and ``v``, the
MLA latent ``kv``) is held on the host as int8 values plus one fp32 absmax scale per vector
(per token and head; `transfer_kernels.quant_ref` defines the bytes). Its host spec lists,
for every device buffer, the int8 buffer (same role and row shape) and then its scales::

    device  kv: k [t, H, D] bf16 | v [t, H, D] bf16                       4 t H D bytes
    host    kv: k [t, H, D] int8 | k_scale [t, H] fp32 | v ... | v_scale   2 t H D + 8 t H

Every other pool keeps its device spec (``int8_refusal`` says why): state pools, indexer
and RoPE-only buffers, and pools already quantized (fp8/int8 KV with scale buffers, every
DeepSeek-V4 pool, DSA). The topology (names, kinds, sources, rows) never changes.
"""
from __future__ import annotations

import dataclasses

import torch

from host_pools.spec import BufferSpec, PoolKind, PoolSpec, Stack

HOST_DTYPES = ("auto", "int8")  # "auto": the device dtype, byte-exact (the default)
QUANTIZABLE = (torch.bfloat16, torch.float16)  # = transfer_kernels.quant.reference.QUANTIZABLE
EXACT_ROLES = ("indexer", "rope", "state")  # buffer role fragments that always stay exact


def int8_refusal(spec: PoolSpec) -> str | None:
    """Why ``spec`` stays exact on an int8 host tier, or ``None`` when it is quantized."""
    if not spec.has_data:
        return "holds no data"
    if spec.kind is PoolKind.STATE:
        return "a state pool (sliding window, compressor or recurrent state)"
    for b in spec.buffers:
        if any(frag in b.role for frag in EXACT_ROLES):
            return f"its {b.role!r} buffer is kept exact (indexer / RoPE / state)"
        if b.dtype not in QUANTIZABLE:
            return f"its {b.role!r} buffer is {str(b.dtype).removeprefix('torch.')} (already quantized or not bf16/fp16)"
    if len({b.dtype for b in spec.buffers}) > 1:
        return "its buffers mix bf16 and fp16"
    return None


def host_spec(spec: PoolSpec, host_dtype: str = "auto") -> PoolSpec:
    """The host spec of ``spec``: the same spec, or its int8 encoding (module docstring).

    Raises:
        ValueError: ``host_dtype`` not one of `HOST_DTYPES`.
    """
    if host_dtype not in HOST_DTYPES:
        raise ValueError(f"host_dtype: must be one of {HOST_DTYPES}, got {host_dtype!r}")
    if host_dtype == "auto" or int8_refusal(spec) is not None:
        return spec
    bufs = []
    for b in spec.buffers:
        bufs += [BufferSpec(b.role, b.row_shape, torch.int8),
                 BufferSpec(f"{b.role}_scale", b.row_shape[:-1] or (1,), torch.float32)]
    return dataclasses.replace(spec, buffers=tuple(bufs))


def is_int8(device: PoolSpec, host: PoolSpec) -> bool:
    """True when ``host`` is the int8 encoding of ``device`` (not its byte-exact mirror)."""
    return host.buffers != device.buffers


def host_stack(stack: Stack, host_dtype: str = "auto") -> Stack:
    """``stack`` with every pool's host spec (the same stack for ``auto``)."""
    if host_dtype == "auto":
        return stack
    return dataclasses.replace(stack, pools=tuple(host_spec(p, host_dtype) for p in stack))
