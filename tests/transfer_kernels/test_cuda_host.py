"""Real pinned host memory on a GPU: the production reservation path, chunk edges, large offsets.

Every case copies random bytes and compares bytes against the pure-torch reference; the
host side is hicache's own reservation (anonymous mmap + cudaHostRegister in chunks), not
torch's ``pin_memory()``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from host_pools.memory import HostBudget, HostReservation
from transfer_kernels import CopyEngineBackend, RowTable, TritonBackend, copy_rows

pytestmark = pytest.mark.gpu
BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)
GIB = 1 << 30


def _host_table(res: HostReservation, name: str, row_bytes: int, num_layers: int,
                layout: str) -> RowTable:
    buf = res.buffers[name]
    if layout == "page_first":
        rows = buf.view(-1, num_layers, row_bytes)
        views = [[rows[:, layer]] for layer in range(num_layers)]
    else:
        rows = buf.view(num_layers, -1, row_bytes)
        views = [[rows[layer]] for layer in range(num_layers)]
    return RowTable.from_views(views, name, chunk_starts=res.chunks.get(name))


def _device_table(num_rows: int, row_bytes: int, num_layers: int, gen) -> RowTable:
    views = [[torch.randint(0, 256, (num_rows, row_bytes), dtype=torch.uint8, generator=gen).cuda()]
             for _ in range(num_layers)]
    return RowTable.from_views(views, "device")


def _fill(table: RowTable, rows: np.ndarray, gen) -> None:
    for layer in table.views:
        for v in layer:
            idx = torch.from_numpy(rows)
            v[idx] = torch.randint(0, 256, (len(rows), v.shape[1]), dtype=torch.uint8, generator=gen)


@pytest.mark.parametrize("backend", ["triton", "copy_engine", "copy_engine_no_batch"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_pool_over_two_gib_crossing_chunks(gen, backend, layout):
    # 2.25 GiB pinned in 1 GiB chunks: runs that straddle a chunk edge and rows above the
    # 2 GiB offset, both directions, byte-exact; untouched device rows unchanged.
    row_bytes, num_layers = 37440, 2
    stride = row_bytes * (num_layers if layout == "page_first" else 1)
    num_rows = (9 * GIB // 4) // (row_bytes * num_layers)
    res = HostReservation(pin=True)
    res.reserve({"p": num_rows * row_bytes * num_layers}, BIG, row_strides={"p": stride})
    assert len(res.chunks["p"]) >= 3
    host = _host_table(res, "p", row_bytes, num_layers, layout)
    # rows around every chunk edge inside any layer's view (consecutive rows: one run
    # crossing it) and the last rows
    edge_rows = [r for layer in range(num_layers) for e in res.chunks["p"][1:]
                 if 3 <= (r := int(-(-(e - host.ptrs[layer, 0].item()) // stride))) < num_rows - 3]
    assert edge_rows
    src = np.unique(np.concatenate([np.arange(r - 3, r + 3) for r in edge_rows]
                                   + [np.arange(num_rows - 5, num_rows)]))
    dst = np.arange(len(src))
    _fill(host, src, gen)
    device = _device_table(len(src) + 7, row_bytes, num_layers, gen)
    impl = (TritonBackend() if backend == "triton"
            else CopyEngineBackend(batch=backend == "copy_engine"))
    before = [v[0].clone() for v in device.views]
    with torch.cuda.stream(torch.cuda.Stream()):
        copy_rows(host, device, src, dst, backend=impl)
    torch.cuda.synchronize()
    for layer in range(num_layers):
        got = device.views[layer][0].cpu()
        assert torch.equal(got[: len(src)], host.views[layer][0][torch.from_numpy(src)])
        assert torch.equal(got[len(src):], before[layer][len(src):].cpu())
    if backend != "triton":
        assert impl.pieces > 2 * len(edge_rows)  # runs were cut at the chunk edges
    # and back: device rows into host rows above 2 GiB and across the edges
    device2 = _device_table(len(src), row_bytes, num_layers, gen)
    copy_rows(device2, host, dst, src, backend=impl)
    torch.cuda.synchronize()
    for layer in range(num_layers):
        assert torch.equal(host.views[layer][0][torch.from_numpy(src)], device2.views[layer][0].cpu())
    res.release()


@pytest.mark.parametrize("batch", [True, False])
@pytest.mark.parametrize("min_rows", [2, 1000])
def test_copy_engine_strided_runs(gen, batch, min_rows, monkeypatch):
    # page_first host rows are strided: runs go as 2-D copies or row pieces in a batch.
    monkeypatch.setattr("transfer_kernels.tuning.COPY_ENGINE_2D_MIN_ROWS", min_rows)
    row_bytes, num_layers, num_rows = 1728, 3, 64
    res = HostReservation(pin=True)
    res.reserve({"p": num_rows * row_bytes * num_layers}, BIG,
                row_strides={"p": row_bytes * num_layers})
    host = _host_table(res, "p", row_bytes, num_layers, "page_first")
    _fill(host, np.arange(num_rows), gen)
    device = _device_table(num_rows, row_bytes, num_layers, gen)
    src = np.r_[0:10, 20:21, 30:45, 63:64]
    dst = np.r_[40:50, 5:6, 10:25, 0:1]
    before = [v[0].cpu() for v in device.views]
    impl = CopyEngineBackend(batch=batch)
    with torch.cuda.stream(torch.cuda.Stream()):  # the batched call needs a real stream
        copy_rows(host, device, src, dst, layers=[0, 2], backend=impl)
    torch.cuda.synchronize()
    assert impl.copies == (1 if batch and min_rows > 2 else impl.copies)
    for layer in range(num_layers):
        got, want = device.views[layer][0].cpu(), before[layer].clone()
        if layer != 1:
            want[torch.from_numpy(dst)] = host.views[layer][0][torch.from_numpy(src)]
        assert torch.equal(got, want)
    res.release()


def test_host_pointer_is_the_device_pointer():
    from host_pools import cuda_host

    res = HostReservation(pin=True)
    buf = res.reserve({"a": 1 << 20}, BIG)["a"]
    assert cuda_host.device_pointer(buf.data_ptr()) == buf.data_ptr()
    res.release()


def test_failed_registration_leaves_no_cuda_error_behind():
    # Registering the same range twice fails; the error is named and cleared, so the
    # next unrelated torch call does not raise it.
    from host_pools import cuda_host

    res = HostReservation(pin=True)
    buf = res.reserve({"a": 1 << 20}, BIG)["a"]
    with pytest.raises(RuntimeError, match="cudaHostRegister .* CUDA error"):
        cuda_host.register(buf.data_ptr(), 1 << 20)
    torch.zeros(4, device="cuda").add_(1)
    torch.cuda.synchronize()
    res.release()
