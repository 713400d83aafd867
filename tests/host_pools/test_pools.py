"""Host pools: shapes and bytes per preset and layout, row-view geometry, the logical anchor, groups."""
from __future__ import annotations

import pytest
import torch

from hicache.models import PRESETS, deepseek_v4, preset
from host_pools.group import HostPoolGroup
from host_pools.memory import HostBudget
from host_pools.pools import LAYOUTS, HostPool, LogicalHostPool
from host_pools.spec import BufferSpec, PoolKind, PoolSpec

NUM_ROWS = 3


def _random_bytes(gen: torch.Generator, n: int) -> torch.Tensor:
    """Random bytes in [1, 255]: never zeros, so a lost write cannot pass for a match."""
    return torch.randint(1, 256, (n,), generator=gen, dtype=torch.uint8)


def _fill(pool: HostPool, gen: torch.Generator) -> None:
    pool.buffer.view(-1).copy_(_random_bytes(gen, pool.nbytes))


def _big_budget() -> HostBudget:
    return HostBudget(1 << 40, None, 0, 1, 1 << 40)


# ---------------------------------------------------------------- shapes and bytes


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_shapes_and_bytes_for_every_preset(name, layout):
    stack = preset(name, 4)
    for spec in stack.data_pools():
        pool = HostPool(spec, NUM_ROWS, layout)
        L, B = spec.num_layers, spec.row_bytes
        expected = (NUM_ROWS, L, B) if layout == "page_first" else (L, NUM_ROWS, B)
        assert pool.buffer.shape == expected and pool.buffer.dtype == torch.uint8
        assert pool.buffer.is_contiguous()
        assert pool.nbytes == NUM_ROWS * L * B == HostPool.bytes_for(spec, NUM_ROWS)
        assert pool.num_tokens == NUM_ROWS * spec.tokens_per_row
        # own-indexed pools carry an allocator over their token slots, sidecars none
        if spec.is_sidecar:
            assert pool.allocator is None
            with pytest.raises(ValueError, match="borrows indices"):
                pool.alloc(spec.tokens_per_row)
        else:
            assert pool.allocator.num_slots == pool.num_tokens
            assert pool.available() == pool.num_tokens


def test_dsv4_preset_pool_row_bytes_in_host_pools():
    stack = preset("deepseek-v4-flash", 4)  # ratios 0, 0, 4, 128
    sizes = {spec.name: HostPool(spec, 1).nbytes for spec in stack.data_pools()}
    assert sizes == {"swa": 4 * 74_880, "c4_kv": 37_440, "c4_indexer": 8_448, "c128_kv": 1_728,
                     "c4_state": 65_536, "c4_indexer_state": 16_384}


