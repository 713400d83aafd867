"""``--hicache-host-dtype``: the host stack a config asks for, and each int8 pool's codec.

``auto`` (the default) keeps every host pool the device's bytes. ``int8`` turns the
bf16/fp16 history pools into int8 + fp32 scale host pools (`host_pools.host_format`) and
keeps the rest exact, which the start-up log states pool by pool; a stack in which no pool
can be int8 (DeepSeek-V4, fp8/int8 KV presets, DSA) is refused in one line naming the flag,
so the flag never silently does nothing.
"""
from __future__ import annotations

import logging

from host_pools.host_format import host_spec, host_stack, int8_refusal, is_int8
from host_pools.spec import PoolSpec, Stack
from hicache.config import HiCacheConfig, flag_error
from transfer_kernels.quant.codec import Int8Codec

log = logging.getLogger("hicache")


def resolve_host_stack(stack: Stack, config: HiCacheConfig) -> Stack:
    """The host stack of ``stack`` under ``config.host_dtype``.

    Raises:
        ValueError: ``int8`` for a stack without one bf16/fp16 history pool (naming
            ``--hicache-host-dtype`` and why each pool stays exact).
    """
    if config.host_dtype == "auto":
        return stack
    reasons = {p.name: int8_refusal(p) for p in stack.data_pools()}
    if all(reasons.values()):
        why = "; ".join(f"{name}: {r}" for name, r in reasons.items())
        raise flag_error("host_dtype", f"{config.host_dtype} has nothing to quantize in {stack.model} "
                         f"(only bf16/fp16 history pools can be int8; {why}); drop the flag")
    return host_stack(stack, config.host_dtype)


def describe_host_stack(stack: Stack, host: Stack) -> str:
    """One line per pool: int8 or exact and why (the start-up log)."""
    lines = []
    for p in stack.data_pools():
        h = host.pool(p.name)
        if is_int8(p, h):
            lines.append(f"{p.name}: int8 + fp32 scale per vector, {h.row_bytes:,} host B/row/layer "
                         f"(device {p.row_bytes:,})")
        else:
            lines.append(f"{p.name}: exact ({int8_refusal(p)})")
    return "; ".join(lines)


def log_host_stack(stack: Stack, host: Stack) -> None:
    """Log the int8 decision of every pool once (nothing for a byte-exact host stack)."""
    if host is not stack:
        log.info("hicache: --hicache-host-dtype int8: %s", describe_host_stack(stack, host))


def codec_of(device: PoolSpec, host: PoolSpec) -> Int8Codec | None:
    """The codec of ``host``'s rows when it is ``device``'s int8 encoding, else ``None``."""
    if not is_int8(device, host):
        return None
    return Int8Codec.of_shapes(device.buffers[0].dtype, [b.row_shape for b in device.buffers])


def int8_codec(device: PoolSpec) -> Int8Codec | None:
    """The codec of ``device``'s int8 host pool, or ``None`` when it stays exact (vLLM mover)."""
    return codec_of(device, host_spec(device, "int8"))
