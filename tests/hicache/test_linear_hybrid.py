"""Linear-attention hybrid stacks: the four presets against their public configs, the
recurrent STATE pools, the state interval and their sizing."""
from __future__ import annotations

import pytest
import torch

from hicache.config import HiCacheConfig
from hicache.models import PRESETS, HybridGeometry, linear_hybrid, preset
from hicache.models.linear_hybrid import NEMOTRON_H_8B_PATTERN, from_pattern
from hicache.radix.hybrid import snapshot_sizes
from hicache.sizing import DEFAULT_STATE_INTERVAL, device_root_tokens, plan_sizes, state_interval
from host_pools.memory import HostBudget
from host_pools.spec import BufferSpec, PoolKind, PoolSpec, Stack

# (preset, layers, full-attention layers, kv heads, head dim, conv channels, recurrent state)
CONFIGS = {
    "qwen3.5-27b": (64, 16, 4, 256, 2 * 16 * 128 + 48 * 128, (48, 128, 128)),
    "qwen3.5-35b-a3b": (40, 10, 2, 256, 2 * 16 * 128 + 32 * 128, (32, 128, 128)),
    "qwen3-next-80b-a3b": (48, 12, 2, 256, 2 * 16 * 128 + 32 * 128, (32, 128, 128)),
    "nemotron-h-8b": (52, 4, 8, 128, 128 * 64 + 2 * 8 * 128, (128, 64, 128)),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_presets_follow_their_configs(name):
    layers, full, kv_heads, head_dim, conv_dim, state = CONFIGS[name]
    stack = preset(name)
    assert stack.model == name and PRESETS[name].num_layers == layers and stack.page_size == 64
    kv, conv, rec = stack.pool("attn_kv"), stack.pool("conv"), stack.pool("recurrent")
    assert stack.anchor.name == "kv" and not stack.anchor.has_data
    assert (kv.kind, kv.indices_from, kv.tokens_per_row, kv.num_layers) == (PoolKind.HISTORY, "kv", 64, full)
    assert [b.row_shape for b in kv.buffers] == [(64, kv_heads, head_dim)] * 2
    assert all(b.dtype == torch.bfloat16 for b in kv.buffers)
    linear = layers - full - (24 if name == "nemotron-h-8b" else 0)  # Nemotron-H's MLP layers hold no cache
    assert conv.num_layers == rec.num_layers == linear and conv.layer_ids == rec.layer_ids
    assert set(conv.layer_ids).isdisjoint(kv.layer_ids)
    assert conv.buffers[0].row_shape == (3, conv_dim) and conv.buffers[0].dtype == torch.bfloat16
    assert rec.buffers[0].row_shape == state and rec.buffers[0].dtype == torch.float32
    assert conv.recurrent and rec.recurrent and rec.indices_from == "conv" and conv.indices_from is None
    assert snapshot_sizes(stack) == {"conv": 1}  # a snapshot is one row of every linear layer


def test_qwen_layer_schedule_is_every_fourth_full_and_nemotron_follows_its_pattern():
    assert preset("qwen3.5-27b").pool("attn_kv").layer_ids == tuple(range(3, 64, 4))
    assert from_pattern(NEMOTRON_H_8B_PATTERN).count("linear") == 24
    assert preset("nemotron-h-8b").pool("attn_kv").layer_ids == (7, 18, 29, 40)
    assert [p.name for p in preset("nemotron-h-8b", 4)] == ["kv", "conv", "recurrent"]  # M - M -: no attention yet


def test_recurrent_pool_rules():
    state = (BufferSpec("s", (4,), torch.float32),)
    with pytest.raises(ValueError, match="tokens_per_row and window_tokens must be 1"):
        PoolSpec("c", PoolKind.STATE, 1, state, 2, window_tokens=2, recurrent=True)
    with pytest.raises(ValueError, match="only STATE pools hold a recurrent state"):
        PoolSpec("c", PoolKind.HISTORY, 1, state, 1, indices_from="kv", recurrent=True)
    anchor = PoolSpec("kv", PoolKind.ANCHOR, 0, (), 1)
    root = PoolSpec("c", PoolKind.STATE, 1, state, 1, window_tokens=1, recurrent=True)
    ring = PoolSpec("r", PoolKind.STATE, 1, state, 1, indices_from="c", window_tokens=1)
    with pytest.raises(ValueError, match="must be both recurrent or both windowed"):
        Stack((anchor, root, ring), page_size=4)


def test_geometry_rejects_bad_layers_and_a_cut_past_the_model():
    with pytest.raises(ValueError, match="layer_kinds"):
        HybridGeometry(("full", "conv"), 1, 8, 8, 4, (1, 2, 2))
    with pytest.raises(ValueError, match="conv_kernel"):
        HybridGeometry(("linear",), 1, 8, 8, 1, (1, 2, 2))
    with pytest.raises(ValueError, match="hold no cache"):
        linear_hybrid(HybridGeometry(("mlp",), 1, 8, 8, 4, (1, 2, 2)))
    with pytest.raises(ValueError, match="hybrid_override_pattern"):
        from_pattern("M-X")
    with pytest.raises(ValueError, match="num_layers: qwen3.5-27b has 64 layers"):
        preset("qwen3.5-27b", 65)


def test_state_interval_defaults_to_a_page_multiple_and_refuses_others():
    stack = preset("qwen3.5-35b-a3b")
    assert state_interval(stack, HiCacheConfig()) == -(-DEFAULT_STATE_INTERVAL // 64) * 64
    assert state_interval(stack, HiCacheConfig(state_interval=4096)) == 4096
    with pytest.raises(ValueError, match="--hicache-state-interval: must be a multiple of the page"):
        state_interval(stack, HiCacheConfig(state_interval=100))
    with pytest.raises(ValueError, match="--hicache-state-interval"):
        HiCacheConfig(state_interval=-1)


def test_device_holds_one_snapshot_per_interval_and_host_the_ratio():
    stack = preset("nemotron-h-8b", 8)
    cfg = HiCacheConfig(state_interval=1024, hicache_ratio=3.0)
    assert device_root_tokens(stack, 65536, cfg) == {"kv": 65536, "conv": 64}
    plan = plan_sizes(stack, 65536, cfg, HostBudget(1 << 50, None, 0, 1, 1 << 50))
    rows = {p.name: (p.device_rows, p.host_rows) for p in plan.pools}
    assert rows["conv"] == rows["recurrent"] == (64, 192) and rows["attn_kv"] == (1024, 3072)
    with pytest.raises(ValueError, match="--hicache-state-interval: 131,072 tokens is more than"):
        device_root_tokens(stack, 65536, HiCacheConfig(state_interval=131072))


def test_snapshot_bytes_and_kv_bytes_per_token():
    cfg = HiCacheConfig(host_dtype="int8")
    plan = plan_sizes(preset("qwen3.5-27b"), 1 << 20, cfg, HostBudget(1 << 60, None, 0, 1, 1 << 60))
    assert plan.kv_bytes_per_token() == 16 * 2 * 4 * 256 * 2  # 16 layers x k, v x 4 heads x 256 x bf16
    assert plan.kv_bytes_per_token(host=True) == 16 * 2 * 4 * (256 + 4)  # int8 + an fp32 scale per head
    per_layer = 3 * 10240 * 2 + 48 * 128 * 128 * 4  # conv (bf16) + recurrent (fp32)
    assert plan.snapshot_bytes() == plan.snapshot_bytes(host=True) == {"conv": 48 * per_layer}  # exact on the host
    assert plan.interval == 2048
