"""Model stacks: DeepSeek-V4 (DESIGN §4), MHA with quantized KV, MLA, DSA, and the named presets."""
from __future__ import annotations

import pytest
import torch

from hicache.models import (FLASH_RATIOS, PRESETS, PRO_RATIOS, REAL_GEOMETRY, deepseek_v4, dsa, geometry_for_dims,
                            mha, mla, preset)
from hicache.models.dense import FP8
from host_pools.spec import PoolKind

DSV4_ROW_BYTES = {"swa": 74_880, "c4_kv": 37_440, "c4_indexer": 8_448, "c128_kv": 1_728,
                  "c4_state": 65_536, "c4_indexer_state": 16_384}
DSV4_SOURCES = {"kv": None, "swa": None, "c4_kv": "kv", "c4_indexer": "kv", "c128_kv": "kv",
                "c4_state": "swa", "c4_indexer_state": "swa"}


# ---------------------------------------------------------------- DeepSeek-V4


def test_dsv4_row_bytes_kinds_and_rows():
    stack = deepseek_v4([4, 128])
    assert {p.name: p.row_bytes for p in stack.data_pools()} == DSV4_ROW_BYTES
    assert stack.anchor.name == "kv" and not stack.anchor.has_data and stack.page_size == 256
    assert {p.name: p.kind for p in stack} == {
        "kv": PoolKind.ANCHOR, "swa": PoolKind.STATE, "c4_kv": PoolKind.HISTORY,
        "c4_indexer": PoolKind.HISTORY, "c128_kv": PoolKind.HISTORY, "c4_state": PoolKind.STATE,
        "c4_indexer_state": PoolKind.STATE}
    assert {p.name: p.tokens_per_row for p in stack} == {
        "kv": 1, "swa": 128, "c4_kv": 256, "c4_indexer": 256, "c128_kv": 256, "c4_state": 128,
        "c4_indexer_state": 128}
    assert all(p.window_tokens == 128 for p in stack if p.kind is PoolKind.STATE)


def test_dsv4_sources():
    stack = deepseek_v4([4, 128])
    assert {p.name: p.indices_from for p in stack} == DSV4_SOURCES
    assert [p.name for p in stack.own_indexed] == ["kv", "swa"]


@pytest.mark.parametrize("name, ratios, layers, c4, c128", [
    ("deepseek-v4-flash", FLASH_RATIOS, 43, 21, 20),  # compress_ratios [0, 0, (4, 128) x 20, 4]
    ("deepseek-v4-pro", PRO_RATIOS, 61, 30, 31),
])
def test_dsv4_preset_layer_counts(name, ratios, layers, c4, c128):
    stack = preset(name)
    assert stack.model == name and len(ratios) == layers
    counts = {p.name: p.num_layers for p in stack}
    assert counts == {"kv": 0, "swa": layers, "c4_kv": c4, "c4_indexer": c4, "c128_kv": c128,
                      "c4_state": c4, "c4_indexer_state": c4}
    assert stack.num_model_layers == layers
    # layer ids point at the layers with the matching ratio
    assert stack.pool("c4_kv").layer_ids == tuple(i for i, r in enumerate(ratios) if r == 4)
    assert stack.pool("c128_kv").layer_ids == tuple(i for i, r in enumerate(ratios) if r == 128)


def test_dsv4_custom_ratio_list():
    stack = deepseek_v4([4, 0, 128, 4])
    ids = {p.name: p.layer_ids for p in stack}
    assert ids == {"kv": (), "swa": (0, 1, 2, 3), "c4_kv": (0, 3), "c4_indexer": (0, 3),
                   "c128_kv": (2,), "c4_state": (0, 3), "c4_indexer_state": (0, 3)}


def test_dsv4_only_zeros_has_no_compressed_pools():
    stack = deepseek_v4([0, 0, 0])
    assert [p.name for p in stack] == ["kv", "swa"]
    assert stack.pool("swa").num_layers == 3


def test_dsv4_only_ratio_128_has_no_c4_pools():
    assert [p.name for p in deepseek_v4([128, 0])] == ["kv", "swa", "c128_kv"]


@pytest.mark.parametrize("ratios", [[4, 8], [2], [0, -4], [256]])
def test_dsv4_rejects_other_ratios(ratios):
    with pytest.raises(ValueError, match="compress_ratios"):
        deepseek_v4(ratios)


