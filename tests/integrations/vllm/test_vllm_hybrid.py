"""Hybrid KV cache groups through the spec, manager and worker, from vLLM's own spec classes.

Layouts: full attention + sliding window (Gemma-style) and DeepSeek-V4's 5 groups (two
sliding-window groups, compressed KV C4 + C128 + indexer, two compressor-state groups).
A windowed group keeps only the trailing window of each request, sized per group; every
round trip is compared byte for byte on random data, blocks not named stay unchanged.
Runs in the vLLM environments (through ``test_in_vllm_env.py``).
"""
from __future__ import annotations

import pytest
import torch

vllm_base = pytest.importorskip("vllm.v1.kv_offload.base", reason="needs vLLM (runs in its env)")

from hicache.integrations.vllm.spec import group_windows  # noqa: E402
from tests.integrations.vllm import vllm_layouts as lay  # noqa: E402

GEMMA = [lay.full(["full0", "full1"]), lay.sliding(["swa0", "swa1", "swa2"], window_tokens=64)]


def snapshot(layers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in layers.items()}


def check_loaded(groups, layers, before, keys, stored_blocks, targets):
    """Target blocks hold the stored blocks' bytes (page only); every other block and the
    padding are as ``before``."""
    for g, group in enumerate(groups):
        for name in group.layers:
            t, ref, page = layers[name], before[name], group.page(name)
            for tgt, src in zip(targets[g], stored_blocks[g]):
                assert torch.equal(t[tgt, :page], src[name]), (g, name, tgt)
            others = [b for b in range(t.shape[0]) if b not in targets[g]]
            assert torch.equal(t[others], ref[others]), (g, name)
            assert torch.equal(t[:, page:], ref[:, page:]), (g, name)


@pytest.mark.parametrize("groups", [GEMMA, lay.deepseek_v4()], ids=["gemma", "deepseek_v4"])
def test_windows_come_from_vllm(groups):
    """0.33 puts the window on each group; on 0.32 it is derived from the KV cache specs
    with vLLM's own rule (DeepSeek-V4: 2, 2, full, 2, 16 chunks)."""
    spec = lay.make_spec(groups, {"hicache_ratio": 1.0}, num_blocks=64)
    kv = lay.kv_cache_config(groups, 64)
    expect = [g.window for g in groups]
    assert group_windows(spec.config, 1, kv) == expect
    assert [g.window for g in spec.layout.groups] == expect
    if not lay.HAS_WINDOW_FIELD:  # vLLM's plain connector on 0.32: every group kept whole
        assert group_windows(spec.config, 1, None) == [None] * len(groups)


def test_full_plus_sliding_window_keeps_the_trailing_window_and_round_trips(gen):
    spec = lay.make_spec(GEMMA, {"hicache_ratio": 1.0, "io_backend": "torch",
                                 "hicache_prefix_tokens": 256}, num_blocks=64)
    # 64 full chunks of 16 tokens = 1024 tokens = 4 prefixes of 256: 4 x (4 + 1) = 20 SWA chunks
    assert spec.layout.chunks == [64, 20]
    full_bpt, swa_bpt = spec.layout.bytes_per_token()
    assert swa_bpt == 20 * 16 * 3 * GEMMA[1].page("swa0") / 16 / 1024
    caches, layers = lay.canonical_caches(gen, GEMMA, 64)
    worker = spec.get_worker(caches)
    assert worker.mover.group_host_bytes() == [g.host_bytes for g in spec.layout.groups]
    sched, ctx = lay.Scheduler(spec, GEMMA), vllm_base.ReqContext(req_id="conv0")
    # a 12-chunk prompt: vLLM offers all 12 chunks of both groups
    keys = sched.keys("conv0", ctx, [0, 0], [12, 12])
    blocks = [list(range(12)), list(range(12, 24))]
    stored = sched.store(worker, ctx, keys, blocks)
    assert stored == set(keys[0]) | set(keys[1][-5:])  # window 4 (+1) of the sliding group
    saved = [[{n: layers[n][b, :g.page(n)].clone() for n in g.layers} for b in bs[-len(want):]]
             for g, bs, want in zip(GEMMA, blocks, (keys[0], keys[1][-5:]))]
    for t in layers.values():  # the device cache moves on: fresh random bytes everywhere
        t.copy_(torch.randint(-128, 128, t.shape, generator=gen, dtype=torch.int8))
    before = snapshot(layers)
    targets = [list(range(40, 52)), [60, 61, 62, 63, 59]]
    sched.load(worker, ctx, [keys[0], keys[1][-5:]], targets, expedited=True)
    check_loaded(GEMMA, layers, before, keys, saved, targets)
    # the request goes on: chunks 12..14; the old window's first three chunks are demoted
    more = sched.keys("conv0", ctx, [12, 12], [3, 3])
    stored = sched.store(worker, ctx, more, [[24, 25, 26], [27, 28, 29]])
    assert stored == set(more[0]) | set(more[1])
    assert sched.mgr.index.counters["demoted"] == 3
    stats = sched.mgr.get_stats().data["data"]
    # issue 23, item 5: the 192-token prefix counts once (not 192 + 5 x 16 sliding-window
    # tokens); each group's chunks are counted on their own
    assert stats["hicache:hit_tokens"][()] == 12 * 16
    assert stats["hicache:group_loaded_chunks"] == {("0",): 12, ("1",): 5}
    assert stats["hicache:group_chunks_used"][("1",)] == 8
    assert stats["hicache:host_bytes_per_token"][("1",)] == pytest.approx(swa_bpt)
    assert stats["hicache:host_bytes_per_token"][("0",)] == pytest.approx(full_bpt)
    sched.mgr.index.check_integrity()
    sched.mgr.on_request_finished(ctx)
    assert len(sched.mgr.windows) == 0


