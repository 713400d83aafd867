"""The staged (DMA) path: whole pages through a staging table, then the kernel; CPU here."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.transfer_kernels.pools import assert_copied, make_pool, random_map, snapshot
from transfer_kernels import (AutoBackend, CopyJob, CopyPlan, RowTable, StagedBackend,
                              TorchBackend, TritonBackend, copy_rows, copy_rows_batch, make_plan,
                              tuning)
from transfer_kernels.backends.auto import choose

MIXED = [((8,), torch.bfloat16), ((3, 4), torch.float32), ((5,), torch.uint8)]


def _cpu_pool(gen, layers=3, rows=12, buffers=MIXED, layout="page_first"):
    return make_pool(gen, layers, rows, buffers, layout, device="cpu", pin=False)


@pytest.mark.parametrize("kernel", ["torch", "triton"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("rows", ["one", "runs", "scattered", "all"])
def test_staged_copy_is_byte_exact(gen, kernel, direction, rows):
    # Three buffers of odd sizes (a row of 3 layers x 69 bytes = one 207-byte span).
    pool = _cpu_pool(gen)
    src_rows, dst_rows = {
        "one": ([11], [0]),
        "runs": ([0, 1, 2, 7, 8], [5, 9, 1, 0, 3]),
        "scattered": random_map(gen, 12, 12, 6),
        "all": (torch.randperm(12, generator=gen), torch.randperm(12, generator=gen)),
    }[rows]
    src, dst = ((pool.host_table, pool.device_table) if direction == "h2d"
                else (pool.device_table, pool.host_table))
    staged = StagedBackend(TorchBackend() if kernel == "torch" else TritonBackend())
    before = snapshot(src), snapshot(dst)
    copy_rows(src, dst, src_rows, dst_rows, backend=staged)
    assert_copied(src, dst, *before, src_rows, dst_rows)
    # one DMA, a piece per host row (runs are not merged: no per-batch run analysis)
    assert staged.copies == 1 and staged.pieces == len(src_rows)


def test_partial_layers_are_staged_alone_and_layer_first_goes_to_the_kernel(gen):
    page = _cpu_pool(gen)
    layer = _cpu_pool(gen, layout="layer_first")
    staged = StagedBackend(TorchBackend())
    for pool, layers in ((page, [1]), (layer, None)):
        before = snapshot(pool.host_table), snapshot(pool.device_table)
        copy_rows(pool.host_table, pool.device_table, [3, 4], [0, 1], layers=layers, backend=staged)
        assert_copied(pool.host_table, pool.device_table, *before, [3, 4], [0, 1], layers)
    # layer 1 of the page_first pool: one DMA of its two rows' layer-1 bytes
    assert staged.copies == 1 and staged.pieces == 2 and staged.kernel.launches == 2


def test_one_launch_carries_scatter_and_direct_jobs(gen):
    # A staged pool and a layer_first one: one DMA, then ONE kernel launch for both.
    a, b = _cpu_pool(gen), _cpu_pool(gen, layout="layer_first")
    jobs = [CopyJob(a.host_table, a.device_table, [2, 3, 9], [0, 1, 2]),
            CopyJob(b.host_table, b.device_table, [5], [7])]
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
    staged = StagedBackend(TritonBackend())
    copy_rows_batch(jobs, backend=staged)
    assert staged.copies == 1 and staged.kernel.launches == 1
    for job, (sb, db) in zip(jobs, befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_prepared_dma_comes_first_or_last(gen, direction):
    # H2D: the first launch issues the DMA, then its group's scatter; D2H: the gathers
    # first, the DMA after the last group. Groups may be launched in any order.
    pool = _cpu_pool(gen)
    src, dst = ((pool.host_table, pool.device_table) if direction == "h2d"
                else (pool.device_table, pool.host_table))
    src_rows, dst_rows = [4, 5, 0], [1, 2, 3]
    staged = StagedBackend(TorchBackend())
    prepared = staged.prepare(make_plan([CopyJob(src, dst, src_rows, dst_rows)]),
                              [[(0, 2)], [(0, 0), (0, 1)]])
    before = snapshot(src), snapshot(dst)
    prepared.launch(1)
    assert staged.copies == (1 if direction == "h2d" else 0)
    if direction == "h2d":
        assert_copied(src, dst, *before, src_rows, dst_rows, layers=[0, 1])
    prepared.launch(0)
    assert staged.copies == 1
    assert_copied(src, dst, *before, src_rows, dst_rows)


def test_staging_budget_sends_the_rest_to_the_kernel(gen):
    # A ring with room for one job's region only: the second job is copied directly.
    a, b = _cpu_pool(gen), _cpu_pool(gen)
    staged = StagedBackend(TorchBackend(), max_staging_bytes=1024)  # 4 rows x 207 B -> 1024
    jobs = [CopyJob(a.host_table, a.device_table, [0, 1, 2, 3], [4, 5, 6, 7]),
            CopyJob(b.host_table, b.device_table, [8, 9], [0, 1])]
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
    copy_rows_batch(jobs, backend=staged)
    assert staged.held_bytes == 1024 and len(staged._rings) == 1 and staged.pieces == 4
    for job, (sb, db) in zip(jobs, befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)


def test_one_ring_per_direction_is_allocated_once_and_reused(gen):
    pool = _cpu_pool(gen, rows=32)
    staged = StagedBackend(TorchBackend(), max_staging_bytes=1 << 16)
    bases = set()
    for count, direction in ((2, "h2d"), (5, "h2d"), (3, "d2h"), (7, "h2d"), (5, "d2h")):
        src_rows, dst_rows = random_map(gen, 32, 32, count)
        src, dst = ((pool.host_table, pool.device_table) if direction == "h2d"
                    else (pool.device_table, pool.host_table))
        before = snapshot(src), snapshot(dst)
        copy_rows(src, dst, src_rows, dst_rows, backend=staged)
        assert_copied(src, dst, *before, src_rows, dst_rows)
        bases.update(ring.base() for ring in staged._rings.values())
    assert staged.held_bytes == 2 << 16 and len(bases) == 2


def test_pieces_are_whole_rows_and_never_cross_a_pinned_chunk_start(gen):
    # One piece per host row, runs or not: a row never straddles a registration chunk.
    pool = _cpu_pool(gen, rows=16)
    host = pool.host_table
    span = host.page_span()[1]
    base = int(host.ptrs[0, 0])
    chunked = RowTable.from_views(host.views, "host", chunk_starts=[base, base + 6 * span])
    staged = StagedBackend(TorchBackend())
    plan = make_plan([CopyJob(chunked, pool.device_table, [4, 5, 6, 7, 11], [0, 1, 2, 3, 4])])
    (work,) = staged.prepare(plan, [[(0, 0), (0, 1), (0, 2)]]).work  # the H2D ring's
    ring, src, size = work.pieces
    assert (src - base).tolist() == [4 * span, 5 * span, 6 * span, 7 * span, 11 * span]
    assert (ring - ring[0]).tolist() == [0, span, 2 * span, 3 * span, 4 * span]
    assert size.tolist() == [span] * 5


def test_page_span_needs_one_contiguous_page_first_buffer(gen):
    pool = _cpu_pool(gen)
    view, span = pool.host_table.page_span()
    assert span == 3 * (16 + 48 + 5) and view.shape == (12, span)
    assert torch.equal(view, pool.host.view(12, -1))
    assert _cpu_pool(gen, layout="layer_first").host_table.page_span() is None
    assert pool.device_table.page_span() is None  # per-layer tensors


def _fake_cuda_job(gen, row_bytes, layers, rows):
    """A host page_first job whose device side claims to be on CUDA (arithmetic only)."""
    pool = _cpu_pool(gen, layers, 32, [((row_bytes,), torch.uint8)])
    dev = dataclasses.replace(pool.device_table, device=torch.device("cuda", 0), _cache={})
    job = make_plan([CopyJob(pool.host_table, pool.device_table, rows, rows)]).jobs[0]
    job = dataclasses.replace(job, dst=dev)
    return job, CopyPlan(jobs=(job,), device=torch.device("cuda", 0))


@pytest.mark.parametrize("row_bytes,layers,rows,want", [
    (37440, 2, [0, 5, 9], "dma"),  # DeepSeek-V4 c4_kv: 75 KB page spans
    (1728, 31, [0, 5, 9], "dma"),  # c128_kv over 31 layers: 53.6 KB spans, >= 32 KiB
    (1728, 15, [4, 5, 6], "triton"),  # 25.9 KB spans: under 32 KiB, runs or not
    (8448, 30, [1, 7], "dma"),  # c4_indexer: 253 KB spans
])
def test_auto_sends_big_page_spans_to_dma(gen, monkeypatch, row_bytes, layers, rows, want):
    monkeypatch.setattr(RowTable, "is_pinned", property(lambda self: True))
    job, plan = _fake_cuda_job(gen, row_bytes, layers, rows)
    assert choose(job, plan) == want
    assert tuning.AUTO_STAGE_MIN_PIECE_BYTES == 32 * 1024


def test_auto_on_cpu_never_stages(gen):
    pool = _cpu_pool(gen)
    auto = AutoBackend()
    copy_rows(pool.host_table, pool.device_table, [1, 2], [3, 4], backend=auto)
    assert auto.inner["dma"].copies == 0
