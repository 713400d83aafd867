"""Prefill FLOPs in closed form against a position-by-position sum, and the time's shape."""
from __future__ import annotations

import pytest

from hicache.cost import PrefillModel, load_profile
from hicache.models.presets import PRESETS
from hicache.models.shape import Attention, LayerGroup, ModelShape, dense_shape, shape_from_hf

RATES = load_profile("h100").prefill
KINDS = [Attention(4, 32, 16),  # full
         Attention(4, 32, 16, window=7),  # sliding window
         Attention(2, 64, 64, window=5, ratio=4, topk=3, index_heads=3, index_dim=8),  # CSA
         Attention(2, 64, 64, window=5, ratio=16),  # HCA
         Attention(8, 16, 16, window=0, ratio=1, topk=9, index_heads=2, index_dim=4),  # DSA
         Attention(1, 1, 1, window=0, state_flops=77)]  # recurrent


def naive(a: Attention, first: int, last: int) -> int:
    """Attention FLOPs of positions first..last (context L of each), as the shape defines them."""
    total = 0
    for L in range(first, last + 1):
        window = L if a.window is None else min(L, a.window)
        entries = L // a.ratio if a.ratio else 0
        attended = window + (entries if a.topk is None else min(entries, a.topk))
        total += 2 * a.heads * (a.qk_dim + a.v_dim) * attended + 2 * a.index_heads * a.index_dim * entries
        total += a.state_flops
    return total


@pytest.mark.parametrize("kind", KINDS)
def test_closed_form_equals_the_sum_over_positions(kind):
    shape = ModelShape("toy", (LayerGroup(3, kind, 1000),), 50, "bf16", 1)
    model = PrefillModel(shape, RATES)
    for cached in (0, 1, 4, 15, 16, 17, 63):
        for n in (1, 2, 5, 16, 40, 129):
            assert model.attention_flops(n, cached) == 3 * naive(kind, cached + 1, cached + n), (cached, n)
            assert model.flops(n, cached) == 2 * (3000 * n + 50) + 3 * naive(kind, cached + 1, cached + n)


def test_time_grows_with_new_tokens_and_context_and_has_a_floor():
    model = PrefillModel(PRESETS["llama-3.1-8b"].shape, RATES)
    assert model.seconds(2048, 0) < model.seconds(4096, 0) < model.seconds(4096, 4096)
    # a few tokens read every weight once: the floor, whatever the context
    floor = RATES.fixed_s + PRESETS["llama-3.1-8b"].shape.weight_bytes / (RATES.hbm_gbps * 1e9)
    assert model.seconds(1, 0) == model.seconds(8, 100) == pytest.approx(floor) == model.floor_s
    assert model.seconds(0, 4096) == model.seconds(1, 4095)  # a full hit still computes the last token


def test_preset_shapes_match_public_parameter_counts():
    # active parameters (linear + LM head, not the input embedding) against the published figures
    expect = {"llama-3.1-8b": 7.5, "deepseek-v3": 36.6, "deepseek-v4-flash": 13.2, "deepseek-v4-pro": 48.8}
    for name, billions in expect.items():
        s = PRESETS[name].shape
        assert (s.linear_params + s.head_params) / 1e9 == pytest.approx(billions, rel=0.03), name
        assert s.num_layers == PRESETS[name].num_layers


def test_a_hugging_face_config_gives_the_same_shape_as_its_preset():
    llama = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
    assert shape_from_hf(llama, "llama-3.1-8b") == PRESETS["llama-3.1-8b"].shape
    gemma = {"text_config": {**llama, "num_hidden_layers": 6, "sliding_window": 512,
                             "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}}
    groups = shape_from_hf(gemma).groups
    assert [(g.count, g.attention.window) for g in groups] == [(5, 512), (1, None)]
    assert shape_from_hf({**llama, "sliding_window": 64, "sliding_window_pattern": 2}).groups[0].count == 16
    with pytest.raises(ValueError, match="'hidden_size' must be an int >= 1"):
        shape_from_hf({**llama, "hidden_size": None}, "m")


def test_bad_dense_shapes_are_refused():
    with pytest.raises(ValueError, match="kv_heads must be an int >= 1"):
        dense_shape("m", 2, 64, 4, 0, 16, 128, 100)
    with pytest.raises(ValueError, match="3 windows for 2 layers"):
        dense_shape("m", 2, 64, 4, 2, 16, 128, 100, windows=[None] * 3)


def test_hybrid_preset_shapes_count_their_models_parameters():
    # every parameter (linear + LM head + the input embedding) against the dense models' published
    # totals; the MoE models' active parameters near their "A3B"; a linear layer reads no attention
    # but updates its state
    for name, billions, rel in (("qwen3.5-27b", 27, 0.03), ("nemotron-h-8b", 8, 0.03),
                                ("qwen3.5-35b-a3b", 3, 0.2), ("qwen3-next-80b-a3b", 3, 0.35)):
        s = PRESETS[name].shape
        embed = s.head_params if billions > 5 else 0
        assert (s.linear_params + s.head_params + embed) / 1e9 == pytest.approx(billions, rel=rel), name
        assert s.num_layers == PRESETS[name].num_layers
        linear = [g for g in s.groups if g.attention.state_flops]
        assert linear and all(g.attention.window == 0 for g in linear), name