def test_host_pool_rejects_bad_arguments():
    spec = preset("llama-3.1-8b", 2).anchor
    with pytest.raises(ValueError, match="layout"):
        HostPool(spec, 2, "row_major")
    with pytest.raises(ValueError, match="num_rows"):
        HostPool(spec, -1)
    with pytest.raises(ValueError, match="storage"):
        HostPool(spec, 2, storage=torch.empty(HostPool.bytes_for(spec, 2) - 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="storage"):
        HostPool(spec, 2, storage=torch.empty(HostPool.bytes_for(spec, 2), dtype=torch.int8))
    with pytest.raises(ValueError, match="LogicalHostPool"):
        HostPool(preset("deepseek-v4-flash", 2).anchor, 2)


def test_host_pool_adopts_storage_without_copy():
    spec = preset("deepseek-v3", 2).anchor
    storage = torch.empty(HostPool.bytes_for(spec, 2), dtype=torch.uint8)
    pool = HostPool(spec, 2, "layer_first", storage=storage)
    assert pool.buffer.data_ptr() == storage.data_ptr()


# ---------------------------------------------------------------- row views


def _quantized_spec() -> PoolSpec:
    """An int8-MHA-like pool: k, k_scale, v, v_scale (rows of 2 tokens, 2 heads)."""
    bufs = (BufferSpec("k", (2, 2, 8), torch.int8), BufferSpec("k_scale", (2, 2, 1), torch.float16),
            BufferSpec("v", (2, 2, 8), torch.int8), BufferSpec("v_scale", (2, 2, 1), torch.float16))
    return PoolSpec("kv", PoolKind.ANCHOR, 3, bufs, tokens_per_row=2)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_row_view_writes_land_at_the_right_byte(layout, gen):
    spec = _quantized_spec()  # row bytes 32 + 8 + 32 + 8 = 80, offsets 0, 32, 40, 72
    assert spec.buffer_offsets() == (0, 32, 40, 72) and spec.row_bytes == 80
    pool = HostPool(spec, 5, layout)
    _fill(pool, gen)
    before = pool.buffer.clone()
    views = pool.row_views()
    assert len(views) == 3 and [len(v) for v in views] == [4, 4, 4]
    assert [v.shape for v in views[0]] == [(5, 32), (5, 8), (5, 32), (5, 8)]
    # write a pattern through the view of (layer 2, buffer "v", row 4)
    pattern = _random_bytes(gen, 32)
    views[2][2][4].copy_(pattern)
    # it lands at the byte the layout says: row-major [R, L, B] or [L, R, B], then offset 40
    flat_row = 4 * 3 + 2 if layout == "page_first" else 2 * 5 + 4
    start = flat_row * 80 + 40
    flat = pool.buffer.view(-1)
    assert torch.equal(flat[start:start + 32], pattern)
    # every other byte is unchanged
    mask = torch.ones(pool.nbytes, dtype=torch.bool)
    mask[start:start + 32] = False
    assert torch.equal(flat[mask], before.view(-1)[mask])
    # read_rows reads the same bytes back
    assert torch.equal(pool.read_rows(torch.tensor([4]), 2, "v")[0], pattern)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_buffers_are_concatenated_in_spec_order(layout, gen):
    spec = _quantized_spec()
    pool = HostPool(spec, 4, layout)
    _fill(pool, gen)
    views = pool.row_views()
    for layer in range(spec.num_layers):
        whole = pool.buffer[:, layer] if layout == "page_first" else pool.buffer[layer]
        # the buffers of a row, read in spec order, are the row
        assert torch.equal(torch.cat(views[layer], dim=1), whole)
    # page_first keeps a row of all layers in one contiguous span
    if layout == "page_first":
        row = pool.buffer[1].reshape(-1)
        assert torch.equal(row, torch.cat([torch.cat(views[l], dim=1)[1] for l in range(3)]))


def test_read_rows_selects_rows(gen):
    pool = HostPool(_quantized_spec(), 6)
    _fill(pool, gen)
    rows = torch.tensor([5, 0, 3])
    got = pool.read_rows(rows, 1, "k_scale")
    assert torch.equal(got, pool.buffer[rows, 1, 32:40])


# ---------------------------------------------------------------- LogicalHostPool


def test_logical_host_pool_alloc_free():
    pool = LogicalHostPool(num_tokens=1024, page_size=256)
    assert pool.buffer is None and pool.nbytes == 0 and pool.name == "kv"
    assert pool.spec.kind is PoolKind.ANCHOR and not pool.spec.has_data
    # two pages, page-aligned
    a = pool.alloc(512)
    assert a.tolist() == list(range(512)) and pool.available() == 512
    # a non-page request is a ValueError, more than is free is None
    with pytest.raises(ValueError, match="page_size=256"):
        pool.alloc(100)
    assert pool.alloc(768) is None and pool.available() == 512
    b = pool.alloc(512)
    assert pool.available() == 0
    # frees give pages back; a double free is refused and changes nothing
    assert pool.free(a) == 512 and pool.available() == 512
    with pytest.raises(ValueError, match="double free"):
        pool.free(a)
    with pytest.raises(ValueError, match="aligned"):
        pool.free(b[128:384])
    assert pool.available() == 512
    pool.free(b)
    assert pool.available() == 1024
    pool.allocator.check_integrity()


def test_logical_host_pool_rejects_partial_pages():
    with pytest.raises(ValueError, match="num_slots"):
        LogicalHostPool(num_tokens=1000, page_size=256)


# ---------------------------------------------------------------- HostPoolGroup


def _dsv4_group(layout: str = "page_first") -> HostPoolGroup:
    """DeepSeek-V4 with ratios 0, 4, 128, 4: 4 host pages (1024 tokens), 6 SWA rows."""
    stack = deepseek_v4([0, 4, 128, 4])
    rows = {"kv": 1024, "swa": 6, "c4_kv": 4, "c4_indexer": 4, "c128_kv": 4, "c4_state": 6,
            "c4_indexer_state": 6}
    return HostPoolGroup.allocate(stack, rows, layout, _big_budget())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_group_derives_sidecar_rows_from_anchor_and_from_swa(layout):
    group = _dsv4_group(layout)
    # step 1: allocate 3 anchor pages; free the middle one and re-take it for a mixed order
    kv = group["kv"].alloc(768)
    group["kv"].free(kv[256:512])
    kv = torch.cat([group["kv"].alloc(256), kv[:256], kv[512:]])
    # step 2: allocate 2 SWA rows (128 tokens each) from swa's own allocator
    swa = group["swa"].alloc(256)
    assert swa is not None and group["swa"].available() == 4 * 128
    # step 3: derive the rows of every data pool from the two token spaces
    rows = group.derive_rows({"kv": kv, "swa": swa})
    pages = (kv.view(-1, 256)[:, 0] // 256).tolist()
    swa_rows = (swa.view(-1, 128)[:, 0] // 128).tolist()
    assert pages == [1, 0, 2] and swa_rows == [0, 1]
    assert {n: r.tolist() for n, r in rows.items()} == {
        "c4_kv": pages, "c4_indexer": pages, "c128_kv": pages,  # from the anchor
        "swa": swa_rows, "c4_state": swa_rows, "c4_indexer_state": swa_rows,  # from swa
    }
    # step 4: sidecars have no allocator of their own
    for name in ("c4_kv", "c4_state"):
        with pytest.raises(ValueError, match="borrows indices"):
            group[name].alloc(256)
    group.check_integrity()


def test_group_derive_rows_rejects_unaligned_anchor_slots():
    group = _dsv4_group()
    with pytest.raises(ValueError, match="aligned runs of 256"):
        group.derive_rows({"kv": torch.arange(128, 384)})


def test_group_unknown_pool_lists_known_names():
    with pytest.raises(ValueError, match="c4_kv"):
        _dsv4_group()["c4"]


def _pools(stack, rows: dict[str, int]):
    anchor = LogicalHostPool(rows["kv"], stack.page_size)
    return anchor, [HostPool(p, rows[p.name], page_size=None) for p in stack.data_pools()]


def test_group_rejects_missing_source():
    stack = deepseek_v4([4])
    anchor, pools = _pools(stack, {"kv": 256, "swa": 2, "c4_kv": 1, "c4_indexer": 1, "c4_state": 2,
                                   "c4_indexer_state": 2})
    # leave out swa: c4_state and c4_indexer_state name a source that is not there
    with pytest.raises(ValueError, match="'swa', which is not in the stack"):
        HostPoolGroup(anchor, [p for p in pools if p.name != "swa"])


def test_group_rejects_cycle():
    u8 = torch.uint8
    a = PoolSpec("a", PoolKind.HISTORY, 1, (BufferSpec("x", (8,), u8),), 4, indices_from="b")
    b = PoolSpec("b", PoolKind.HISTORY, 1, (BufferSpec("x", (8,), u8),), 4, indices_from="a")
    anchor = LogicalHostPool(16, 4)
    with pytest.raises(ValueError, match="cycle"):
        HostPoolGroup(anchor, [HostPool(a, 4), HostPool(b, 4)])


@pytest.mark.parametrize("short", ["c4_kv", "c4_state"])
def test_group_rejects_sidecar_with_too_few_rows(short):
    stack = deepseek_v4([4, 0])
    rows = {"kv": 512, "swa": 3, "c4_kv": 2, "c4_indexer": 2, "c4_state": 3, "c4_indexer_state": 3}
    rows[short] -= 1
    anchor, pools = _pools(stack, rows)
    with pytest.raises(ValueError, match=f"sidecar '{short}' has .* fewer than"):
        HostPoolGroup(anchor, pools)


def test_group_rejects_sidecar_rows_that_do_not_divide_the_root_page():
    u8 = torch.uint8
    # root "own" allocates rows of 4 tokens; the sidecar wants rows of 8
    own = PoolSpec("own", PoolKind.STATE, 1, (BufferSpec("x", (8,), u8),), 4, window_tokens=4)
    side = PoolSpec("side", PoolKind.STATE, 1, (BufferSpec("x", (8,), u8),), 8, indices_from="own",
                    window_tokens=8)
    with pytest.raises(ValueError, match="does not divide"):
        HostPoolGroup(LogicalHostPool(16, 8), [HostPool(own, 4), HostPool(side, 2)])


def test_group_anchor_argument_must_be_the_anchor():
    stack = deepseek_v4([0])
    anchor, pools = _pools(stack, {"kv": 256, "swa": 2})
    with pytest.raises(ValueError, match="not an ANCHOR"):
        HostPoolGroup(pools[0], [anchor])