def test_deepseek_v4_five_groups_round_trip_compactly(gen):
    groups = lay.deepseek_v4()
    spec = lay.make_spec(groups, {"hicache_ratio": 1.0, "io_backend": "torch",
                                  "hicache_prefix_tokens": 1024}, num_blocks=160)
    layout = spec.layout
    # 160 chunks of the 256-token compressed group = 40 prefixes of 1024 tokens
    assert layout.chunks == [120, 120, 160, 120, 680]
    per_token, every = layout.bytes_per_token(), [g.every_block_bytes_per_token for g in layout.groups]
    assert per_token[2] == every[2]  # the full group keeps every chunk
    assert all(p < e for p, e in zip(per_token[:2] + per_token[3:], every[:2] + every[3:]))
    caches, layers = lay.canonical_caches(gen, groups, 160, pad=0)
    worker = spec.get_worker(caches)
    assert [len(parts) for parts in worker.mover.parts] == [1, 1, 3, 1, 1]  # C4, C128, indexer
    assert worker.mover.group_host_bytes() == [g.host_bytes for g in layout.groups]
    sched, ctx = lay.Scheduler(spec, groups), vllm_base.ReqContext(req_id="dsv4")
    # a 512-token prompt: 8 SWA chunks (64), 2 compressed (256), 128 C4-state (4), 64 C128 (8)
    counts = [8, 8, 2, 128, 64]
    keys = sched.keys("dsv4", ctx, [0] * 5, counts)
    blocks = [list(range(n)) for n in counts]  # each layer has its own tensor
    stored = sched.store(worker, ctx, keys, blocks)
    keep = [3, 3, 2, 3, 17]  # window + 1, the compressed group whole
    assert stored == {k for ks, n in zip(keys, keep) for k in ks[-n:]}
    saved = [[{n: layers[n][b, :g.page(n)].clone() for n in g.layers} for b in bs[-n:]]
             for g, bs, n in zip(groups, blocks, keep)]
    for t in layers.values():
        t.copy_(torch.randint(-128, 128, t.shape, generator=gen, dtype=torch.int8))
    before = snapshot(layers)
    targets = [[150, 151, 152], [153, 154, 155], [156, 157], [140, 141, 142],
               list(range(100, 117))]
    sched.load(worker, ctx, [ks[-n:] for ks, n in zip(keys, keep)], targets)
    check_loaded(groups, layers, before, keys, saved, targets)
    stats = sched.mgr.get_stats().data["data"]
    assert [stats["hicache:group_chunks_used"][(str(g),)] for g in range(5)] == keep


def test_deepseek_v4_flash_host_bytes_per_token():
    """The layout at DeepSeek-V4 Flash's layer counts (one rank, per-layer views): with
    2048-token prefixes the host keeps 12.6 KiB per cached token, against 318 KiB if every
    block of every group were stored (the compressor states dominate that)."""
    spec = lay.make_spec(lay.deepseek_v4(lay.FLASH_LAYERS), {"hicache_ratio": 1.0,
                                                             "hicache_prefix_tokens": 2048}, num_blocks=16)
    per_token = spec.layout.bytes_per_token()
    every = [g.every_block_bytes_per_token for g in spec.layout.groups]
    assert per_token == pytest.approx([1204.5, 1149.75, 3850.25, 1260.0, 5440.0])
    assert every == pytest.approx([12848.0, 12264.0, 3850.25, 215040.0, 81920.0])
    assert sum(every) / sum(per_token) > 25
