"""Byte-exact copies against copy_rows_ref for every backend that runs on this machine.

Triton runs interpreted here (TRITON_INTERPRET=1 from tests/conftest.py), so every case
stays small: a few layers, a few rows, row bytes in the hundreds.
"""
from __future__ import annotations

import pytest
import torch

from tests.transfer_kernels.oracles import device_desc
from tests.transfer_kernels.pools import (DEVICE, assert_copied, assert_unchanged, make_pool,
                                          random_map, snapshot)
from transfer_kernels import (BACKEND_NAMES, CopyJob, RowTable, copy_rows, copy_rows_batch,
                              get_backend)

BACKENDS = list(BACKEND_NAMES)
FP8 = getattr(torch, "float8_e4m3fn", torch.int8)
# bf16 data (16 B rows), a float32 [3, 4] block (48 B) and an fp8 5-byte buffer (odd size).
MIXED = [((8,), torch.bfloat16), ((3, 4), torch.float32), ((5,), FP8)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("layers", [None, [1]], ids=["all_layers", "layer1"])
def test_host_device_copy(gen, backend, layout, direction, layers):
    # A 3-layer pool of three buffers of different dtypes; 5 scattered rows move.
    pool = make_pool(gen, num_layers=3, num_rows=12, buffers=MIXED, layout=layout)
    src_side, dst_side = ("device", "host") if direction == "d2h" else ("host", "device")
    src, dst = pool.table(src_side), pool.table(dst_side)
    src_rows, dst_rows = random_map(gen, 12, 12, 5)
    src_before, dst_before = snapshot(src), snapshot(dst)
    copy_rows(src, dst, src_rows, dst_rows, layers=layers, backend=backend)
    assert_copied(src, dst, src_before, dst_before, src_rows, dst_rows, layers)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8, torch.uint8, FP8,
                                   torch.float16], ids=str)
def test_device_dtypes(gen, backend, dtype):
    # One buffer of a given dtype; H2D into a layer_first host buffer's views.
    pool = make_pool(gen, 2, 9, [((2, 4), dtype)], layout="layer_first")
    src, dst = pool.device_table, pool.host_table
    src_rows, dst_rows = torch.tensor([8, 0, 3]), torch.tensor([2, 8, 0])
    src_before, dst_before = snapshot(src), snapshot(dst)
    copy_rows(src, dst, src_rows, dst_rows, backend=backend)
    assert_copied(src, dst, src_before, dst_before, src_rows, dst_rows)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("layers", [None, 0], ids=["all_layers", "layer0"])
def test_batch_of_pools_with_scales(gen, backend, direction, layers):
    # Three pools with different row sizes, one with data + scale buffers, one launch.
    pools = [
        make_pool(gen, 2, 10, [((16,), torch.bfloat16)] * 2, "page_first", name="kv"),
        make_pool(gen, 2, 6, [((72,), torch.bfloat16)], "layer_first", name="mla"),
        make_pool(gen, 2, 8, [((41,), FP8), ((8,), FP8), ((1,), torch.float32)],
                  "page_first", name="dsa"),
    ]
    jobs, befores = [], []
    for p in pools:
        src_side, dst_side = ("device", "host") if direction == "d2h" else ("host", "device")
        src, dst = p.table(src_side), p.table(dst_side)
        src_rows, dst_rows = random_map(gen, p.num_rows, p.num_rows, 3)
        jobs.append(CopyJob(src, dst, src_rows, dst_rows))
        befores.append((snapshot(src), snapshot(dst)))
    copy_rows_batch(jobs, layers=layers, backend=backend)
    want_layers = None if layers is None else [layers]
    for job, (sb, db) in zip(jobs, befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows, want_layers)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row_bytes", [7, 133, 40, 1])
@pytest.mark.parametrize("case", ["one_row", "last_row", "all_rows", "runs"])
def test_boundary_sizes(gen, backend, row_bytes, case):
    # Odd row sizes (not multiples of 16) and boundary row sets on a page_first host.
    pool = make_pool(gen, 2, 7, [((row_bytes,), torch.uint8)], "page_first")
    src_rows, dst_rows = {
        "one_row": ([3], [5]),
        "last_row": ([6, 0], [0, 6]),
        "all_rows": (torch.randperm(7, generator=gen), torch.randperm(7, generator=gen)),
        "runs": ([0, 1, 2, 5, 6], [2, 3, 4, 0, 1]),  # two runs for the copy engine
    }[case]
    src, dst = pool.host_table, pool.device_table
    src_before, dst_before = snapshot(src), snapshot(dst)
    copy_rows(src, dst, src_rows, dst_rows, backend=backend)
    assert_copied(src, dst, src_before, dst_before, src_rows, dst_rows)


