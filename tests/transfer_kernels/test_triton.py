"""The triton backend: one launch per batch, bounded grid, vector width, tiling; GPU cases."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.transfer_kernels.pools import (assert_copied, assert_unchanged, make_pool,
                                          random_map, snapshot)
from transfer_kernels import (CopyEngineBackend, CopyJob, TritonBackend, copy_rows,
                              copy_rows_batch, make_plan)
from transfer_kernels.triton_backend import SEG_FIELDS, build_launch, kernel_module

FP8_OR_INT8 = getattr(torch, "float8_e4m3fn", torch.int8)


def _three_pool_jobs(gen, direction="h2d", device=None, pin=None):
    pools = [make_pool(gen, 2, 9, [((16,), torch.bfloat16)] * 2, "page_first", device, pin),
             make_pool(gen, 2, 5, [((133,), torch.uint8)], "layer_first", device, pin),
             make_pool(gen, 2, 7, [((20,), torch.uint8), ((1,), torch.float32)],
                       "page_first", device, pin)]
    jobs = []
    for p in pools:
        src, dst = ((p.host_table, p.device_table) if direction == "h2d"
                    else (p.device_table, p.host_table))
        jobs.append(CopyJob(src, dst, *random_map(gen, p.num_rows, p.num_rows, 4)))
    return jobs


def test_kernel_module_fields():
    assert kernel_module().SEG_FIELDS == SEG_FIELDS


def test_kernel_compiles_for_hopper_with_16_byte_vectors():
    # The compiled variant exists whatever TRITON_INTERPRET says, and builds for sm_90
    # on a machine without a GPU; the 16-byte path issues 128-bit global accesses.
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {"meta_ptr": "*i64", "seg_begin": "i32", "seg_end": "i32",
           "NF": "constexpr", "BLOCK": "constexpr"}
    src = ASTSource(fn=kernel_module().compiled_kernel(), signature=sig,
                    constexprs={"NF": SEG_FIELDS, "BLOCK": 8192})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert "ld.global.v4" in compiled.asm["ptx"] and "st.global.v4" in compiled.asm["ptx"]


def test_prepared_groups_are_slices_of_one_buffer(gen):
    # Three launch groups (like three model layers) share one staged buffer; each launch
    # copies exactly its own (job, layer) pairs.
    jobs = _three_pool_jobs(gen)
    plan = make_plan(jobs)
    groups = [[(0, 0), (2, 0)], [], [(1, 1), (0, 1)], [(1, 0), (2, 1)]]
    backend = TritonBackend(max_programs=2)
    prepared = backend.prepare(plan, groups)
    assert prepared.num_groups == 4
    metas = {id(launch.meta) for launch in prepared.launches}
    assert len(metas) == 1 and [l.num_segs for l in prepared.launches] == [4, 0, 3, 3]
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
    done: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for g, group in enumerate(groups):
        prepared.launch(g)
        for j, layer in group:
            done[j].append(layer)
        for j, job in enumerate(jobs):
            assert_copied(job.src, job.dst, *befores[j], job.src_rows, job.dst_rows,
                          layers=done[j])
    assert backend.launches == 3  # the empty group launches nothing


def test_batch_of_three_pools_is_one_launch(gen):
    # 3 pools x 2 layers x (2, 1, 2) buffers = 10 segments, ONE kernel launch.
    jobs = _three_pool_jobs(gen)
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
    backend = TritonBackend(max_programs=3)
    copy_rows_batch(jobs, backend=backend)
    assert backend.launches == 1
    assert backend.last_launch.num_segs == 10
    assert 1 <= backend.last_launch.grid <= 3
    for job, (sb, db) in zip(jobs, befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)
    copy_rows_batch(jobs, layers=[1], backend=backend)  # a per-layer load: one more launch
    assert backend.launches == 2 and backend.last_launch.num_segs == 5


def test_vector_width_per_segment(gen):
    # 16-byte aligned rows get align 16; the odd 133-byte and 20-byte rows do not.
    jobs = _three_pool_jobs(gen)
    plan = make_plan(jobs, layers=[0])
    launch = build_launch(plan, max_programs=4, tile_bytes=8192)
    seg = launch.meta[: launch.num_segs * SEG_FIELDS].view(-1, SEG_FIELDS).cpu().numpy()
    aligns = seg[:, 3].tolist()
    assert aligns[0] == aligns[1] == 16  # kv: 32-byte rows, page_first stride 64
    assert aligns[2] == 1  # 133 bytes
    assert aligns[3] == 4 and aligns[4] == 4  # 20 + 4 byte rows, host stride 24
    # Items are dealt round-robin across the grid: 'first' is the global start mod grid.
    items = [int(np.ceil(n / (launch.block >> s))) * c for n, s, c in seg[:, [6, 7, 8]]]
    assert seg[:, 9].tolist() == [sum(items[:i]) % launch.grid for i in range(len(items))]


@pytest.mark.parametrize("tile_bytes", [16, 64])
@pytest.mark.parametrize("max_programs", [1, 3])
def test_small_tiles_split_rows_into_chunks(gen, tile_bytes, max_programs):
    # Rows larger than the tile take several chunks; several programs share the items.
    pool = make_pool(gen, 2, 6, [((133,), torch.uint8), ((24,), torch.float32)], "page_first")
    src, dst = pool.device_table, pool.host_table
    src_rows, dst_rows = torch.tensor([5, 0, 2]), torch.tensor([1, 5, 0])
    src_before, dst_before = snapshot(src), snapshot(dst)
    copy_rows(src, dst, src_rows, dst_rows,
              backend=TritonBackend(max_programs=max_programs, tile_bytes=tile_bytes))
    assert_copied(src, dst, src_before, dst_before, src_rows, dst_rows)


def test_rejects_bad_config():
    with pytest.raises(ValueError, match="max_programs"):
        TritonBackend(max_programs=0)
    with pytest.raises(ValueError, match="tile_bytes"):
        TritonBackend(tile_bytes=100)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "copy_engine", "auto"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_cuda_pinned_host(gen, backend, direction):
    # Real GPU: pinned host rows read/written through UVA (triton) or DMA (copy engine).
    pools = [make_pool(gen, 3, 300, [((64, 8, 16), torch.bfloat16)] * 2, "page_first",
                       "cuda", pin=True),
             make_pool(gen, 3, 200, [((41, 16), FP8_OR_INT8), ((64,), torch.float32)],
                       "layer_first", "cuda", pin=True),
             make_pool(gen, 3, 100, [((7,), torch.uint8)], "page_first", "cuda", pin=True)]
    jobs = []
    for p in pools:
        src, dst = ((p.host_table, p.device_table) if direction == "h2d"
                    else (p.device_table, p.host_table))
        src_rows = torch.randperm(p.num_rows, generator=gen)[:64]
        dst_rows = torch.cat([torch.arange(10, 40), torch.randperm(p.num_rows - 40,
                                                                   generator=gen)[:34] + 40])
        jobs.append(CopyJob(src, dst, src_rows, dst_rows))
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
    copy_rows_batch(jobs, backend=backend)
    torch.cuda.synchronize()
    for job, (sb, db) in zip(jobs, befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)


@pytest.mark.gpu
def test_cuda_triton_needs_pinned_host(gen):
    pool = make_pool(gen, 1, 8, [((16,), torch.uint8)], device="cuda", pin=False)
    before = snapshot(pool.device_table)
    with pytest.raises(ValueError, match="pinned"):
        copy_rows(pool.host_table, pool.device_table, [0], [1], backend="triton")
    assert_unchanged(pool.device_table, before)
    # The copy engine accepts pageable memory (slower, same bytes).
    copy_rows(pool.host_table, pool.device_table, [0], [1], backend=CopyEngineBackend())

