"""Pool specs and stacks (host_pools/spec.py): validation, row bytes, offsets, row derivation."""
from __future__ import annotations

import pytest
import torch

from host_pools.spec import BufferSpec, HitPolicy, PoolKind, PoolSpec, Stack, slots_to_rows

U8 = torch.uint8


def _buf(role: str = "kv", shape: tuple[int, ...] = (4, 8), dtype: torch.dtype = U8) -> BufferSpec:
    return BufferSpec(role, shape, dtype)


def _anchor(name: str = "kv", tokens_per_row: int = 1) -> PoolSpec:
    """A data-less anchor (DeepSeek-V4 style)."""
    return PoolSpec(name, PoolKind.ANCHOR, 0, (), tokens_per_row=tokens_per_row)


def _history(name: str, source: str | None, tokens_per_row: int = 4, num_layers: int = 2) -> PoolSpec:
    return PoolSpec(name, PoolKind.HISTORY, num_layers, (_buf(),), tokens_per_row, indices_from=source)


def _state(name: str, source: str | None, tokens_per_row: int = 4) -> PoolSpec:
    return PoolSpec(name, PoolKind.STATE, 2, (_buf(),), tokens_per_row, indices_from=source,
                    window_tokens=tokens_per_row)


# ---------------------------------------------------------------- BufferSpec


@pytest.mark.parametrize("shape", [(0,), (4, 0), (-1, 8), ()])
def test_buffer_spec_rejects_non_positive_shapes(shape):
    with pytest.raises(ValueError, match="row_shape"):
        BufferSpec("kv", shape, U8)


def test_buffer_spec_rejects_empty_role_and_non_dtype():
    with pytest.raises(ValueError, match="role"):
        BufferSpec("", (4,), U8)
    with pytest.raises(ValueError, match="dtype"):
        BufferSpec("kv", (4,), "uint8")  # type: ignore[arg-type]


@pytest.mark.parametrize("shape, dtype, expected", [
    ((64, 8, 128), torch.bfloat16, 64 * 8 * 128 * 2),
    ((64, 8, 16), torch.float16, 64 * 8 * 16 * 2),
    ((64, 8), torch.float32, 64 * 8 * 4),
    ((37_440,), torch.uint8, 37_440),
    ((8, 2048), torch.float32, 65_536),
])
def test_buffer_row_bytes(shape, dtype, expected):
    assert BufferSpec("x", shape, dtype).row_bytes == expected


def test_buffer_spec_normalises_shape_to_int_tuple():
    spec = BufferSpec("k", [3, 5], U8)  # type: ignore[arg-type]
    assert spec.row_shape == (3, 5) and isinstance(spec.row_shape, tuple)


# ---------------------------------------------------------------- PoolSpec


@pytest.mark.parametrize("tokens_per_row", [0, -4])
def test_pool_spec_rejects_tokens_per_row_below_one(tokens_per_row):
    with pytest.raises(ValueError, match="tokens_per_row"):
        PoolSpec("c4", PoolKind.HISTORY, 2, (_buf(),), tokens_per_row)


@pytest.mark.parametrize("num_layers", [0, -1])
def test_pool_spec_rejects_non_positive_layers_for_data_pools(num_layers):
    with pytest.raises(ValueError, match="num_layers"):
        PoolSpec("c4", PoolKind.HISTORY, num_layers, (_buf(),), 4)


def test_data_less_anchor_must_have_zero_layers():
    with pytest.raises(ValueError, match="num_layers"):
        PoolSpec("kv", PoolKind.ANCHOR, 3, (), tokens_per_row=1)


def test_non_anchor_pool_needs_a_buffer():
    with pytest.raises(ValueError, match="buffers"):
        PoolSpec("c4", PoolKind.HISTORY, 2, (), 4)


@pytest.mark.parametrize("window", [0, -128])
def test_state_pool_needs_a_window(window):
    with pytest.raises(ValueError, match="window_tokens"):
        PoolSpec("swa", PoolKind.STATE, 2, (_buf(),), 4, window_tokens=window)


@pytest.mark.parametrize("kind", [PoolKind.HISTORY, PoolKind.ANCHOR])
def test_non_state_pool_rejects_a_window(kind):
    with pytest.raises(ValueError, match="window_tokens"):
        PoolSpec("p", kind, 2, (_buf(),), 4, window_tokens=4)


