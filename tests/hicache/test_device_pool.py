"""`DevicePool`: fresh buffers, adopting a server's tensors, allocators on own-indexed pools only."""
from __future__ import annotations

import pytest
import torch

from hicache.device_pool import DevicePool, as_row_bytes
from hicache.models import deepseek_v4, mha, preset

NUM_ROWS = 4


def _int8_kv():
    """MHA int8 anchor, rows of 2 tokens: k int8, k_scale fp16, v int8, v_scale fp16 per layer."""
    return mha(3, 2, 16, kv_quant="int8", page_size=2).anchor


def _server_tensors(spec, num_rows: int, gen: torch.Generator) -> list[list[torch.Tensor]]:
    """What a server would hand over: one contiguous tensor per layer and buffer, random content."""
    out = []
    for _ in range(spec.num_layers):
        layer = []
        for b in spec.buffers:
            raw = torch.randint(1, 127, (num_rows, *b.row_shape), generator=gen, dtype=torch.int16)
            layer.append(raw.to(b.dtype))
        out.append(layer)
    return out


# ---------------------------------------------------------------- allocate


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-8b-int8", "llama-3.1-8b-fp8", "deepseek-v3",
                                  "deepseek-v3-fp8", "deepseek-v3.2", "deepseek-v4-flash"])
def test_allocate_shapes_and_dtypes(name):
    stack = preset(name, 2)
    for spec in stack.data_pools():
        pool = DevicePool.allocate(spec, NUM_ROWS)
        assert len(pool.tensors) == spec.num_layers
        for layer in pool.tensors:
            assert [(tuple(t.shape), t.dtype) for t in layer] == \
                [((NUM_ROWS, *b.row_shape), b.dtype) for b in spec.buffers]
            assert all(t.device.type == "cpu" and t.is_contiguous() for t in layer)
        assert pool.nbytes == NUM_ROWS * spec.num_layers * spec.row_bytes
        assert pool.num_tokens == NUM_ROWS * spec.tokens_per_row


def test_allocate_rejects_negative_rows():
    with pytest.raises(ValueError, match="num_rows"):
        DevicePool.allocate(_int8_kv(), -1)


def test_row_views_are_byte_views_of_the_tensors(gen):
    spec = _int8_kv()
    pool = DevicePool.from_tensors(spec, _server_tensors(spec, NUM_ROWS, gen))
    views = pool.row_views()
    expected = [[(NUM_ROWS, b.row_bytes) for b in spec.buffers]] * spec.num_layers
    assert [[tuple(v.shape) for v in layer] for layer in views] == expected
    for layer_t, layer_v in zip(pool.tensors, views):
        for t, v in zip(layer_t, layer_v):
            assert v.dtype == torch.uint8 and v.data_ptr() == t.data_ptr()
    # bytes written through the view change the tensor (v_scale of layer 1, row 2)
    views[1][3][2].fill_(0x3C)
    assert bool((pool.tensors[1][3][2].view(torch.uint8) == 0x3C).all())
    assert bool((pool.tensors[1][3][1].view(torch.uint8) != 0x3C).any())


def test_as_row_bytes_flattens_without_copy():
    t = torch.ones(5, 2, 3, dtype=torch.float32)
    v = as_row_bytes(t)
    assert v.shape == (5, 24) and v.dtype == torch.uint8 and v.data_ptr() == t.data_ptr()


# ---------------------------------------------------------------- from_tensors


def test_from_tensors_adopts_without_copy(gen):
    spec = _int8_kv()
    tensors = _server_tensors(spec, NUM_ROWS, gen)
    pool = DevicePool.from_tensors(spec, tensors)
    assert pool.num_rows == NUM_ROWS and pool.device == torch.device("cpu")
    for theirs, ours in zip(tensors, pool.tensors):
        assert [t.data_ptr() for t in theirs] == [t.data_ptr() for t in ours]
    # a write on the server's tensor shows in the pool
    tensors[2][0][1].fill_(9)
    assert bool((pool.tensors[2][0][1] == 9).all())


def test_from_tensors_rejects_wrong_layer_count(gen):
    spec = _int8_kv()
    with pytest.raises(ValueError, match=r"tensors: pool 'kv' has 3 layers, got 2"):
        DevicePool.from_tensors(spec, _server_tensors(spec, NUM_ROWS, gen)[:2])


def test_from_tensors_rejects_wrong_buffer_count(gen):
    spec = _int8_kv()
    tensors = _server_tensors(spec, NUM_ROWS, gen)
    tensors[1] = tensors[1][:3]
    with pytest.raises(ValueError, match=r"tensors\[1\]: pool 'kv' has buffers"):
        DevicePool.from_tensors(spec, tensors)


