"""The int8 host format for vLLM's KV cache groups (``host_dtype: "int8"``).

vLLM hands the plugin each layer's blocks as raw bytes; which of them are bf16/fp16 K and V
vectors comes from the group's KV cache spec (its dtype and ``head_size``, `group_vectors`
in ``spec.py``). A block of ``page_bytes`` is then ``page_bytes / itemsize / head_size``
vectors of ``head_size`` values in vLLM's own order, each stored on the host as int8 values
plus one fp32 absmax scale (`transfer_kernels.quant.reference` defines the bytes)::

    device block   [n x head_size] bf16                   2 n head_size bytes
    host block     [n x head_size] int8 | [n] fp32         n head_size + 4 n bytes

A vector is ``head_size`` consecutive values of the block: one token and head in vLLM's
token-major layouts (the GPU backends' ``[2, block, heads, head_size]``); vLLM's CPU
backend tiles keys across tokens, so there a key vector spans several tokens of one head
(still one absmax scale per ``head_size`` values). Groups without such vectors (state,
fp8 or MLA-fp8 caches) stay byte-exact. No vLLM import.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from host_pools.host_format import host_spec
from host_pools.spec import BufferSpec, PoolKind, PoolSpec
from hicache.host_dtype import int8_codec
from transfer_kernels.quant.codec import Int8Codec
from transfer_kernels.quant.reference import QUANTIZABLE


class Vector(NamedTuple):
    """The K/V vectors of a group's blocks: element dtype and values per vector."""

    dtype: torch.dtype
    size: int


class HostPart(NamedTuple):
    """One host pool of a group: its spec and, for int8, the codec of its rows."""

    spec: PoolSpec
    codec: Int8Codec | None


def check_vector(vector: Vector, page_bytes: int, what: str) -> int:
    """Vectors per block of ``page_bytes``; ``ValueError`` naming ``what`` when they do not fit."""
    if vector.dtype not in QUANTIZABLE or vector.size < 1:
        raise ValueError(f"{what}: int8 host blocks need bf16/fp16 vectors, got {vector}")
    per_vector = vector.dtype.itemsize * vector.size
    if page_bytes % per_vector:
        raise ValueError(f"{what}: a block of {page_bytes} bytes is not whole {vector.size}-value "
                         f"{vector.dtype} vectors")
    return page_bytes // per_vector


def host_block_bytes(page_bytes: int, vector: Vector | None) -> int:
    """Host bytes of one block of one layer: the page itself, or its int8 values and scales."""
    if vector is None:
        return page_bytes
    n = check_vector(vector, page_bytes, "host_dtype")
    return n * vector.size + 4 * n


def host_part(name: str, num_layers: int, page_bytes: int, tokens_per_block: int,
              vector: Vector | None) -> HostPart:
    """The host pool spec of one part of a group (``num_layers`` layers of ``page_bytes``).

    Raises:
        ValueError: a block that is not whole vectors (naming the pool).
    """
    if vector is None:
        buf = BufferSpec("kv", (page_bytes,), torch.uint8)
        return HostPart(PoolSpec(name, PoolKind.ANCHOR, num_layers, (buf,), tokens_per_row=tokens_per_block), None)
    n = check_vector(vector, page_bytes, name)
    device = PoolSpec(name, PoolKind.ANCHOR, num_layers, (BufferSpec("kv", (n, vector.size), vector.dtype),),
                      tokens_per_row=tokens_per_block)
    return HostPart(host_spec(device, "int8"), int8_codec(device))
