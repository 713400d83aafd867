"""BlockMover with an int8 host tier: bf16 blocks stored as int8 + fp32 scales and loaded
back as exactly the format's round trip (`quant_ref`), per ``head_size`` vector of each
block; other blocks, the source and byte-exact groups untouched."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from host_pools.memory import HostBudget
from hicache.integrations.vllm.config import SpecConfig
from hicache.integrations.vllm.host_codec import Vector, host_block_bytes, host_part
from hicache.integrations.vllm.mover import BlockMover
from transfer_kernels.quant.reference import dequantize_int8_ref, quantize_int8_ref

BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)
HEAD = 64


def bf16_cache(gen, num_layers, num_blocks, heads=2, block=16, dtype=torch.bfloat16):
    """vLLM CPU-like layers ``[blocks, heads, block, 2 * head]`` as ``[blocks, page]`` uint8 views."""
    return [(torch.randn(num_blocks, heads, block, 2 * HEAD, generator=gen) * 4).to(dtype)
            .view(num_blocks, -1).view(torch.uint8) for _ in range(num_layers)]


def round_trip(block: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    x = block.view(dtype).view(-1, HEAD)
    return dequantize_int8_ref(*quantize_int8_ref(x), dtype).view(-1).view(torch.uint8)


@pytest.mark.parametrize("backend", ["torch", "copy_engine", "auto", "triton"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_int8_store_then_load_is_the_formats_round_trip(gen, backend, layout):
    layers = bf16_cache(gen, 3, 10)
    cfg = SpecConfig.from_extra({"io_backend": backend, "mem_layout": layout, "host_dtype": "int8"})
    m = BlockMover([layers], [16], 6, 1, cfg, budget=BIG, vectors=[Vector(torch.bfloat16, HEAD)])
    page = layers[0].shape[1]
    assert m.host_bytes == 3 * 6 * host_block_bytes(page, Vector(torch.bfloat16, HEAD))
    before = [v.clone() for v in layers]
    src, chunks, dst = np.array([7, 0, 9]), np.array([5, 1, 0]), np.array([2, 4, 8])
    m.submit(1, "store", src, [3], [0], chunks)
    assert all(torch.equal(a, b) for a, b in zip(layers, before))  # the source is unchanged
    m.submit(2, "load", dst, [3], [0], chunks)
    assert [f.ok for f in m.finished()] == [True, True]
    for layer, old in zip(layers, before):
        for s, d in zip(src, dst):
            assert torch.equal(layer[d], round_trip(old[s]))
        untouched = [b for b in range(10) if b not in dst]
        assert torch.equal(layer[untouched], old[untouched])
    m.close()


def test_an_exact_group_beside_an_int8_group(gen):
    g0, g1 = bf16_cache(gen, 2, 6), bf16_cache(gen, 1, 6)
    cfg = SpecConfig.from_extra({"io_backend": "torch", "host_dtype": "int8"})
    m = BlockMover([g0, g1], [16, 16], 4, 1, cfg, budget=BIG, vectors=[Vector(torch.bfloat16, HEAD), None])
    before = [v.clone() for v in g0 + g1]
    m.submit(1, "store", np.array([1, 2]), [1, 1], [0, 0], np.array([0, 3]))
    m.submit(2, "load", np.array([4, 5]), [1, 1], [0, 0], np.array([0, 3]))
    assert torch.equal(g0[0][4], round_trip(before[0][1]))
    assert torch.equal(g1[0][5], before[2][2])  # the exact group: byte for byte
    m.close()


def test_fp16_blocks_and_bad_vectors(gen):
    layers = bf16_cache(gen, 1, 4, dtype=torch.float16)
    cfg = SpecConfig.from_extra({"io_backend": "torch", "host_dtype": "int8"})
    m = BlockMover([layers], [16], 2, 1, cfg, budget=BIG, vectors=[Vector(torch.float16, HEAD)])
    before = layers[0].clone()
    m.submit(1, "store", np.array([3]), [1], [0], np.array([1]))
    m.submit(2, "load", np.array([0]), [1], [0], np.array([1]))
    assert torch.equal(layers[0][0], round_trip(before[3], torch.float16))
    m.close()
    with pytest.raises(ValueError, match="group0: a block of 8192 bytes is not whole 48-value"):
        BlockMover([layers], [16], 2, 1, cfg, budget=BIG, vectors=[Vector(torch.float16, 48)])
    with pytest.raises(ValueError, match="vectors: need one entry per KV cache group"):
        BlockMover([layers], [16], 2, 1, cfg, budget=BIG, vectors=[None, None])
    with pytest.raises(ValueError, match="int8 host blocks need bf16/fp16 vectors"):
        host_part("g", 1, 4096, 16, Vector(torch.float32, 64))