@pytest.mark.parametrize("backend", BACKENDS)
def test_job_layers_override_call_layers(gen, backend):
    # Job 0 names layer 2; job 1 takes the call's layer 0; a plain tuple is a job too.
    a = make_pool(gen, 3, 6, [((24,), torch.uint8)], "layer_first", name="a")
    b = make_pool(gen, 3, 6, [((8,), torch.float32)], "page_first", name="b")
    before = [(snapshot(p.host_table), snapshot(p.device_table)) for p in (a, b)]
    copy_rows_batch([CopyJob(a.host_table, a.device_table, [1, 2], [0, 5], layers=[2]),
                     (b.device_table, b.host_table, [4], [4])], layers=[0], backend=backend)
    assert_copied(a.host_table, a.device_table, *before[0], [1, 2], [0, 5], [2])
    assert_copied(b.device_table, b.host_table, before[1][1], before[1][0], [4], [4], [0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_device_to_device_and_index_dtypes(gen, backend):
    # Two device-side tables (16-byte aligned rows); int32 and list indices are accepted.
    a = make_pool(gen, 2, 8, [((32,), torch.bfloat16)], name="a")
    b = make_pool(gen, 2, 8, [((32,), torch.bfloat16)], name="b")
    src, dst = a.device_table, b.device_table
    src_before, dst_before = snapshot(src), snapshot(dst)
    copy_rows(src, dst, torch.tensor([7, 1, 2], dtype=torch.int32), [0, 3, 4], backend=backend)
    assert_copied(src, dst, src_before, dst_before, [7, 1, 2], [0, 3, 4])


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_copy_is_a_no_op(gen, backend):
    pool = make_pool(gen, 2, 4, [((16,), torch.uint8)])
    impl = get_backend(backend)
    before = snapshot(pool.device_table)
    copy_rows(pool.host_table, pool.device_table, [], [], backend=impl)
    copy_rows(pool.host_table, pool.device_table, [1], [1], layers=[], backend=impl)
    assert impl.launches == 0
    assert_unchanged(pool.device_table, before)


def test_table_geometry_and_desc_cache(gen):
    pool = make_pool(gen, 3, 5, [((8,), torch.bfloat16), ((1,), torch.float32)], "page_first")
    host, dev = pool.host_table, pool.device_table
    assert host.row_bytes == dev.row_bytes == (16, 4) and host.signature == (16, 4)
    assert host.row_strides == (3 * 20, 3 * 20) and dev.row_strides == (16, 4)
    assert host.ptrs.shape == (3, 2) and host.ptrs.dtype == torch.int64
    assert int(host.ptrs[1, 1]) == host.views[1][1].data_ptr()
    assert device_desc(host, torch.device(DEVICE)) is device_desc(host, torch.device(DEVICE))
    assert device_desc(host, torch.device(DEVICE)).shape == (3, 2, 2)
    assert isinstance(host, RowTable) and host.is_pinned == (DEVICE == "cuda")


def test_copy_engine_cuts_runs_at_registration_chunks(gen):
    # Pure arithmetic of the CUDA path: a run of host rows crossing a pinned chunk start
    # becomes two copies, cut exactly at the first row past the chunk start.
    import numpy as np

    from transfer_kernels.backends.copy_engine import cut_at_chunks

    pool = make_pool(gen, 2, 16, [((24,), torch.uint8)], "page_first", device="cpu", pin=False)
    host, dev = pool.host_table, pool.device_table
    stride, base = host.row_strides[0], int(host.ptrs[0, 0])
    buf0 = base  # layer 0, buffer 0 starts the buffer in page_first
    chunks = np.array([buf0, buf0 + 5 * stride, buf0 + 11 * stride], dtype=np.int64)
    host = RowTable.from_views(host.views, "host", chunk_starts=chunks)
    s0, d0, k = (np.array([2, 14]), np.array([0, 20]), np.array([10, 2]))  # rows 2..11 cross two
    for layer in (0, 1):
        got = cut_at_chunks(host, dev, layer, 0, s0, d0, k)
        assert [x.tolist() for x in got] == [[2, 5, 11, 14], [0, 3, 9, 20], [3, 6, 1, 2]]
    # as the destination side: cut by the destination's rows
    got = cut_at_chunks(dev, host, 0, 0, d0, s0, k)
    assert [x.tolist() for x in got] == [[0, 3, 9, 20], [2, 5, 11, 14], [3, 6, 1, 2]]
