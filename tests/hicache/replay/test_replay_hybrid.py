"""`hicache replay` with linear-attention hybrids: the snapshot rule, its bounds, and a
slice of the shipped trace through device, host and storage with every byte checked."""
from __future__ import annotations

import json
import lzma
from pathlib import Path

import numpy as np
import pytest
import torch

from hicache import HiCacheConfig, build
from hicache.cli import main
from hicache.models import HybridGeometry, linear_hybrid, preset
from hicache.replay.bounds import TraceBounds, block_ids, snapshot_hits
from hicache.replay.run import Replayer
from hicache.replay.snapshots import SnapshotRule
from hicache.replay.workload import BLOCK_TOKENS, Request, load_trace
from host_pools.memory import HostBudget

TRACE = Path(__file__).resolve().parents[3] / "data" / "mooncake_synthetic_trace.jsonl.xz"
BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)
# a tiny hybrid (3 linear layers, 1 full-attention layer): the presets' pools at a few KiB per snapshot
TINY = HybridGeometry(("linear", "linear", "linear", "full"), 1, 16, 32, 4, (2, 8, 8))


def shipped_slice(tmp_path: Path, first: int = 3940, count: int = 24, cap: int = 2048) -> Path:
    """Lines of the shipped trace whose sessions reuse each other's prefixes, each prompt cut
    to ``cap`` tokens (its hash_ids too), so the prefixes they share stay shared."""
    out = []
    for line in lzma.decompress(TRACE.read_bytes()).decode().splitlines()[first:first + count]:
        rec = json.loads(line)
        rec["input_length"] = min(rec["input_length"], cap)
        rec["hash_ids"] = rec["hash_ids"][:-(-rec["input_length"] // BLOCK_TOKENS)]
        out.append(json.dumps(rec))
    path = tmp_path / "slice.jsonl"
    path.write_text("\n".join(out) + "\n")
    return path


def test_recurrent_rule_saves_every_interval_past_the_hit_and_the_prompt_end():
    rule = SnapshotRule.of(preset("qwen3.5-27b", 4), HiCacheConfig(state_interval=1024))
    assert rule == SnapshotRule(1024, True)
    assert rule.boundaries(0, 3000 // 64 * 64) == [1024, 2048, 2944]
    assert rule.boundaries(1024, 3072) == [2048, 3072]  # a boundary at the end is saved once
    assert rule.boundaries(2048, 2048) == []  # nothing computed, nothing saved
    assert SnapshotRule.of(preset("qwen3.5-27b", 4), HiCacheConfig()).interval == 2048  # the default


def test_deepseek_v4_keeps_its_last_block_rule_unless_an_interval_is_given():
    rule = SnapshotRule.of(preset("deepseek-v4-flash", 4), HiCacheConfig())
    assert rule == SnapshotRule(BLOCK_TOKENS, False)
    assert rule.boundaries(0, 1536) == [1536] and rule.boundaries(0, 1280) == [1024, 1280]
    assert rule.boundaries(1024, 1280) == [1280]  # the block boundary is not past the hit
    assert SnapshotRule.of(preset("deepseek-v4-flash", 4), HiCacheConfig(state_interval=512)).every
    assert SnapshotRule.of(preset("deepseek-v3", 2), HiCacheConfig()) is None


def _brute(pages: list[list[int]], rule: SnapshotRule, page: int, capacity: int | None) -> int:
    """The rule's hits with an LRU list rebuilt from scratch per request (no shortcuts)."""
    recent: list[int] = []  # most recent first
    saved: set[int] = set()
    hits = 0
    for ids in pages:
        run = 0
        while run < len(ids) and ids[run] in recent:
            run += 1
        best = max([k for k in range(run + 1) if k == 0 or ids[k - 1] in saved])
        hits += best
        saved |= {ids[b // page - 1] for b in rule.boundaries(best * page, len(ids) * page)}
        recent = list(ids) + [k for k in recent if k not in ids]
        if capacity is not None:
            saved -= set(recent[capacity:])
            recent = recent[:capacity]
    return hits


@pytest.mark.parametrize("seed", range(4))
def test_snapshot_bounds_match_a_brute_force_and_cap_the_plain_ones(seed):
    rng = np.random.default_rng(seed)
    reqs = []
    for _ in range(30):  # few distinct blocks: prefixes shared at every depth
        blocks = int(rng.integers(1, 7))
        reqs.append(Request(0, blocks * BLOCK_TOKENS, 1, tuple(int(x) for x in rng.integers(0, 3, size=blocks))))
    page, rule = 256, SnapshotRule(512, True)
    pages = block_ids(reqs, page)
    keys = [p.tolist() for p in pages]
    for capacity in (None, 3, 8):
        assert snapshot_hits(pages, rule, page, capacity)[0] == _brute(keys, rule, page, capacity)
    b = TraceBounds(reqs, page, rule).at(8 * page)
    assert b.infinite_snapshots <= b.infinite and b.lru_snapshots <= b.lru
    assert TraceBounds(reqs, page).at(8 * page).lru_snapshots is None


@pytest.mark.parametrize("host_dtype", ["auto", "int8"])
def test_tiny_hybrid_replays_exact_bytes_with_snapshots_on_every_tier(tmp_path, host_dtype):
    stack = linear_hybrid(TINY, "tiny-hybrid")
    requests = load_trace(str(shipped_slice(tmp_path)))
    cfg = HiCacheConfig(hicache_ratio=2.0, io_backend="torch", state_interval=512, host_dtype=host_dtype)
    cache = build(stack, 8192, cfg, device="cpu", budget=BIG)
    try:
        host = {name: pool.spec for name, pool in cache.host_group.pools.items()}
        replayer = Replayer(cache, 2.0)
        st = replayer.run(requests)
        replayer.close()
    finally:
        cache.close()
    # int8 quantizes the full-attention KV alone; the state pools stay the device's bytes
    assert (host["attn_kv"].buffers[0].dtype == torch.int8) == (host_dtype == "int8")
    assert host["conv"] == stack.pool("conv") and host["recurrent"] == stack.pool("recurrent")
    assert st.mismatches == 0 and st.host_hit_tokens > 0 and st.snapshots > len(requests)
    assert st.state_interval == 512 and st.snapshot_bytes == 3 * (3 * 32 * 2 + 2 * 8 * 8 * 4)
    assert 0 < st.bytes_d2h_state < st.bytes_d2h  # snapshots went to the host beside the KV pages
    bounds = TraceBounds(requests, 64, SnapshotRule(512, True)).at(st.capacity_tokens)
    hit = (st.device_hit_tokens + st.host_hit_tokens) / st.tokens_total
    assert hit <= bounds.infinite_snapshots + 1e-9  # no cache obeying the rule beats it


def test_preset_replay_through_host_and_storage_cli(tmp_path, capsys):
    trace = shipped_slice(tmp_path, count=16, cap=1024)
    argv = ["replay", "--trace", str(trace), "--model", "qwen3.5-35b-a3b", "--layers", "1", "--device-tokens",
            "4096", "--hicache-ratio", "2", "--hicache-state-interval", "512", "--hicache-storage-backend", "file",
            "--hicache-storage-dir", str(tmp_path / "store"), "--hicache-storage-capacity", "0.5",
            "--hicache-host-headroom", "0", "--json", "--no-progress"]  # tens of MB: no headroom to keep
    assert main(argv) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["mismatches"] for r in runs] == [0, 0]
    hier = runs[1]
    assert hier["storage_hit_rate"] + hier["host_hit_rate"] > 0 and hier["snapshots"] > 0
    assert hier["state_interval"] == 512 and hier["bound_infinite_snapshots"] <= hier["bound_infinite"]
    assert hier["hit_rate"] <= hier["bound_infinite_snapshots"] + 1e-9
    # the hybrid's TTFT estimated on the default profile (its shape: hicache.models.linear_hybrid.hybrid_shape)
    assert hier["device_profile"] == "h100" and 0 < hier["ttft_p50_s"] <= hier["ttft_nocache_p99_s"]