def test_dsv4_rejects_empty_ratio_list():
    with pytest.raises(ValueError, match="compress_ratios"):
        deepseek_v4([])


def test_dsv4_preset_cut_to_first_layers():
    stack = preset("deepseek-v4-pro", 3)  # 128, 128, 4
    assert {p.name: p.layer_ids for p in stack if p.num_layers} == {
        "swa": (0, 1, 2), "c4_kv": (2,), "c4_indexer": (2,), "c128_kv": (0, 1), "c4_state": (2,),
        "c4_indexer_state": (2,)}


# ---------------------------------------------------------------- MHA


def _layout(stack):
    return [(b.role, b.row_shape, b.dtype) for b in stack.anchor.buffers]


def test_mha_bf16():
    stack = mha(4, 8, 128, page_size=64)
    assert _layout(stack) == [("k", (64, 8, 128), torch.bfloat16), ("v", (64, 8, 128), torch.bfloat16)]
    assert stack.anchor.row_bytes == 2 * 64 * 8 * 128 * 2
    assert stack.anchor.kind is PoolKind.ANCHOR and stack.anchor.num_layers == 4
    assert [p.name for p in stack] == ["kv"]


def test_mha_int8_has_fp16_scale_per_8_elements_after_its_data():
    stack = mha(2, 8, 128, kv_quant="int8", page_size=16)
    assert _layout(stack) == [
        ("k", (16, 8, 128), torch.int8), ("k_scale", (16, 8, 16), torch.float16),
        ("v", (16, 8, 128), torch.int8), ("v_scale", (16, 8, 16), torch.float16)]
    # per token: 2 x (8 x 128 B data + 8 x 16 x 2 B scales)
    assert stack.anchor.row_bytes == 16 * 2 * (1024 + 256)


def test_mha_fp8_has_fp32_scale_per_token_and_head():
    stack = mha(2, 4, 64, kv_quant="fp8", page_size=32)
    assert _layout(stack) == [
        ("k", (32, 4, 64), FP8), ("k_scale", (32, 4), torch.float32),
        ("v", (32, 4, 64), FP8), ("v_scale", (32, 4), torch.float32)]
    assert stack.anchor.row_bytes == 32 * 2 * (4 * 64 + 4 * 4)


def test_mha_tokens_per_row_override():
    stack = mha(2, 8, 128, page_size=64, tokens_per_row=16)
    assert stack.anchor.tokens_per_row == 16 and stack.anchor.buffers[0].row_shape == (16, 8, 128)


@pytest.mark.parametrize("kwargs, match", [
    ({"kv_quant": "int4"}, "kv_quant"),
    ({"kv_quant": "int8", "head_dim": 100}, "head_dim"),
    ({"page_size": 0}, "page_size"),
])
def test_mha_rejects_bad_arguments(kwargs, match):
    args = {"num_layers": 2, "num_kv_heads": 8, "head_dim": 128, **kwargs}
    with pytest.raises(ValueError, match=match):
        mha(**args)


# ---------------------------------------------------------------- MLA and DSA


def test_mla_bf16_is_1152_bytes_per_token():
    stack = mla(3, page_size=64)
    assert _layout(stack) == [("kv", (64, 576), torch.bfloat16)]
    assert stack.anchor.row_bytes == 64 * 1152


def test_mla_fp8_is_656_bytes_per_token():
    stack = mla(3, fp8=True, page_size=64)
    assert _layout(stack) == [("kv", (64, 656), torch.uint8)]
    assert stack.anchor.row_bytes == 64 * 656


def test_dsa_has_kv_indexer_and_indexer_scale():
    stack = dsa(5, page_size=64)
    assert _layout(stack) == [("kv", (64, 656), torch.uint8), ("indexer", (64, 128), FP8),
                              ("indexer_scale", (64, 1), torch.float32)]
    assert stack.anchor.row_bytes == 64 * (656 + 128 + 4)
    assert stack.anchor.num_layers == 5


