"""Every bad input raises ValueError (or TypeError) naming the argument; nothing is copied."""
from __future__ import annotations

import pytest
import torch

from tests.transfer_kernels.pools import (assert_copied, assert_unchanged, make_pool, snapshot,
                                          sync)
from transfer_kernels import (BACKEND_NAMES, CopyJob, FaultyBackend, RowTable, as_row_bytes,
                              TorchBackend, copy_rows, copy_rows_batch, get_backend)


@pytest.fixture
def pools(gen):
    # Two compatible pools' worth of tables (a, b) and one with another layout (c).
    a = make_pool(gen, 2, 8, [((16,), torch.uint8), ((4,), torch.uint8)], "page_first", name="a")
    b = make_pool(gen, 2, 8, [((16,), torch.uint8), ((4,), torch.uint8)], "layer_first", name="b")
    c = make_pool(gen, 2, 8, [((12,), torch.uint8)], name="c")
    return a, b, c


BAD_SINGLE = [
    # (case, src_rows, dst_rows, layers, message)
    ("length", [0, 1], [0], None, "dst_rows: length 1 differs from src_rows length 2"),
    ("src_high", [0, 8], [0, 1], None, r"src_rows: values must be in \[0, 8\), got max 8"),
    ("dst_high", [0, 1], [0, 130], None, r"dst_rows: values must be in \[0, 8\), got max 130"),
    ("negative", [-1], [0], None, r"src_rows: values must be in \[0, 8\), got min -1"),
    ("twice", [0, 1, 2], [5, 3, 5], None, "dst_rows: row 5 of a.device written twice"),
    ("float", torch.tensor([0.0]), [0], None, "src_rows: dtype must be an integer type"),
    ("bool", [0], torch.tensor([True]), None, "dst_rows: dtype must be an integer type"),
    ("2d", torch.tensor([[0, 1]]), [0, 1], None, "src_rows: must be 1-D"),
    ("layer_high", [0], [0], [2], r"layers: values must be in \[0, 2\), got 2"),
    ("layer_neg", [0], [0], [-1], r"layers: values must be in \[0, 2\), got -1"),
    ("layer_twice", [0], [0], [1, 1], "layers: layer 1 listed twice"),
    ("layer_type", [0], [0], ["0"], "layers: must be ints"),
]


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("case,src_rows,dst_rows,layers,message", BAD_SINGLE,
                         ids=[c[0] for c in BAD_SINGLE])
def test_bad_rows_and_layers(pools, backend, case, src_rows, dst_rows, layers, message):
    a = pools[0]
    before = snapshot(a.device_table)
    with pytest.raises(ValueError, match=message):
        copy_rows(a.host_table, a.device_table, src_rows, dst_rows, layers=layers, backend=backend)
    assert_unchanged(a.device_table, before)


def test_incompatible_tables(pools):
    a, b, c = pools
    before = snapshot(c.device_table)
    with pytest.raises(ValueError, match=r"dst: buffer layout \(row bytes\) \(12,\)"):
        copy_rows(a.host_table, c.device_table, [0], [0])
    assert_unchanged(c.device_table, before)
    one_layer = RowTable.from_views([a.device_table.views[0]], "one_layer")
    before = snapshot(one_layer)
    with pytest.raises(ValueError, match="dst: one_layer has 1 layers, src a.host has 2"):
        copy_rows(a.host_table, one_layer, [0], [0])
    assert_unchanged(one_layer, before)


def test_dst_row_written_twice_across_jobs(pools):
    # Job 1 writes row 3 of a.device again: rejected before job 0 copies anything.
    a, b, _ = pools
    before = snapshot(a.device_table), snapshot(b.device_table)
    with pytest.raises(ValueError, match=r"jobs\[2\].dst_rows: row 3 of a.device written twice "
                                         r"\(also by jobs\[0\]\)"):
        copy_rows_batch([(a.host_table, a.device_table, [0, 1], [3, 4]),
                         (b.host_table, b.device_table, [0], [3]),
                         (b.host_table, a.device_table, [2], [3])])
    assert_unchanged(a.device_table, before[0])
    assert_unchanged(b.device_table, before[1])


def test_same_rows_in_disjoint_layers_is_allowed(pools):
    # Row 3 of layer 0 and row 3 of layer 1 are different bytes: no double write.
    a, b, _ = pools
    copy_rows_batch([CopyJob(a.host_table, a.device_table, [0], [3], layers=[0]),
                     CopyJob(b.host_table, a.device_table, [1], [3], layers=[1])])
    sync()
    assert torch.equal(a.device_table.views[0][0][3].cpu(), a.host_table.views[0][0][0])
    assert torch.equal(a.device_table.views[1][0][3].cpu(), b.host_table.views[1][0][1])


def test_same_table_overlap(pools):
    a = pools[0]
    before = snapshot(a.device_table)
    with pytest.raises(ValueError, match="dst_rows: row 2 of a.device is also a source row"):
        copy_rows(a.device_table, a.device_table, [1, 2], [2, 3])
    assert_unchanged(a.device_table, before)


