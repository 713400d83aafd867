"""The dma backend's staging: a region per job (issue 23.1), only the grouped layers
(23.2), the per-group DMA pipeline and its call budget, the ring reused (issue 21.3). CPU."""
from __future__ import annotations

import pytest
import torch

from tests.transfer_kernels.pools import assert_copied, make_pool, snapshot
from transfer_kernels import (AutoBackend, CopyJob, StagedBackend, TorchBackend, TritonBackend,
                              copy_rows_batch, make_plan)
from transfer_kernels import auto as auto_mod

MIXED = [((8,), torch.bfloat16), ((3, 4), torch.float32), ((5,), torch.uint8)]


def _pool(gen, layers=3, rows=12, buffers=MIXED):
    return make_pool(gen, layers, rows, buffers, "page_first", device="cpu", pin=False)


def _sides(pool, direction):
    return ((pool.host_table, pool.device_table) if direction == "h2d"
            else (pool.device_table, pool.host_table))


def _auto_staging(monkeypatch):
    """An AutoBackend that routes every job to its dma path, as it does on CUDA."""
    monkeypatch.setattr(auto_mod, "choose", lambda job, plan: "dma")
    auto = AutoBackend(triton=TritonBackend())
    auto.inner["dma"].kernel = TorchBackend()
    return auto


@pytest.mark.parametrize("via", ["dma", "dma-triton", "auto"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_two_jobs_on_one_host_table_get_their_own_staging(gen, monkeypatch, direction, via):
    # Issue 23.1: host rows [0,1]->[4,5] and [7,8]->[9,10] of ONE pool in one call.
    pool = _pool(gen)
    src, dst = _sides(pool, direction)
    host_rows, dev_rows = ([0, 1], [7, 8]), ([4, 5], [9, 10])
    pairs = [(h, d) if direction == "h2d" else (d, h) for h, d in zip(host_rows, dev_rows)]
    jobs = [CopyJob(src, dst, s, d) for s, d in pairs]
    backend = {"dma": lambda: StagedBackend(TorchBackend()),
               "dma-triton": lambda: StagedBackend(TritonBackend()),
               "auto": lambda: _auto_staging(monkeypatch)}[via]()
    before = snapshot(src), snapshot(dst)
    copy_rows_batch(jobs, backend=backend)
    s_all = [r for s, _ in pairs for r in s]
    d_all = [r for _, d in pairs for r in d]
    assert_copied(src, dst, *before, s_all, d_all)
    staged = backend.inner["dma"] if via == "auto" else backend
    assert staged.copies == 1 and staged.pieces == 2  # both jobs staged, one run each


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_prepared_copy_touches_only_the_grouped_layers(gen, direction):
    # Issue 23.2: the job names all 3 layers, the groups only layers 2 and 0: layer 1 of
    # the destination keeps its bytes (the other backends leave it alone too).
    pool = _pool(gen)
    src, dst = _sides(pool, direction)
    src_rows, dst_rows = [4, 5, 0], [1, 2, 3]
    staged = StagedBackend(TorchBackend())
    prepared = staged.prepare(make_plan([CopyJob(src, dst, src_rows, dst_rows)]),
                              [[(0, 2)], [(0, 0)]])
    before = snapshot(src), snapshot(dst)
    prepared.launch(0)
    prepared.launch(1)
    assert_copied(src, dst, *before, src_rows, dst_rows, layers=[0, 2])
    assert staged.copies == 2  # a chunk per group (one layer apart: no common piece)