def test_pool_cannot_be_its_own_source():
    with pytest.raises(ValueError, match="indices_from"):
        PoolSpec("c4", PoolKind.HISTORY, 2, (_buf(),), 4, indices_from="c4")


def test_anchor_owns_its_indices():
    with pytest.raises(ValueError, match="indices_from"):
        PoolSpec("kv", PoolKind.ANCHOR, 0, (), tokens_per_row=1, indices_from="swa")


def test_duplicate_buffer_roles_rejected():
    with pytest.raises(ValueError, match="duplicate roles"):
        PoolSpec("kv", PoolKind.ANCHOR, 2, (_buf("k"), _buf("k")), 4)


def test_kind_must_be_a_pool_kind():
    with pytest.raises(ValueError, match="kind"):
        PoolSpec("kv", "anchor", 2, (_buf(),), 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("layer_ids", [(0,), (0, 0), (0, -1), (0, 1, 2)])
def test_layer_ids_must_be_distinct_non_negative_and_one_per_layer(layer_ids):
    with pytest.raises(ValueError, match="layer_ids"):
        PoolSpec("c4", PoolKind.HISTORY, 2, (_buf(),), 4, layer_ids=layer_ids)


def test_pool_spec_defaults_and_hit_policy():
    hist = _history("c4", "kv")
    state = _state("swa", None)
    assert hist.layer_ids == (0, 1)
    assert hist.hit_policy is HitPolicy.ALL_PAGES and hist.is_sidecar
    assert state.hit_policy is HitPolicy.TRAILING_PAGES and not state.is_sidecar
    assert _anchor().hit_policy is HitPolicy.ALL_PAGES and not _anchor().has_data


def test_row_bytes_and_buffer_offsets_follow_spec_order():
    # MHA int8-like row: k, k_scale, v, v_scale; each scale after its data
    bufs = (BufferSpec("k", (4, 2, 16), torch.int8), BufferSpec("k_scale", (4, 2, 2), torch.float16),
            BufferSpec("v", (4, 2, 16), torch.int8), BufferSpec("v_scale", (4, 2, 2), torch.float16))
    spec = PoolSpec("kv", PoolKind.ANCHOR, 3, bufs, tokens_per_row=4)
    sizes = [128, 32, 128, 32]
    assert [b.row_bytes for b in spec.buffers] == sizes
    assert spec.row_bytes == sum(sizes)
    assert spec.buffer_offsets() == (0, 128, 160, 288)
    assert _anchor().row_bytes == 0 and _anchor().buffer_offsets() == ()


# ---------------------------------------------------------------- Stack


def test_stack_rejects_duplicate_pool_names():
    with pytest.raises(ValueError, match="duplicate pool names"):
        Stack((_anchor(), _history("c4", "kv"), _history("c4", "kv")), page_size=4)


@pytest.mark.parametrize("pools", [
    (_history("c4", None),),  # no anchor
    (_anchor("kv"), _anchor("kv2")),  # two anchors
], ids=["none", "two"])
def test_stack_needs_exactly_one_anchor(pools):
    with pytest.raises(ValueError, match="exactly one ANCHOR"):
        Stack(pools, page_size=4)


@pytest.mark.parametrize("page_size", [6, 2, 0])
def test_stack_page_size_must_be_multiple_of_every_tokens_per_row(page_size):
    with pytest.raises(ValueError, match="page_size"):
        Stack((_anchor(), _history("c4", "kv", tokens_per_row=4)), page_size=page_size)


def test_stack_sidecar_source_must_exist():
    with pytest.raises(ValueError, match="'nope'.*not in the stack"):
        Stack((_anchor(), _history("c4", "nope")), page_size=4)


def test_stack_rejects_a_cycle_of_sources():
    # a -> b -> c -> a: every pool borrows indices, none owns them
    pools = (_anchor(), _history("a", "c"), _history("b", "a"), _history("c", "b"))
    with pytest.raises(ValueError, match="cycle"):
        Stack(pools, page_size=4)


def test_stack_rejects_a_two_pool_cycle_reached_from_outside():
    # x -> a -> b -> a: x itself is not on the cycle, the walk must still stop
    pools = (_anchor(), _history("x", "a"), _history("a", "b"), _history("b", "a"))
    with pytest.raises(ValueError, match="cycle"):
        Stack(pools, page_size=4)


def _hybrid() -> Stack:
    """Anchor kv (page 8) with a history sidecar, an own-indexed state pool and its sidecar."""
    return Stack((_anchor(), _history("c8", "kv", tokens_per_row=8), _state("win", None, 4),
                  _state("ring", "win", 4)), page_size=8)


def test_stack_queries():
    stack = _hybrid()
    assert stack.anchor.name == "kv"
    assert [p.name for p in stack.own_indexed] == ["kv", "win"]
    assert stack.root_of("c8").name == "kv" and stack.root_of("ring").name == "win"
    assert [p.name for p in stack.data_pools()] == ["c8", "win", "ring"]
    assert stack.num_model_layers == 2
    with pytest.raises(ValueError, match="unknown pool 'nope'"):
        stack.pool("nope")


# ---------------------------------------------------------------- slots_to_rows / derive_rows


@pytest.mark.parametrize("tokens_per_row", [1, 4, 128])
def test_slots_to_rows_of_aligned_runs(tokens_per_row):
    rows = torch.tensor([5, 2, 9])
    slots = (rows[:, None] * tokens_per_row + torch.arange(tokens_per_row)).reshape(-1)
    assert torch.equal(slots_to_rows(slots, tokens_per_row), rows)
    assert torch.equal(slots_to_rows(slots.to(torch.int32), tokens_per_row), rows)


@pytest.mark.parametrize("slots", [
    torch.tensor([4, 5, 6, 8]),  # not consecutive
    torch.tensor([2, 3, 4, 5]),  # consecutive but unaligned
    torch.tensor([4, 5, 6, 7, 8, 9]),  # not a whole number of runs
    torch.tensor([4, 7, 6, 5]),  # aligned start, shuffled inside the run
], ids=["gap", "unaligned", "partial", "shuffled"])
def test_slots_to_rows_rejects_bad_runs(slots):
    with pytest.raises(ValueError, match="slots"):
        slots_to_rows(slots, 4)


@pytest.mark.parametrize("slots", [torch.tensor([[4, 5, 6, 7]]), torch.tensor([4.0, 5.0, 6.0, 7.0])],
                         ids=["2d", "float"])
def test_slots_to_rows_rejects_shape_and_dtype(slots):
    with pytest.raises(ValueError, match="1-D"):
        slots_to_rows(slots, 4)


def test_derive_rows_per_root():
    stack = _hybrid()
    # anchor pages 1 and 3 (page 8) and window rows 5 and 2 (rows of 4 tokens)
    kv = torch.cat([torch.arange(8, 16), torch.arange(24, 32)])
    win = torch.cat([torch.arange(20, 24), torch.arange(8, 12)])
    rows = stack.derive_rows({"kv": kv, "win": win})
    assert set(rows) == {"c8", "win", "ring"}
    assert rows["c8"].tolist() == [1, 3]
    assert rows["win"].tolist() == [5, 2] and rows["ring"].tolist() == [5, 2]
    # only the roots that were given are derived
    assert set(stack.derive_rows({"win": win})) == {"win", "ring"}


@pytest.mark.parametrize("kv", [
    torch.arange(4, 12),  # a page run starting mid-page
    torch.tensor([8, 9, 10, 11, 12, 13, 14, 16]),  # a hole inside the page
], ids=["unaligned", "non-consecutive"])
def test_derive_rows_rejects_bad_anchor_runs(kv):
    with pytest.raises(ValueError, match="for pool 'c8'"):
        _hybrid().derive_rows({"kv": kv})


def test_rows_of_names_the_pool():
    with pytest.raises(ValueError, match="pool 'c8'"):
        _hybrid().pool("c8").rows_of(torch.arange(1, 9))


def test_row_bytes_per_anchor_page():
    stack = _hybrid()
    # only c8 is rooted at the anchor: 1 row per page, 2 layers, 32 bytes a row
    assert stack.row_bytes_per_anchor_page() == 2 * 32
    assert stack.row_bytes_per_anchor_page(["win"]) == 0