def test_overlap_split_across_two_jobs(pools):
    # Job 0 reads row 1 of a.device while job 1 writes it: the result would depend on
    # which job a backend copies first. Rejected; rows of other layers are fine.
    a, b, _ = pools
    before = snapshot(a.device_table)
    with pytest.raises(ValueError, match=r"jobs\[1\].dst_rows: row 1 of a.device is also a "
                                         r"source row of the same table \(read by jobs\[0\]\)"):
        copy_rows_batch([(a.device_table, b.device_table, [1], [0]),
                         (a.host_table, a.device_table, [0], [1])])
    assert_unchanged(a.device_table, before)
    copy_rows_batch([CopyJob(a.device_table, b.device_table, [1], [0], layers=[0]),
                     CopyJob(a.host_table, a.device_table, [0], [1], layers=[1])])


def test_device_mismatch(pools):
    # A table on an unsupported device and index tensors on a foreign device.
    a = pools[0]
    meta = RowTable.from_views([[torch.empty(8, 16, dtype=torch.uint8, device="meta"),
                                 torch.empty(8, 4, dtype=torch.uint8, device="meta")]] * 2,
                               "meta_table")
    before = snapshot(a.device_table)
    with pytest.raises(ValueError, match="src: device must be cpu or cuda, got meta"):
        copy_rows(meta, a.device_table, [0], [0])
    with pytest.raises(ValueError, match="src_rows: must be on cpu or the execution device"):
        copy_rows(a.host_table, a.device_table, torch.zeros(1, dtype=torch.int64, device="meta"),
                  [0])
    assert_unchanged(a.device_table, before)


def test_bad_types_and_names(pools):
    a = pools[0]
    with pytest.raises(ValueError, match="backend: must be one of"):
        copy_rows(a.host_table, a.device_table, [0], [0], backend="cuda")
    with pytest.raises(TypeError, match="dst: must be a RowTable"):
        copy_rows(a.host_table, a.device_table.views, [0], [0])
    with pytest.raises(TypeError, match=r"jobs\[0\]: must be a CopyJob"):
        copy_rows_batch([(a.host_table, a.device_table)])
    with pytest.raises(ValueError, match="fail_on_launch"):
        FaultyBackend("torch", 0)
    backend = TorchBackend()
    assert get_backend(backend) is backend
    assert get_backend("torch") is not get_backend("torch")  # a name is never shared


@pytest.mark.parametrize("views,message", [
    ([], "views: t needs >= 1 layer"),
    ([[torch.zeros(4, 8, dtype=torch.uint8)], [torch.zeros(4, 9, dtype=torch.uint8)]],
     r"views\[1\]\[0\]: t row bytes 9 differ"),
    ([[torch.zeros(4, 8, dtype=torch.uint8)], [torch.zeros(5, 8, dtype=torch.uint8)]],
     r"views\[1\]\[0\]: t has 5 rows"),
    ([[torch.zeros(4, 8, dtype=torch.uint8)], [torch.zeros(4, 16, dtype=torch.uint8)[:, :8]]],
     r"views\[1\]\[0\]: t row stride 16 differs"),
    ([[torch.zeros(4, 8, dtype=torch.uint8)], []], r"views\[1\]: t layer has 0 buffers"),
    ([[torch.zeros(4, 2, dtype=torch.float32)]], "must be a 2-D uint8 tensor"),
    ([[torch.zeros(4, dtype=torch.uint8)]], "must be a 2-D uint8 tensor"),
    ([[torch.zeros(8, 4, dtype=torch.uint8).t()]], "last-dim stride must be 1"),
])
def test_from_views_rejects_inconsistent_views(views, message):
    with pytest.raises(ValueError, match=message):
        RowTable.from_views(views, "t")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8, torch.bool,
                                   getattr(torch, "float8_e5m2", torch.uint8)], ids=str)
def test_as_row_bytes(gen, dtype):
    raw = torch.randint(0, 256, (6, 4 * 8), dtype=torch.uint8, generator=gen)
    t = raw.view(dtype).view(6, 2, -1)[::2]  # rows strided, each row contiguous
    rows = as_row_bytes(t)
    assert rows.dtype == torch.uint8 and rows.shape == (3, 32)
    assert rows.data_ptr() == t.data_ptr() and torch.equal(rows, raw[::2])
    with pytest.raises(ValueError, match="t: each row must be contiguous"):
        as_row_bytes(t.transpose(1, 2))
    with pytest.raises(ValueError, match="t: must have a row dimension"):
        as_row_bytes(torch.tensor(1.0))


@pytest.mark.gpu
def test_cuda_devices_and_device_rows(gen):
    # One call runs on one device; CUDA index tensors are accepted (values not read back).
    cpu = make_pool(gen, 1, 8, [((16,), torch.uint8)], device="cpu", pin=False, name="cpu")
    gpu = make_pool(gen, 1, 8, [((16,), torch.uint8)], device="cuda", name="gpu")
    before = snapshot(gpu.device_table)
    with pytest.raises(ValueError, match="jobs: job 1 runs on cuda:0 but job 0 on cpu"):
        copy_rows_batch([(cpu.host_table, cpu.device_table, [0], [1]),
                         (gpu.host_table, gpu.device_table, [0], [1])])
    with pytest.raises(ValueError, match="src_rows: must be on cpu or the execution device cpu"):
        copy_rows(cpu.host_table, cpu.device_table, torch.tensor([0], device="cuda"), [1])
    assert_unchanged(gpu.device_table, before)
    src_before = snapshot(gpu.host_table)
    copy_rows(gpu.host_table, gpu.device_table, torch.tensor([0, 3], device="cuda"),
              torch.tensor([5, 1], device="cuda"), backend="triton")
    assert_copied(gpu.host_table, gpu.device_table, src_before, before, [0, 3], [5, 1])
