"""The triton backend: one launch per batch, launch alignment, program tables; GPU cases."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.transfer_kernels.pools import (assert_copied, assert_unchanged, make_pool,
                                          random_map, snapshot)
from transfer_kernels import (CopyEngineBackend, CopyJob, TritonBackend, copy_rows,
                              copy_rows_batch, make_plan)
from transfer_kernels.backends.triton import build_launch, kernel_module
from transfer_kernels.cuda.abi import SEG_FIELDS

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


def _segments(launch) -> np.ndarray:
    return launch.meta[: launch.seg_end * SEG_FIELDS].view(-1, SEG_FIELDS).cpu().numpy()[launch.seg_begin:]


def _program_table(launch) -> tuple[np.ndarray, np.ndarray]:
    g, at = launch.grid, launch.prog_at
    table = launch.meta[at: at + 2 * g + 1].cpu().numpy()
    return table[:g], table[g:]


def test_kernel_module_fields():
    assert kernel_module().SEG_FIELDS == SEG_FIELDS


@pytest.mark.parametrize("align", [16, 8, 4, 1])
def test_kernel_compiles_for_hopper_without_shared_memory_or_spills(align):
    # Each alignment is its own specialization, compiled for sm_90 on this GPU-less machine:
    # no shared memory, no local memory (spills), 16-byte accesses for the 16-byte one.
    pytest.importorskip("triton")
    from transfer_kernels.cuda import inspect as triton_inspect

    backend = TritonBackend()
    got = triton_inspect.report(backend.vpt, align, backend.num_warps)
    assert got["shared"] == 0, got
    if align == 16:
        assert got["ptx_v4_loads"] >= 1 and got["ptx_v4_stores"] >= 1, got
    if "local" in got:  # cuobjdump ships with triton's NVIDIA backend
        assert got["local"] == 0 and got["stack"] == 0 and got["spill_ops"] == 0, got
        assert 0 < got["loop_instructions"] < 400, got  # the byte-lane kernel took ~1,660


def test_prepared_groups_share_one_buffer(gen):
    # Three launch groups (like three model layers) share one staged buffer; each launch
    # copies exactly its own (job, layer) pairs; an empty group launches nothing.
    jobs = _three_pool_jobs(gen)
    plan = make_plan(jobs)
    groups = [[(0, 0), (2, 0)], [], [(1, 1), (0, 1)], [(1, 0), (2, 1)]]
    backend = TritonBackend(max_programs=2)
    prepared = backend.prepare(plan, groups)
    assert prepared.num_groups == 4
    launches = [prepared.prepared.kernel.launch_args(prepared.launcher.meta, g) for g in range(4)]
    assert [l.num_segs for l in launches] == [4, 0, 3, 3] and launches[1].grid == 0
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
    done: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for g, group in enumerate(groups):
        prepared.launch(g)
        for j, layer in group:
            done[j].append(layer)
        for j, job in enumerate(jobs):
            assert_copied(job.src, job.dst, *befores[j], job.src_rows, job.dst_rows,
                          layers=done[j])
    assert backend.launches == 3


def test_batch_of_three_pools_is_one_launch(gen, launched):
    # 3 pools x 2 layers x (2, 1, 2) buffers = 10 segments, ONE kernel launch.
    jobs = _three_pool_jobs(gen)
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
    backend = TritonBackend(max_programs=3)
    copy_rows_batch(jobs, backend=backend)
    assert backend.launches == 1 and len(launched) == 1
    launcher, group = launched[-1]
    assert build_launch(make_plan(jobs), backend).num_segs == 10
    assert 1 <= launcher.grids[group] <= 3
    for job, (sb, db) in zip(jobs, befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)
    copy_rows_batch(jobs, layers=[1], backend=backend)  # a per-layer load: one more launch
    assert backend.launches == 2 and len(launched) == 2
    assert build_launch(make_plan(jobs, layers=[1]), backend).num_segs == 5


def test_launch_runs_at_its_segments_alignment(gen):
    # A launch's vectors are as wide as every one of its segments allows: 16 bytes for the
    # aligned pool alone, 1 byte once the 133-byte rows join (one launch, never split).
    jobs = _three_pool_jobs(gen)
    backend = TritonBackend(max_programs=4)
    aligned = build_launch(make_plan(jobs[:1], layers=[0]), backend)
    assert aligned.align == 16
    seg = _segments(aligned)
    assert seg[:, 4].tolist() == [2, 2]  # 32-byte rows: 2 vectors each (k and v buffers)
    assert seg[:, 9].tolist() == [8, 8]  # 4 rows x 2 vectors
    mixed = build_launch(make_plan(jobs, layers=[0]), backend)
    assert mixed.align == 1 and mixed.num_segs == 5
    seg = _segments(mixed)
    assert seg[:, 4].tolist() == [32, 32, 133, 20, 4]  # vectors of 1 byte per row
    d = seg[:, 4]
    t = np.arange(3000)[:, None]
    assert ((t * seg[:, 5]) >> seg[:, 6] == t // d).all()  # the magic division


def test_program_tables_deal_contiguous_items(gen):
    # Program p takes items [p*N//G, (p+1)*N//G) and starts at the segment holding the
    # first of them: together the programs cover every item of the launch exactly once.
    jobs = _three_pool_jobs(gen)
    backend = TritonBackend(max_programs=3, tile_bytes=64)  # 4 vectors per tile
    launch = build_launch(make_plan(jobs), backend)
    seg = _segments(launch)
    begin, end = seg[:, 10], seg[:, 11]
    assert begin[0] == 0 and (begin[1:] == end[:-1]).all() and (end > begin).all()
    assert ((end - begin) == -(-seg[:, 9] // backend.vpt)).all()
    first, bounds = _program_table(launch)
    n = int(end[-1])
    assert launch.grid == 3 and bounds.tolist() == [p * n // 3 for p in range(4)]
    for p in range(3):
        s = int(first[p]) - launch.seg_begin
        assert begin[s] <= bounds[p] < end[s]


@pytest.mark.parametrize("tile_bytes", [16, 64, 8192])
@pytest.mark.parametrize("max_programs", [1, 3])
def test_tiles_span_rows_and_programs_share_them(gen, tile_bytes, max_programs):
    # Tiles smaller and larger than a row; items cross row ends; several programs.
    pool = make_pool(gen, 2, 6, [((133,), torch.uint8), ((24,), torch.float32)], "page_first")
    src, dst = pool.device_table, pool.host_table
    src_rows, dst_rows = torch.tensor([5, 0, 2]), torch.tensor([1, 5, 0])
    src_before, dst_before = snapshot(src), snapshot(dst)
    copy_rows(src, dst, src_rows, dst_rows,
              backend=TritonBackend(max_programs=max_programs, tile_bytes=tile_bytes))
    assert_copied(src, dst, src_before, dst_before, src_rows, dst_rows)


@pytest.mark.parametrize("offset, align", [(0, 16), (8, 8), (4, 4), (2, 1), (3, 1)])
def test_each_alignment_specialization(gen, offset, align, launched):
    # Views starting ``offset`` bytes into their buffer select the 8/4/1-byte kernels;
    # 48-byte rows at a 48-byte stride keep the offset's alignment.
    host = torch.randint(0, 256, (3, 8 * 48 + offset), dtype=torch.uint8, generator=gen)
    dev = torch.randint(0, 256, (3, 8 * 48 + offset), dtype=torch.uint8, generator=gen)
    from transfer_kernels import RowTable

    def table(buf, name):
        return RowTable.from_views([[buf[l, offset:].view(8, 48)] for l in range(3)], name)

    src, dst = table(host, "host"), table(dev, "dev")
    backend = TritonBackend(max_programs=2, tile_bytes=64)
    src_before, dst_before = snapshot(src), snapshot(dst)
    copy_rows(src, dst, [7, 0, 3, 4], [0, 7, 1, 2], backend=backend)
    launcher, group = launched[-1]
    assert launcher.args[group][4] == align  # (meta, prog_at, fields, vpt, align)
    assert_copied(src, dst, src_before, dst_before, [7, 0, 3, 4], [0, 7, 1, 2])


def test_rejects_bad_config():
    with pytest.raises(ValueError, match="max_programs"):
        TritonBackend(max_programs=0)
    with pytest.raises(ValueError, match="max_programs"):
        TritonBackend(max_programs=1 << 63)
    with pytest.raises(ValueError, match="tile_bytes"):
        TritonBackend(tile_bytes=100)
    with pytest.raises(ValueError, match="num_warps"):
        TritonBackend(num_warps=3)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "copy_engine", "auto", "dma"])
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
def test_cuda_loaded_kernels_have_no_shared_memory_or_spills(gen):
    # After real launches, every loaded variant's metadata (from the driver) agrees with
    # the offline inspection: no shared memory, no spills.
    jobs = _three_pool_jobs(gen, device="cuda", pin=True)
    copy_rows_batch(jobs[:1], backend=TritonBackend())
    copy_rows_batch(jobs, backend=TritonBackend())
    torch.cuda.synchronize()
    variants = kernel_module().compiled_variants()
    assert {key[2] for key in variants} >= {16, 1}
    for key, kernel in variants.items():
        assert kernel.metadata.shared == 0, key
        assert kernel.n_spills == 0, (key, kernel.n_spills, kernel.n_regs)


@pytest.mark.gpu
def test_cuda_launch_on_another_current_device(gen):
    # A public copy on cuda:1 while cuda:0 is current compiles and runs in cuda:1's context.
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    pool = make_pool(gen, 2, 16, [((64,), torch.uint8)], device="cuda:1", pin=True)
    before = (snapshot(pool.host_table), snapshot(pool.device_table))
    with torch.cuda.device(0):
        copy_rows(pool.host_table, pool.device_table, [1, 2], [3, 4], backend=TritonBackend())
    torch.cuda.synchronize(1)
    assert_copied(pool.host_table, pool.device_table, *before, [1, 2], [3, 4])


@pytest.mark.gpu
def test_cuda_triton_needs_pinned_host(gen):
    pool = make_pool(gen, 1, 8, [((16,), torch.uint8)], device="cuda", pin=False)
    before = snapshot(pool.device_table)
    with pytest.raises(ValueError, match="pinned"):
        copy_rows(pool.host_table, pool.device_table, [0], [1], backend="triton")
    assert_unchanged(pool.device_table, before)
    # The copy engine accepts pageable memory (slower, same bytes).
    copy_rows(pool.host_table, pool.device_table, [0], [1], backend=CopyEngineBackend())
