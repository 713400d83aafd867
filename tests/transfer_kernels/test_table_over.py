"""`RowTable.over`: a table of views into one buffer, built from offsets without the views,
is the table `from_views` builds of those views (every field, and the views made later)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from transfer_kernels import RowTable
from transfer_kernels.backends.ring import Ring
from transfer_kernels.backends.staging import _staging_table
from transfer_kernels.quant.codec import Int8Codec


def _same(a: RowTable, b: RowTable) -> None:
    for name in ("name", "num_layers", "num_buffers", "num_rows", "row_bytes", "row_strides", "device", "codec"):
        assert getattr(a, name) == getattr(b, name), name
    assert torch.equal(a.ptrs, b.ptrs) and a.ptrs.dtype == b.ptrs.dtype
    assert torch.equal(a.align, b.align) and a.align.dtype == b.align.dtype
    assert a.chunk_starts is None and b.chunk_starts is None
    for la, lb in zip(a.views, b.views, strict=True):
        for va, vb in zip(la, lb, strict=True):
            assert (va.data_ptr(), va.shape, va.stride(), va.dtype) == (vb.data_ptr(), vb.shape, vb.stride(), vb.dtype)
    assert a.page_span() is None if b.page_span() is None else a.page_span()[1] == b.page_span()[1]


@pytest.mark.parametrize("num_rows", [1, 2, 7])
@pytest.mark.parametrize("row_bytes", [(64,), (48, 16), (5, 3, 8)])
def test_over_is_from_views_of_the_same_views(num_rows, row_bytes):
    rng = np.random.default_rng(num_rows * 31 + len(row_bytes))
    buf = torch.empty(1 << 16, dtype=torch.uint8)
    stride = sum(row_bytes) * 3 + 1  # odd: alignment 1 where rows step by it
    offsets = rng.integers(0, 1 << 10, size=(5, len(row_bytes))) * rng.choice([1, 2, 16], size=(5, len(row_bytes)))
    views = [[buf.as_strided((num_rows, n), (stride, 1), int(o)) for o, n in zip(row, row_bytes)] for row in offsets]
    _same(RowTable.over(buf, offsets, num_rows, stride, row_bytes, "t"), RowTable.from_views(views, "t"))


def test_over_refuses_views_outside_the_buffer_and_foreign_rows():
    buf = torch.empty(256, dtype=torch.uint8)
    with pytest.raises(ValueError, match="offsets: t views reach byte 264 of a 256-byte buffer"):
        RowTable.over(buf, np.array([[200]]), 2, 32, (32,), "t")
    with pytest.raises(ValueError, match="offsets: t"):
        RowTable.over(buf, np.array([[-1]]), 1, 8, (8,), "t")
    with pytest.raises(ValueError, match="offsets: t needs"):
        RowTable.over(buf, np.array([[0]]), 0, 8, (8,), "t")  # a table has rows
    with pytest.raises(ValueError, match="buffer: t needs a 1-D contiguous uint8 tensor"):
        RowTable.over(buf.view(torch.int32), np.array([[0]]), 1, 8, (8,), "t")
    codec = Int8Codec(torch.bfloat16, (8,), (8,))  # host rows: 8 int8 bytes, then a 4-byte scale
    with pytest.raises(ValueError, match="codec: t rows"):
        RowTable.over(buf, np.array([[0, 8]]), 1, 12, (8, 8), "t", codec=codec)


def _staging_reference(host: RowTable, ring: Ring, chunks, offsets, num_rows: int, stride: int) -> RowTable:
    """The staging table as it was built before `RowTable.over`: a view per (layer, buffer)."""
    buf, where = ring.buffer(), {}
    for (first, count), off in zip(chunks.tolist(), offsets.tolist()):
        for layer in range(first, first + count):
            where[layer] = off + (layer - first) * sum(host.row_bytes)
    inner = np.cumsum((0,) + host.row_bytes[:-1]).tolist()
    views = [[buf.as_strided((num_rows, n), (stride, 1), where.get(layer, int(offsets[0])) + o)
              for o, n in zip(inner, host.row_bytes)] for layer in range(host.num_layers)]
    return RowTable.from_views(views, f"{host.name}.staging", codec=host.codec)


@pytest.mark.parametrize("chunks", [[[0, 6]], [[0, 2], [2, 2], [4, 2]], [[1, 2], [4, 1]], [[5, 1]]])
@pytest.mark.parametrize("num_rows", [1, 3])
def test_staging_tables_are_the_per_view_tables(chunks, num_rows):
    host_buf = torch.empty(4, 6, 40, dtype=torch.uint8)  # page_first: 4 rows, 6 layers, 24 + 16 bytes
    host = RowTable.from_views([[host_buf[:, l, :24], host_buf[:, l, 24:]] for l in range(6)], "kv.host")
    ring = Ring(torch.device("cpu"), "h2d", 1 << 16)
    chunks = np.asarray(chunks, dtype=np.int64)
    k = int(chunks[:, 1].max())
    region = -(-num_rows * k * 40 // 256) * 256
    offsets = 512 + region * np.arange(len(chunks), dtype=np.int64)
    got = _staging_table(host, ring, chunks, offsets, num_rows, k * 40)
    _same(got, _staging_reference(host, ring, chunks, offsets, num_rows, k * 40))
