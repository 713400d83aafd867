"""The auto backend's routing rule (thresholds from transfer_kernels.tuning)."""
from __future__ import annotations

import pytest
import torch

from tests.transfer_kernels.pools import assert_copied, make_pool, snapshot
from transfer_kernels import AutoBackend, CopyJob, CopyPlan, RowTable, copy_rows_batch, make_plan
from transfer_kernels import tuning
from transfer_kernels.auto import choose


def _job(gen, row_bytes, src_rows, dst_rows, layout="layer_first"):
    # CPU tables on every machine: these tests are about the CPU rule and pure arithmetic.
    pool = make_pool(gen, 2, 16, [((row_bytes,), torch.uint8)], layout, device="cpu", pin=False)
    return pool, CopyJob(pool.host_table, pool.device_table, src_rows, dst_rows)


def test_cpu_routes_by_piece_size(gen):
    # Small scattered rows go to torch; pieces >= the CPU threshold to the copy engine.
    small = tuning.CPU_COPY_ENGINE_MIN_PIECE_BYTES // 4
    _, scattered = _job(gen, small, [0, 5, 9], [1, 2, 3])
    _, run = _job(gen, small, [4, 5, 6, 7], [0, 1, 2, 3])  # one run of 4 rows
    plan = make_plan([scattered, run])
    assert [choose(j, plan) for j in plan.jobs] == ["torch", "copy_engine"]


def test_mixed_batch_uses_each_backend_once(gen):
    # One call, two routes: auto launches torch once and the copy engine once.
    small_pool, small = _job(gen, 64, [0, 5, 9], [1, 2, 3])
    big_pool, big = _job(gen, tuning.CPU_COPY_ENGINE_MIN_PIECE_BYTES, [3, 1], [0, 9])
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in (small, big)]
    auto = AutoBackend()
    copy_rows_batch([small, big], backend=auto)
    assert auto.launches == 2
    assert auto.inner["torch"].launches == 1 and auto.inner["copy_engine"].launches == 1
    for job, (sb, db) in zip((small, big), befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)


@pytest.mark.parametrize("row_bytes,rows,dense,want", [
    (1152, [0, 3, 7], True, "triton"),  # small scattered pieces: SM kernel
    (2048, list(range(16)), True, "triton"),  # one run of 32 KiB: still under the crossover
    (tuning.COPY_ENGINE_MIN_PIECE_BYTES, [0, 3], True, "copy_engine"),  # big pieces: DMA
    (4096, list(range(16)), True, "copy_engine"),  # one 64 KiB run
    (4096, list(range(16)), False, "triton"),  # strided host rows: per-row pieces
])
def test_cuda_rule_without_a_gpu(gen, monkeypatch, row_bytes, rows, dense, want):
    # The CUDA branch of the rule is pure arithmetic: exercise it with pinned-looking tables.
    monkeypatch.setattr(RowTable, "is_pinned", property(lambda self: True))
    _, job = _job(gen, row_bytes, rows, rows, "layer_first" if dense else "page_first")
    plan = make_plan([job])
    fake_cuda = CopyPlan(jobs=plan.jobs, device=torch.device("cuda", 0))
    assert choose(fake_cuda.jobs[0], fake_cuda) == want