def test_from_tensors_rejects_empty_first_layer(gen):
    spec = _int8_kv()
    tensors = _server_tensors(spec, NUM_ROWS, gen)
    tensors[0] = []
    with pytest.raises(ValueError, match=r"tensors\[0\]"):
        DevicePool.from_tensors(spec, tensors)


def _bad_shape(t):
    return t[:-1].clone()


def _bad_dtype(t):
    return t.to(torch.float32)


def _non_contiguous(t):
    # same shape and dtype, but a row stride twice the row size
    return torch.stack([t, t], dim=1)[:, 0]


@pytest.mark.parametrize("corrupt, match", [
    (_bad_shape, "shape must be"),
    (_bad_dtype, "dtype must be"),
    (_non_contiguous, "must be contiguous"),
], ids=["shape", "dtype", "non_contiguous"])
def test_from_tensors_rejects_bad_tensor_naming_layer_and_role(gen, corrupt, match):
    spec = _int8_kv()
    tensors = _server_tensors(spec, NUM_ROWS, gen)
    # corrupt the "v" buffer of layer 2
    tensors[2][2] = corrupt(tensors[2][2])
    with pytest.raises(ValueError, match=rf"tensors\[2\]\['v'\]: {match}"):
        DevicePool.from_tensors(spec, tensors)


def test_from_tensors_rejects_rows_differing_from_layer_zero(gen):
    spec = _int8_kv()
    tensors = _server_tensors(spec, NUM_ROWS, gen)
    tensors[0] = [t[:2].clone() for t in tensors[0]]  # layer 0 says 2 rows, the rest have 4
    with pytest.raises(ValueError, match=r"tensors\[1\]\['k'\]: shape must be \(2, 2, 2, 16\)"):
        DevicePool.from_tensors(spec, tensors)


@pytest.mark.parametrize("other", ["meta", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_from_tensors_rejects_device_mismatch(gen, other):
    # Layer 0 on the CPU, layer 1 elsewhere (meta works without a GPU): refused, naming it.
    spec = _int8_kv()
    tensors = _server_tensors(spec, NUM_ROWS, gen)
    tensors[1] = [t.to(other) for t in tensors[1]]
    with pytest.raises(ValueError, match=r"tensors\[1\]\['k'\]: device must be cpu"):
        DevicePool.from_tensors(spec, tensors)


def test_from_tensors_rejects_data_less_spec():
    with pytest.raises(ValueError, match="DevicePool.logical"):
        DevicePool.from_tensors(deepseek_v4([4]).anchor, [])


# ---------------------------------------------------------------- allocators


def test_own_indexed_pool_alloc_free(gen):
    spec = _int8_kv()  # rows of 2 tokens: the allocator hands out whole rows
    pool = DevicePool.from_tensors(spec, _server_tensors(spec, NUM_ROWS, gen))
    slots = pool.alloc(4)
    assert slots.tolist() == [0, 1, 2, 3] and pool.available() == 4
    assert pool.rows_of(slots).tolist() == [0, 1]
    with pytest.raises(ValueError, match="page_size=2"):
        pool.alloc(3)
    assert pool.alloc(6) is None and pool.available() == 4
    assert pool.free(slots) == 4 and pool.available() == 8
    with pytest.raises(ValueError, match="double free"):
        pool.free(slots)
    pool.allocator.check_integrity()


def test_logical_anchor_pool_allocates_pages():
    stack = deepseek_v4([4, 128])
    pool = DevicePool.logical(stack.anchor, 1024, page_size=stack.page_size)
    assert pool.tensors == [] and pool.nbytes == 0
    pages = pool.alloc(512)
    assert pages.tolist() == list(range(512)) and pool.available() == 512
    assert pool.free(pages) == 512


def test_swa_pool_allocates_rows_and_sidecars_have_no_allocator():
    stack = deepseek_v4([4, 128])
    swa = DevicePool.allocate(stack.pool("swa"), NUM_ROWS)
    assert swa.allocator.page_size == 128 and swa.available() == NUM_ROWS * 128
    assert swa.alloc(128).tolist() == list(range(128))
    for name in ("c4_kv", "c4_indexer", "c128_kv", "c4_state", "c4_indexer_state"):
        pool = DevicePool.allocate(stack.pool(name), NUM_ROWS)
        assert pool.allocator is None
        with pytest.raises(ValueError, match=f"pool '{name}' borrows indices"):
            pool.alloc(stack.pool(name).tokens_per_row)
        with pytest.raises(ValueError, match="borrows indices"):
            pool.free(torch.arange(stack.pool(name).tokens_per_row))
        with pytest.raises(ValueError, match="borrows indices"):
            pool.available()