# ---------------------------------------------------------------- presets


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_and_is_labelled(name):
    full, cut = preset(name), preset(name, 2)
    assert full.model == name and cut.model == name
    # a cut keeps the first two layers' pools (Nemotron-H's layer 1 is an MLP block: in no pool)
    assert cut.num_model_layers == (1 if name == "nemotron-h-8b" else 2) and full.num_model_layers > 2


def test_real_layer_counts_of_dense_presets():
    assert preset("llama-3.1-8b").anchor.num_layers == 32
    assert preset("deepseek-v3").anchor.num_layers == 61
    assert preset("deepseek-v3.2").anchor.num_layers == 61


def test_unknown_preset_lists_known_names():
    with pytest.raises(ValueError, match="unknown preset 'gpt-5'") as info:
        preset("gpt-5")
    assert all(name in str(info.value) for name in PRESETS)


@pytest.mark.parametrize("name,layers", [("deepseek-v4-pro", 0), ("deepseek-v4-pro", 62), ("deepseek-v3", 999),
                                         ("llama-3.1-8b", 33)])
def test_preset_rejects_a_layer_count_outside_the_model(name, layers):
    # 999 layers of deepseek-v3 used to build a 999-layer stack (and size 16x the real pools)
    total = PRESETS[name].num_layers
    with pytest.raises(ValueError, match=rf"num_layers: {name} has {total} layers; must be in \[1, {total}\]"):
        preset(name, layers)
    assert preset(name, total).num_model_layers == total


# ---------------------------------------------------------------- DeepSeek-V4 geometry


def test_dsv4_flash_ratios_match_the_model_config():
    # the checkpoint's compress_ratios: [0, 0, (4, 128) x 20, 4]
    assert FLASH_RATIOS[:2] == (0, 0) and FLASH_RATIOS[-1] == 4
    assert FLASH_RATIOS[2:-1] == (4, 128) * 20
    assert (FLASH_RATIOS.count(0), FLASH_RATIOS.count(4), FLASH_RATIOS.count(128)) == (2, 21, 20)


def test_dsv4_geometry_for_dims_follows_the_dims():
    # page 32, window 16, ratios 4 and 16: page : HCA ratio = 2, as 256 : 128 in the real model
    g = geometry_for_dims(32, 16, 4, 16, head_dim=64, index_head_dim=32)
    stack = deepseek_v4([0, 4, 16, 4], "toy", geometry=g)
    shapes = {p.name: (p.tokens_per_row, p.buffers[0].row_shape, p.buffers[0].dtype) for p in stack.data_pools()}
    f32 = torch.float32
    assert shapes == {"swa": (16, (16, 64), f32), "c4_kv": (32, (8, 64), f32), "c4_indexer": (32, (8, 32), f32),
                      "c128_kv": (32, (2, 64), f32), "c4_state": (16, (8, 256), f32),
                      "c4_indexer_state": (16, (8, 128), f32)}
    assert stack.page_size == 32 and stack.pool("c128_kv").layer_ids == (2,)
    assert all(p.window_tokens == 16 for p in stack if p.kind is PoolKind.STATE)
    assert {p.name: p.indices_from for p in stack} == DSV4_SOURCES


def test_dsv4_geometry_rejects_ratios_of_another_geometry():
    g = geometry_for_dims(32, 16, 4, 16, head_dim=64, index_head_dim=32)
    with pytest.raises(ValueError, match=r"compress_ratios: entries must be in \(0, 4, 16\)"):
        deepseek_v4([0, 128], geometry=g)


@pytest.mark.parametrize("dims, match", [
    ((32, 16, 4, 24), "page_size: 32 must be a multiple of hca_ratio=24"),
    ((32, 12, 4, 16), "page_size: 32 must be a multiple of window=12"),
    ((32, 16, 4, 4), "hca_ratio: must differ"),
    ((32, 16, 0, 16), "page_size / ratios: must be >= 1"),
])
def test_dsv4_geometry_rejects_pages_that_cut_windows(dims, match):
    with pytest.raises(ValueError, match=match):
        geometry_for_dims(*dims, head_dim=64, index_head_dim=32)


def test_dsv4_real_geometry_is_the_presets():
    assert REAL_GEOMETRY.ratios == (0, 4, 128) and REAL_GEOMETRY.page_size == 256
    assert deepseek_v4([4, 128]) == deepseek_v4([4, 128], geometry=REAL_GEOMETRY)
