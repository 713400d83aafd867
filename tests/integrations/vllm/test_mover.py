"""BlockMover on CPU tensors shaped like vLLM's per-layer ``[num_blocks, page_bytes]`` views.

Random bytes everywhere; every round trip is compared byte for byte with a pure-torch
reference, and blocks the job did not name must be unchanged on both tiers.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from host_pools.memory import HostBudget, HostMemoryError
from hicache.integrations.vllm.config import SpecConfig
from hicache.integrations.vllm.mover import BlockMover, chunk_rows
from transfer_kernels import FaultyBackend

BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)


def vllm_cache(gen, num_layers, num_blocks, page, stride=None):
    """Per-layer int8 views like vLLM's canonical tensors (stride may include padding)."""
    stride = stride or page
    out = []
    for _ in range(num_layers):
        backing = torch.randint(-128, 128, (num_blocks, stride), generator=gen, dtype=torch.int8)
        out.append(backing[:, :page].view(torch.uint8))
    return out


def config(**extra):
    return SpecConfig.from_extra({"io_backend": "torch", **extra})


def mover(gen, groups, bpc=1, chunks=6, backend=None, **extra):
    return BlockMover(groups, [16] * len(groups), chunks, bpc, config(**extra), budget=BIG,
                      backend=backend)


def host_block(m, g, row):
    return torch.stack([v[0][row] for v in m.host_pools[g].row_views()])


