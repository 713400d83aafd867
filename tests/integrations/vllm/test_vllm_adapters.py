"""The spec, manager and worker against vLLM's real types (runs in the vLLM environment).

The core suite runs this file there through ``test_in_vllm_env.py``; in an environment
without vLLM it is skipped.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

vllm_base = pytest.importorskip("vllm.v1.kv_offload.base", reason="needs vLLM (runs in its env)")

from host_pools.memory import HostMemoryError  # noqa: E402
from hicache.integrations.vllm import manager as manager_module  # noqa: E402
from hicache.integrations.vllm.manager import HostChunksSpec  # noqa: E402
from tests.integrations.vllm import vllm_layouts as lay  # noqa: E402

LookupResult, make_key = vllm_base.LookupResult, vllm_base.make_offload_key
LAYERS, BLOCKS, PAGE, TPB = 3, 12, 256, 16
GROUPS = [lay.full([f"l{i}" for i in range(LAYERS)], block=TPB, head=4)]  # 16 x (4 + 4) x 2 B = 256


def make_spec(extra: dict, device_blocks: int | None = BLOCKS):
    return lay.make_spec(GROUPS, extra, device_blocks)


@pytest.mark.parametrize("extra, error, match", [
    ({"hicache_ratoi": 2.0}, ValueError, r"unknown key\(s\) \['hicache_ratoi'\]"),
    ({"hicache_ratio": 0.0}, ValueError, r"hicache_ratio \(--hicache-ratio\): must be > 0"),
    ({"io_backend": "nvlink"}, ValueError, r"io_backend \(--hicache-io-backend\)"),
    ({"hicache_size_gb": 1e9}, HostMemoryError, r"(?s)not enough host memory.*Lower hicache_ratio"),
])
def test_bad_config_is_refused_at_start_up_naming_the_key(extra, error, match):
    with pytest.raises(error, match=match):
        make_spec(extra)


def test_ratio_sizing_needs_the_hicache_connector():
    with pytest.raises(ValueError, match="HiCacheOffloadingConnector"):
        make_spec({"hicache_ratio": 2.0}, device_blocks=None)
    assert make_spec({"hicache_size_gb": 1e-5}, device_blocks=None).num_chunks == 13  # 1e4 B / 768 B
    assert GROUPS[0].page("l0") == PAGE


def test_vllm_033_additions_are_accepted():
    # sync_load_budget_bytes is vLLM's own key (0.33: loads waited on within the step)
    spec = make_spec({"hicache_ratio": 1.0, "sync_load_budget_bytes": 1 << 20,
                      "hicache_prefix_tokens": 512})
    assert spec.settings.prefix_tokens == 512
    mgr = spec.get_manager()
    assert type(spec).config_info_keys({}) == manager_module.INFO_KEYS
    (info,) = mgr.config_info()
    assert set(info) == set(manager_module.INFO_KEYS) and info["hicache_host_chunks"] == "12"
    assert info["hicache_host_bytes"] == 12 * LAYERS * PAGE
    with mgr.lock:  # 0.33's lock (a no-op: vLLM enters the manager from one thread)
        assert mgr.lookup(make_key(b"k" * 8, 0), vllm_base.ReqContext(req_id="r")) is LookupResult.MISS
    with pytest.raises(ValueError, match=r"hicache_prefix_tokens \(--hicache-prefix-tokens\)"):
        make_spec({"hicache_prefix_tokens": 0})


def test_manager_store_load_evict_through_vllm_types():
    spec = make_spec({"hicache_ratio": 0.25})  # 3 host chunks for 12 device blocks
    mgr = spec.get_manager()
    ctx = vllm_base.ReqContext(req_id="r")
    keys = [make_key(bytes([i]) * 8, 0) for i in range(5)]
    # 1. nothing stored yet; store three keys, which stay pending until completed
    assert mgr.lookup(keys[0], ctx) is LookupResult.MISS
    out = mgr.prepare_store(keys[:3], ctx)
    assert out.keys_to_store == keys[:3] and sorted(out.store_spec.block_ids) == [0, 1, 2]
    assert mgr.lookup(keys[0], ctx) is LookupResult.HIT_PENDING
    # 2. full of pending stores: vLLM gets None (not an exception)
    assert mgr.prepare_store(keys[3:4], ctx) is None
    mgr.complete_store(keys[:3], ctx)
    assert mgr.lookup(keys[2], ctx) is LookupResult.HIT
    # 3. load key 0 (pinned), then store two new keys: 1 and 2 are evicted, never 0
    load = mgr.prepare_load([keys[0]], ctx)
    assert isinstance(load, HostChunksSpec)
    out = mgr.prepare_store(keys[3:5], ctx)
    assert sorted(out.evicted_keys) == sorted(keys[1:3])
    mgr.complete_store(keys[3:5], ctx, success=False)  # a failed store frees its chunks
    mgr.complete_load([keys[0]], ctx)
    assert mgr.lookup(keys[3], ctx) is LookupResult.MISS
    mgr.index.check_integrity()
    events = list(mgr.take_events())
    assert [e.removed for e in events] == [False, True]
    stats = mgr.get_stats().data["data"]
    assert stats["hicache:stored_blocks"][()] == 3 and stats["hicache:loaded_blocks"][()] == 1
    assert stats["hicache:hit_tokens"][()] == TPB and stats["hicache:evicted_blocks"][()] == 2
    assert stats["hicache:host_blocks_used"][()] == 1  # key 0 only
    assert stats["hicache:host_bytes_per_token"][("0",)] == LAYERS * PAGE / TPB


def test_a_request_s_hints_reach_the_manager_through_vllm_s_request_context():
    spec = make_spec({"hicache_ratio": 0.5, "max_retained_ratio": 0.5})  # 6 chunks, 3 may be retained
    mgr = spec.get_manager()
    keys = [make_key(bytes([i]) * 8, 0) for i in range(9)]
    # 1. a request carries a retain in kv_transfer_params (as vLLM's OpenAI server passes it)
    ctx = vllm_base.ReqContext(req_id="a", kv_transfer_params={"hicache": {"retain_s": 600, "priority": 9}})
    mgr.on_new_request(ctx)
    mgr.complete_store(mgr.prepare_store(keys[:2], ctx).keys_to_store, ctx)
    (ticket,) = mgr.hints.report("a")
    assert (ticket["action"], ticket["state"], ticket["tokens"]) == ("retain", "accepted", 2 * TPB)
    mgr.on_request_finished(ctx)
    # 2. other requests store 6 more chunks: the retained ones stay
    for i in range(3):
        other = vllm_base.ReqContext(req_id=f"o{i}")
        mgr.on_new_request(other)
        mgr.complete_store(mgr.prepare_store(keys[2 + 2 * i:4 + 2 * i], other).keys_to_store, other)
    assert all(mgr.lookup(k, ctx) is LookupResult.HIT for k in keys[:2])
    # 3. a malformed envelope is one refusal in the report; the counters say so
    bad = vllm_base.ReqContext(req_id="bad", kv_transfer_params={"hicache": {"retian_s": 5}})
    mgr.on_new_request(bad)
    (refused,) = mgr.hints.report("bad")
    assert refused["state"] == "refused" and "unknown key 'retian_s'" in refused["reason"]
    totals = mgr.totals()
    assert totals["hicache:hints"] == 1 and totals["hicache:hints_refused"] == 1
    mgr.index.check_integrity()


@pytest.mark.parametrize("call", ["request_finished", "request_finished_all_groups"])
def test_the_connector_returns_a_request_s_tickets_in_its_kv_transfer_params(call):
    from types import SimpleNamespace

    from hicache.integrations.vllm.spec import HiCacheOffloadingConnector
    mgr = make_spec({"hicache_ratio": 0.5}).get_manager()
    ctx = vllm_base.ReqContext(req_id="a", kv_transfer_params={"hicache": {"retain_s": 60}})
    mgr.on_new_request(ctx)
    mgr.prepare_store([make_key(b"a" * 8, 0)], ctx)
    # the scheduler side alone (vLLM's connector would build it from a whole vLLM config)
    conn = HiCacheOffloadingConnector.__new__(HiCacheOffloadingConnector)
    conn.connector_scheduler = SimpleNamespace(manager=mgr, request_finished=lambda request: (False, None))
    delay, params = getattr(conn, call)(SimpleNamespace(request_id="a"), ([0],))
    assert delay is False and params["hicache"]["hints"][0]["state"] == "accepted"
    assert getattr(conn, call)(SimpleNamespace(request_id="other"), ([0],)) == (False, None)


@pytest.mark.parametrize("fenced", [True, False])
def test_reset_never_hands_out_a_chunk_a_late_store_still_writes(gen, fenced, monkeypatch):
    # vLLM defers a store's copy to the next step; a cache reset in between used to free its
    # chunk at once, so a new key got the chunk and the late copy overwrote the new bytes.
    # fenced: vLLM >= 0.33 calls on_reset_flushed(); unfenced (0.32): the first completion
    # after the reset (or the second step) releases the quarantine.
    monkeypatch.setattr(manager_module, "RESET_FENCED", fenced)
    spec = make_spec({"hicache_size_gb": 1e-6, "io_backend": "torch"})  # 1 chunk of 768 B
    assert spec.num_chunks == 1
    caches, layers = lay.canonical_caches(gen, GROUPS, BLOCKS)
    worker, mgr = spec.get_worker(caches), spec.get_manager()
    ctx = vllm_base.ReqContext(req_id="r")
    a, b = make_key(b"a" * 8, 0), make_key(b"b" * 8, 0)
    late = mgr.prepare_store([a], ctx)  # planned; its copy is still to be submitted
    mgr.reset_cache()
    assert mgr.prepare_store([b], ctx) is None  # the only chunk is A's, still in flight
    assert worker.submit_store(1, vllm_base.GPULoadStoreSpec([3], [1], [0]), late.store_spec)
    if fenced:
        mgr.on_reset_flushed()
    else:
        mgr.on_schedule_end(None)
        assert mgr.prepare_store([b], ctx) is None  # one step is not proof yet
        mgr.on_schedule_end(None)
    out = mgr.prepare_store([b], ctx)
    assert out.store_spec.block_ids.tolist() == late.store_spec.block_ids.tolist()
    expect = {n: t[5, :PAGE].clone() for n, t in layers.items()}
    assert worker.submit_store(2, vllm_base.GPULoadStoreSpec([5], [1], [0]), out.store_spec)
    mgr.complete_store([b], ctx)
    load = mgr.prepare_load([b], ctx)
    assert worker.submit_load(3, load, vllm_base.GPULoadStoreSpec([9], [1], [0]))
    assert all(torch.equal(t[9, :PAGE], expect[n]) for n, t in layers.items())
    assert [r.success for r in worker.get_finished()] == [True, True, True]


def test_a_store_completed_from_before_a_reset_does_not_publish_the_new_one():
    # issue 23, item 8: vLLM 0.32/0.33 drop such completions; the manager ignores them anyway
    mgr = make_spec({"hicache_ratio": 1.0}).get_manager()
    old, new = vllm_base.ReqContext(req_id="old"), vllm_base.ReqContext(req_id="new")
    key = make_key(b"k" * 8, 0)
    assert mgr.prepare_store([key], old).keys_to_store == [key]
    mgr.reset_cache()
    assert mgr.prepare_store([key], new).keys_to_store == [key]  # stored again, its copy pending
    mgr.complete_store([key], old)  # the job in flight at the reset reports
    assert mgr.lookup(key, new) is LookupResult.HIT_PENDING
    mgr.complete_store([key], new)
    assert mgr.lookup(key, new) is LookupResult.HIT
    mgr.index.check_integrity()


def test_worker_round_trip_on_canonical_cpu_tensors(gen):
    spec = make_spec({"hicache_ratio": 1.0, "io_backend": "copy_engine"})
    assert spec.layout.chunks == [BLOCKS]
    base = torch.randint(-128, 128, (LAYERS, BLOCKS, PAGE + 64), generator=gen, dtype=torch.int8)
    tensors = [vllm_base.CanonicalKVCacheTensor(base[i], PAGE + 64) for i in range(LAYERS)]
    refs = [[vllm_base.CanonicalKVCacheRef(i, PAGE) for i in range(LAYERS)]]  # padding not copied
    worker = spec.get_worker(vllm_base.CanonicalKVCaches(tensors, refs))
    ref = base.clone()
    src = vllm_base.GPULoadStoreSpec([4, 7, 1], group_sizes=[3], block_indices=[0])
    assert worker.submit_store(1, src, HostChunksSpec([10, 0, 5]))
    base[:, :, :PAGE].random_(-128, 127, generator=gen)
    after = base.clone()
    dst = vllm_base.GPULoadStoreSpec([0, 2, 3], group_sizes=[3], block_indices=[0])
    assert worker.submit_load(2, HostChunksSpec([10, 0, 5]), dst, expedited=True)  # 0.33's flag
    results = worker.get_finished()
    assert [(r.job_id, r.success, r.transfer_size) for r in results] == \
        [(1, True, 3 * LAYERS * PAGE), (2, True, 3 * LAYERS * PAGE)]
    for d, s in zip([0, 2, 3], [4, 7, 1]):
        assert torch.equal(base[:, d, :PAGE], ref[:, s, :PAGE])
    untouched = [b for b in range(BLOCKS) if b not in (0, 2, 3)]
    assert torch.equal(base[:, untouched], after[:, untouched])
    assert torch.equal(base[:, :, PAGE:], ref[:, :, PAGE:])  # padding bytes never written
    # a bad chunk id fails its job instead of raising into vLLM
    assert worker.submit_load(3, HostChunksSpec([99]), vllm_base.GPULoadStoreSpec([5], [1], [0]))
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(3, False)]
    with pytest.raises(TypeError, match="dst_spec: must be a HostChunksSpec"):
        worker.submit_store(4, src, vllm_base.GPULoadStoreSpec([1], [1], [0]))
    worker.shutdown()
    assert np.isclose(worker.mover.stats()["h2d"]["bytes"]["kv"], 3 * LAYERS * PAGE)
