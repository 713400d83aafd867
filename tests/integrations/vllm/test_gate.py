"""The plugin's load gate (vLLM-free): a host hit loaded whole or recomputed whole, from the
host layout's bytes and the served model's config."""
from __future__ import annotations

import json
import logging

import pytest

from hicache.config import HiCacheConfig
from hicache.cost import load_profile, profile_dict
from hicache.integrations.vllm.gate import layout_footprint, paying_hit, plugin_gate
from hicache.integrations.vllm.groups import plan_groups

SMOLLM2 = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "intermediate_size": 1536, "vocab_size": 49152, "torch_dtype": "bfloat16"}
LAYOUT = plan_groups([256], [None], 64, 2048, [256 * 23040])  # SmolLM2: 23,040 B per token


def config(tmp_path, **prefill) -> HiCacheConfig:
    doc = profile_dict(load_profile("h100"))
    doc["prefill"] |= prefill
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    return HiCacheConfig(load_policy="cost", device_profile=str(path))


def test_a_small_model_on_a_fast_gpu_recomputes_and_on_a_slow_one_loads(tmp_path):
    pending = [0.0]
    fast = plugin_gate(config(tmp_path), SMOLLM2, LAYOUT, lambda: pending[0])
    assert paying_hit(fast, 1024, 0, 768) == 0  # 135M parameters: recomputing beats the load's fixed cost
    slow = plugin_gate(config(tmp_path, bf16_tflops=0.1, fp8_tflops=0.1, attention_tflops=0.1), SMOLLM2, LAYOUT,
                       lambda: pending[0])
    assert paying_hit(slow, 1024, 0, 768) == 768
    pending[0] = 1e12  # a terabyte of loads queued ahead: even the slow GPU recomputes
    assert paying_hit(slow, 1024, 0, 768) == 0


def test_always_or_an_unknown_model_leaves_the_gate_off(tmp_path, caplog):
    assert plugin_gate(HiCacheConfig(load_policy="always"), SMOLLM2, LAYOUT, lambda: 0.0) is None
    with caplog.at_level(logging.WARNING, logger="vllm.hicache"):
        assert plugin_gate(config(tmp_path), {"model_type": "mystery"}, LAYOUT, lambda: 0.0) is None
    assert "load policy cost is off" in caplog.text and "num_hidden_layers" in caplog.text
    with pytest.raises(ValueError, match="hicache_device_profile"):
        plugin_gate(HiCacheConfig(load_policy="cost", device_profile="h300"), SMOLLM2, LAYOUT, lambda: 0.0)


def test_windowed_groups_move_their_window_with_every_load():
    layout = plan_groups([256, 256], [None, 2], 64, 2048, [256 * 1000, 256 * 500])
    fp = layout_footprint(layout)
    assert fp.token_bytes == 1000 and fp.snapshot_bytes == 3 * 256 * 500  # the window + 1 chunks
    assert layout_footprint(plan_groups([256], [None], 64, 2048)) is None  # bytes unknown on this side