@pytest.mark.parametrize("backend", ["torch", "copy_engine", "auto"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_store_then_load_round_trip_is_byte_exact(gen, backend, layout):
    layers = vllm_cache(gen, 3, 10, 96, stride=128)
    m = mover(gen, [layers], io_backend=backend, mem_layout=layout)
    m.host_pools[0].buffer.copy_(torch.randint(0, 256, m.host_pools[0].buffer.shape, generator=gen,
                                               dtype=torch.uint8))
    before_dev = [v.clone() for v in layers]
    host_before = m.host_pools[0].buffer.clone()
    blocks, chunks = np.array([7, 0, 9, 3]), np.array([5, 1, 0, 2])
    m.submit(1, "store", blocks, [4], [0], chunks)
    for b, c in zip(blocks, chunks):  # stored blocks land in their chunks, all layers
        assert torch.equal(host_block(m, 0, c), torch.stack([v[b] for v in before_dev]))
    untouched = [r for r in range(6) if r not in chunks]
    assert torch.equal(m.host_pools[0].row_views()[0][0][untouched],
                       host_before.view(m.host_pools[0].buffer.shape)[untouched, 0]
                       if layout == "page_first" else host_before[0, untouched])
    assert all(torch.equal(a, b) for a, b in zip(layers, before_dev))  # the source is unchanged
    # overwrite the device blocks with fresh random bytes, then load them back elsewhere
    for v in layers:
        v.copy_(torch.randint(0, 256, v.shape, generator=gen, dtype=torch.uint8))
    dev_before = [v.clone() for v in layers]
    targets = np.array([1, 2, 4, 8])
    m.submit(2, "load", targets, [4], [0], chunks)
    for t, b in zip(targets, blocks):
        assert all(torch.equal(v[t], ref[b]) for v, ref in zip(layers, before_dev))
    others = [r for r in range(10) if r not in targets]
    assert all(torch.equal(v[others], ref[others]) for v, ref in zip(layers, dev_before))
    done = m.finished()
    assert [(f.job_id, f.ok) for f in done] == [(1, True), (2, True)]
    assert done[0].nbytes == 4 * 3 * 96
    stats = m.stats()
    assert stats["d2h"]["ops"] == 1 and stats["h2d"]["bytes"]["kv"] == 4 * 3 * 96
    m.close()


def test_multi_block_chunks_and_a_request_starting_mid_chunk(gen):
    # two groups (e.g. full + sliding-window attention), 3 blocks per chunk
    g0, g1 = vllm_cache(gen, 2, 12, 64), vllm_cache(gen, 1, 12, 32)
    m = mover(gen, [g0, g1], bpc=3, chunks=4)
    ref0, ref1 = [v.clone() for v in g0], [v.clone() for v in g1]
    # group 0: 4 blocks from logical block 2 (skip 2 sub-blocks of chunk 3, then chunk 1)
    # group 1: 2 blocks from logical block 0 (chunk 2)
    m.submit(7, "store", np.array([5, 6, 7, 8, 10, 11]), [4, 2], [2, 0], np.array([3, 1, 2]))
    assert chunk_rows(np.array([3, 1]), 3, 2, 4).tolist() == [11, 3, 4, 5]
    for row, b in zip([11, 3, 4, 5], [5, 6, 7, 8]):
        assert torch.equal(host_block(m, 0, row), torch.stack([v[b] for v in ref0]))
    for row, b in zip([6, 7], [10, 11]):
        assert torch.equal(host_block(m, 1, row), ref1[0][b].unsqueeze(0))
    for v in g0 + g1:
        v.zero_()
    m.submit(8, "load", np.array([0, 1, 2, 3, 4, 9]), [4, 2], [2, 0], np.array([3, 1, 2]))
    for t, b in zip([0, 1, 2, 3], [5, 6, 7, 8]):
        assert all(torch.equal(v[t], r[b]) for v, r in zip(g0, ref0))
    assert torch.equal(g1[0][4], ref1[0][10]) and torch.equal(g1[0][9], ref1[0][11])
    assert [f.ok for f in m.finished()] == [True, True]


def test_a_failed_copy_reports_its_job_and_changes_nothing(gen):
    layers = vllm_cache(gen, 2, 8, 64)
    m = mover(gen, [layers], backend=FaultyBackend("torch", fail_on_launch=2))
    m.submit(1, "store", np.array([0, 1]), [2], [0], np.array([0, 1]))
    host = m.host_pools[0].buffer.clone()
    m.submit(2, "store", np.array([2, 3]), [2], [0], np.array([2, 3]))  # injected fault
    m.submit(3, "load", np.array([4]), [1], [0], np.array([99]))  # chunk out of range
    m.submit(4, "load", np.array([4, 5]), [1], [0], np.array([0]))  # lengths disagree
    assert torch.equal(m.host_pools[0].buffer, host)
    assert [(f.job_id, f.ok) for f in m.finished()] == [(1, True), (2, False), (3, False), (4, False)]
    assert m.stats()["d2h"]["failed_ops"] == 1 and m.stats()["h2d"]["failed_ops"] == 2


def test_bad_arguments_and_a_budget_too_small(gen):
    layers = vllm_cache(gen, 2, 8, 64)
    m = mover(gen, [layers])
    with pytest.raises(ValueError, match="direction"):
        m.submit(1, "copy", np.array([0]), [1], [0], np.array([0]))
    with pytest.raises(ValueError, match="tokens_per_block"):
        BlockMover([layers], [16, 16], 4, 1, config(), budget=BIG)
    tiny = HostBudget(1 << 20, None, 0, 1, 511)  # the pools need 4 x 2 x 64 = 512 B
    with pytest.raises(HostMemoryError, match="hicache_ratio"):
        BlockMover([layers], [16], 4, 1, config(), budget=tiny)
    with pytest.raises(ValueError, match="one count per group"):
        BlockMover([layers], [16], [4, 4], 1, config(), budget=BIG)


def test_mixed_page_sizes_and_per_group_capacity_round_trip(gen):
    # DeepSeek-V4-like: group 0 mixes three page sizes (C4 KV, indexer, C128 KV) across
    # interleaved layers; group 1 (a sliding-window group) holds 2 chunks, group 0 holds 5
    g0 = [vllm_cache(gen, 1, 10, size, stride=size + 32)[0] for size in (96, 40, 96, 8, 40)]
    g1 = vllm_cache(gen, 2, 10, 24)
    m = BlockMover([g0, g1], [64, 16], [5, 2], 1, config(), budget=BIG)
    assert [p.pool.name for group in m.parts for p in group] == ["group0.0", "group0.1", "group0.2",
                                                                  "group1"]
    assert m.group_host_bytes() == [5 * (2 * 96 + 2 * 40 + 8), 2 * 2 * 24]
    assert m.block_bytes(0) == 2 * 96 + 2 * 40 + 8 and m.num_chunks == 7
    ref0, ref1 = [v.clone() for v in g0], [v.clone() for v in g1]
    m.submit(1, "store", np.array([9, 2, 5, 6, 7]), [3, 2], [0, 0], np.array([4, 0, 3, 1, 0]))
    for v in g0 + g1:
        v.copy_(torch.randint(0, 256, v.shape, generator=gen, dtype=torch.uint8))
    dev_before = [v.clone() for v in g0 + g1]
    m.submit(2, "load", np.array([0, 1, 3, 8, 4]), [3, 2], [0, 0], np.array([4, 0, 3, 1, 0]),
             expedited=True)  # on CPU an expedited load is an ordinary synchronous copy
    for t, b in zip([0, 1, 3], [9, 2, 5]):
        assert all(torch.equal(v[t], r[b]) for v, r in zip(g0, ref0))
    for t, b in zip([8, 4], [6, 7]):
        assert all(torch.equal(v[t], r[b]) for v, r in zip(g1, ref1))
    untouched0, untouched1 = [2, 4, 5, 6, 7, 8, 9], [0, 1, 2, 3, 5, 6, 7, 9]
    assert all(torch.equal(v[untouched0], r[untouched0]) for v, r in zip(g0, dev_before[:5]))
    assert all(torch.equal(v[untouched1], r[untouched1]) for v, r in zip(g1, dev_before[5:]))
    assert [(f.job_id, f.ok, f.nbytes) for f in m.finished()] == [
        (1, True, 3 * m.block_bytes(0) + 2 * m.block_bytes(1)),
        (2, True, 3 * m.block_bytes(0) + 2 * m.block_bytes(1))]
    m.submit(3, "store", np.array([1, 2]), [0, 2], [0, 0], np.array([2, 0]))  # group 1 has 2 chunks
    assert [f.ok for f in m.finished()] == [False]


@pytest.mark.gpu
def test_cuda_round_trip_on_streams_with_pinned_host(gen):
    torch.cuda.init()
    layers = [v.cuda() for v in vllm_cache(gen, 4, 32, 4096)]
    ref = [v.clone() for v in layers]
    m = BlockMover([layers], [16], 16, 2, SpecConfig.from_extra({}), budget=BIG)
    assert m.host_pools[0].row_views()[0][0].is_pinned()
    blocks = np.array([3, 9, 10, 31])
    m.submit(1, "store", blocks, [4], [1], np.array([4, 7, 0]))
    m.wait({1})
    for v in layers:
        v.zero_()
    m.submit(2, "load", blocks, [4], [1], np.array([4, 7, 0]))
    m.wait({2})
    torch.cuda.synchronize()
    assert [f.ok for f in m.finished()] == [True, True]
    for v, r in zip(layers, ref):
        assert torch.equal(v[blocks], r[blocks])
        assert int(v[[0, 1, 2]].sum()) == 0
    m.close()
