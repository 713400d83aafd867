"""The int8 host tier through vLLM's real types (runs in the vLLM environment): the spec
picks the bf16 groups' vectors from vLLM's KV cache specs, sizes by the host format's bytes,
and the worker's round trip is the format's (`quant_ref`) per vector."""
from __future__ import annotations

import pytest
import torch

vllm_base = pytest.importorskip("vllm.v1.kv_offload.base", reason="needs vLLM (runs in its env)")

from hicache.integrations.vllm.config import extra_config  # noqa: E402
from hicache.integrations.vllm.host_codec import Vector  # noqa: E402
from hicache.integrations.vllm.manager import HostChunksSpec  # noqa: E402
from hicache.config import HiCacheConfig  # noqa: E402
from tests.integrations.vllm import vllm_layouts as lay  # noqa: E402
from transfer_kernels.quant.reference import dequantize_int8_ref, quantize_int8_ref  # noqa: E402

HEAD, BLOCKS = 64, 8
GROUPS = [lay.full(["l0", "l1"], block=16, head=HEAD)]  # 16 x (64 + 64) x 2 B = 4096 B a page
PAGE, HOST_PAGE = 4096, 2048 + 4 * 32  # int8 values + one fp32 scale per 64 values


def test_int8_sizes_by_the_host_formats_bytes():
    size = {"hicache_size_gb": 40 * 2 * PAGE / 1e9}  # 40 bf16 blocks of both layers
    auto = lay.make_spec(GROUPS, size, BLOCKS)
    int8 = lay.make_spec(GROUPS, {**size, "host_dtype": "int8"}, BLOCKS)
    assert auto.vectors == [None] and int8.vectors == [Vector(torch.bfloat16, HEAD)]
    assert auto.num_chunks == 40 and int8.num_chunks == 40 * PAGE // HOST_PAGE == 75
    assert int8.layout.groups[0].bytes_per_chunk == 2 * HOST_PAGE
    ratio = lay.make_spec(GROUPS, {"hicache_ratio": 2.0, "host_dtype": "int8"}, BLOCKS)
    assert ratio.num_chunks == 2 * BLOCKS  # a ratio keeps its meaning: host blocks per device block


def test_int8_refusals_name_the_key():
    with pytest.raises(ValueError, match="host_dtype: int8 needs each group's dtype"):
        lay.make_spec(GROUPS, {"hicache_size_gb": 1e-4, "host_dtype": "int8"}, None)
    with pytest.raises(ValueError, match=r"host_dtype \(--hicache-host-dtype\): must be one of"):
        lay.make_spec(GROUPS, {"hicache_ratio": 1.0, "host_dtype": "fp8"}, BLOCKS)
    assert "host_dtype" not in extra_config(HiCacheConfig())  # the default extra config is unchanged
    assert extra_config(HiCacheConfig(host_dtype="int8"))["host_dtype"] == "int8"


def round_trip(page: torch.Tensor) -> torch.Tensor:
    x = page.contiguous().view(torch.bfloat16).view(-1, HEAD)
    return dequantize_int8_ref(*quantize_int8_ref(x), torch.bfloat16).view(-1).view(torch.int8)


def test_int8_worker_round_trip_on_canonical_cpu_tensors(gen):
    spec = lay.make_spec(GROUPS, {"hicache_ratio": 1.0, "host_dtype": "int8", "io_backend": "torch"}, BLOCKS)
    caches, by_layer = lay.canonical_caches(gen, GROUPS, BLOCKS)
    before = {n: t.clone() for n, t in by_layer.items()}
    worker = spec.get_worker(caches)
    assert worker.mover.host_bytes == BLOCKS * 2 * HOST_PAGE
    assert worker.submit_store(1, vllm_base.GPULoadStoreSpec([4, 7], [2], [0]), HostChunksSpec([3, 0]))
    assert worker.submit_load(2, HostChunksSpec([3, 0]), vllm_base.GPULoadStoreSpec([1, 2], [2], [0]))
    assert [r.success for r in worker.get_finished()] == [True, True]
    for name, t in by_layer.items():
        for d, s in ((1, 4), (2, 7)):
            assert torch.equal(t[d, :PAGE], round_trip(before[name][s, :PAGE]))
        assert torch.equal(t[:, PAGE:], before[name][:, PAGE:])  # padding never written
        untouched = [b for b in range(BLOCKS) if b not in (1, 2)]
        assert torch.equal(t[untouched], before[name][untouched])
    worker.shutdown()
