"""``--hicache-host-dtype int8``: which pools become int8, sizing, and the controller's
round trips (byte-exact against `quant_ref`), rollback, and the default path unchanged."""
from __future__ import annotations

import logging

import pytest
import torch

from hicache import HiCacheConfig, build
from hicache.host_dtype import codec_of, int8_codec, resolve_host_stack
from hicache.models import deepseek_v4, dsa, mha, mla, preset
from hicache.sizing import plan_sizes
from host_pools.host_format import host_spec, host_stack, int8_refusal
from host_pools.memory import HostBudget
from host_pools.spec import BufferSpec, PoolKind, PoolSpec, Stack
from transfer_kernels import FaultyBackend
from transfer_kernels.quant.reference import dequantize_int8_ref, quantize_int8_ref

BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)


def _cache(stack, backend="torch", host_dtype="int8", pages=4, **kw):
    config = HiCacheConfig(host_dtype=host_dtype, io_backend="torch", hicache_ratio=2.0, **{"mem_layout": "page_first", **kw})
    return build(stack, pages * stack.page_size, config, device="cpu", budget=BIG, backend=backend)


def _fill(cache, gen):
    for pool in cache.device_pools.values():
        for layer in pool.tensors:
            for t in layer:
                t.copy_((torch.randn(t.shape, generator=gen) * 2).to(t.dtype))


def test_host_spec_int8_layout():
    dev = mha(2, 4, 64, page_size=16).anchor
    host = host_spec(dev, "int8")
    assert [(b.role, b.row_shape, b.dtype) for b in host.buffers] == [
        ("k", (16, 4, 64), torch.int8), ("k_scale", (16, 4), torch.float32),
        ("v", (16, 4, 64), torch.int8), ("v_scale", (16, 4), torch.float32)]
    assert host.row_bytes == 2 * (16 * 4 * 64 + 4 * 16 * 4)
    assert (host.name, host.kind, host.tokens_per_row, host.layer_ids) == (dev.name, dev.kind, 16, dev.layer_ids)
    assert host_spec(dev, "auto") is dev
    with pytest.raises(ValueError, match="host_dtype"):
        host_spec(dev, "fp8")


@pytest.mark.parametrize("stack", [lambda: deepseek_v4([4, 128, 0, 4]), lambda: dsa(2, page_size=4),
                                   lambda: mha(2, 2, 16, kv_quant="fp8", page_size=4),
                                   lambda: mha(2, 2, 16, kv_quant="int8", page_size=4)])
def test_int8_refused_where_nothing_can_be_quantized(stack):
    with pytest.raises(ValueError, match=r"host_dtype \(--hicache-host-dtype\): int8 has nothing to quantize"):
        resolve_host_stack(stack(), HiCacheConfig(host_dtype="int8"))
    with pytest.raises(ValueError, match="--hicache-host-dtype"):
        HiCacheConfig(host_dtype="fp8")


def test_state_and_indexer_pools_stay_exact_and_are_logged(caplog, gen):
    t = 4
    kv = PoolSpec("kv", PoolKind.ANCHOR, 2, (BufferSpec("kv", (t, 64), torch.bfloat16),), t)
    idx = PoolSpec("idx", PoolKind.HISTORY, 2, (BufferSpec("indexer", (t, 32), torch.bfloat16),), t,
                   indices_from="kv")
    swa = PoolSpec("swa", PoolKind.STATE, 2, (BufferSpec("swa", (t, 64), torch.bfloat16),), t, window_tokens=t)
    stack = Stack((kv, idx, swa), page_size=t)
    assert int8_refusal(kv) is None and "indexer" in int8_refusal(idx) and "state" in int8_refusal(swa)
    host = host_stack(stack, "int8")
    assert host.pool("idx") == idx and host.pool("swa") == swa and host.pool("kv") != kv
    with caplog.at_level(logging.INFO, logger="hicache"):
        cache = _cache(stack, swa_full_tokens_ratio=0.5)
    assert "kv: int8" in caplog.text and "idx: exact" in caplog.text and "swa: exact" in caplog.text
    assert cache.host_group.pools["swa"].spec == swa
    cache.close()


def test_sizing_counts_int8_bytes():
    stack = preset("llama-3.1-8b")
    bf16 = plan_sizes(stack, 1 << 16, HiCacheConfig(hicache_ratio=2.0), BIG)
    int8 = plan_sizes(stack, 1 << 16, HiCacheConfig(hicache_ratio=2.0, host_dtype="int8"), BIG)
    # a ratio keeps its meaning (host tokens per device token) at fewer bytes
    assert int8.host_rows() == bf16.host_rows()
    assert int8.pools[0].host_row_bytes == 2 * (64 * 8 * 128 + 4 * 64 * 8)
    assert 1.93 < bf16.host_bytes_total / int8.host_bytes_total < 1.94
    assert int8.pools[0].device_bytes == bf16.pools[0].device_bytes
    # a size holds ~1.9x the tokens
    b = plan_sizes(stack, 1 << 16, HiCacheConfig(hicache_size_gb=10.0), BIG)
    i = plan_sizes(stack, 1 << 16, HiCacheConfig(hicache_size_gb=10.0, host_dtype="int8"), BIG)
    assert 1.93 < i.pools[0].host_rows / b.pools[0].host_rows < 1.94
    assert i.host_bytes_total <= 10e9 and b.host_bytes_total <= 10e9


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("backend", ["torch", "triton", "auto", "copy_engine", "dma"])
@pytest.mark.parametrize("stack", [lambda: mha(2, 2, 16, page_size=4), lambda: mla(2, 128, 64, page_size=4),
                                   lambda: mha(1, 1, 32, dtype=torch.float16, page_size=2)])
def test_round_trip_through_the_controller_matches_ref(backend, stack, layout, gen):
    cache = _cache(stack(), backend=backend, mem_layout=layout)
    _fill(cache, gen)
    ctrl, dev = cache.controller, cache.device_pools["kv"]
    spec, t = dev.spec, dev.spec.tokens_per_row
    slots = dev.alloc(2 * t)
    host = ctrl.write(slots)
    ctrl.start_writing()
    assert [a.success for a in ctrl.poll()] == [True]
    hpool = cache.host_group.pools["kv"]
    d_rows, h_rows = slots[::t] // t, host["kv"][::t] // t
    back = ctrl.load(host["kv"])
    ctrl.start_loading()
    assert [a.success for a in ctrl.poll()] == [True]
    b_rows = back["kv"][::t] // t
    for layer in range(spec.num_layers):
        for b, buf in enumerate(spec.buffers):
            q, s = quantize_int8_ref(dev.tensors[layer][b][d_rows])
            assert torch.equal(hpool.read_rows(h_rows, layer, buf.role).view(q.shape).view(torch.uint8),
                               q.view(torch.uint8))
            got_s = hpool.read_rows(h_rows, layer, f"{buf.role}_scale").view(torch.float32).view(s.shape)
            assert torch.equal(got_s.view(torch.int32), s.view(torch.int32))
            want = dequantize_int8_ref(q, s, buf.dtype)
            assert torch.equal(dev.tensors[layer][b][b_rows].view(torch.uint8), want.view(torch.uint8))
    ctrl.check_integrity()
    cache.close()


def test_load_rolls_back_when_a_later_launch_group_fails(gen):
    """Layer 0's group dequantizes, layer 1's raises: nothing published, slots freed."""
    cache = _cache(mha(2, 2, 16, page_size=4), backend=FaultyBackend("torch", fail_on_launch=10 ** 9))
    _fill(cache, gen)
    ctrl, dev = cache.controller, cache.device_pools["kv"]
    host = ctrl.write(dev.alloc(8))
    ctrl.start_writing()
    assert [a.success for a in ctrl.poll()] == [True]
    ctrl.load_groups.min_bytes = 0  # one launch group per layer
    ctrl.backend.fail_on_launch = ctrl.backend.attempts + 2
    free_before = dev.available()
    assert ctrl.load(host["kv"]) is not None
    assert ctrl.start_loading() is None
    acks = ctrl.poll()
    assert [a.success for a in acks] == [False] and "injected" in acks[0].error
    assert dev.available() == free_before and ctrl.pending() == 0
    ctrl.check_integrity()
    cache.close()


@pytest.mark.parametrize("inner", ["torch", "triton"])
def test_failed_backup_frees_its_host_pages_and_publishes_nothing(inner, gen):
    cache = _cache(mha(2, 2, 16, page_size=4), backend=FaultyBackend(inner, fail_on_launch=1))
    _fill(cache, gen)
    ctrl, host = cache.controller, cache.host_group.pools["kv"]
    free_before = host.available()
    slots = cache.device_pools["kv"].alloc(8)
    got = ctrl.write(slots)
    assert got is not None and host.available() == free_before - 8
    ctrl.start_writing()
    acks = ctrl.poll()
    assert [a.success for a in acks] == [False] and host.available() == free_before
    with pytest.raises(ValueError, match="not allocated"):
        ctrl.load(got["kv"])  # never published: not loadable
    ctrl.check_integrity()
    cache.close()


def test_default_host_dtype_keeps_device_bytes(gen):
    stack = mha(2, 2, 16, page_size=4)
    cache = _cache(stack, host_dtype="auto")
    assert cache.host_group.pools["kv"].spec == stack.anchor
    assert cache.controller._planners["d2h"].tables["kv"][1].codec is None  # (device, host)
    _fill(cache, gen)
    dev = cache.device_pools["kv"]
    slots = dev.alloc(4)
    host = cache.controller.write(slots)
    cache.controller.start_writing()
    assert cache.controller.poll()[0].success
    got = cache.host_group.pools["kv"].read_rows(host["kv"][::4] // 4, 1, "v")
    assert torch.equal(got, dev.row_views()[1][1][slots[::4] // 4])
    cache.close()


def test_codecs_for_the_vllm_mover():
    spec = mla(2, 512, 64, page_size=16).anchor
    codec = int8_codec(spec)
    assert codec.elems == (16 * 576,) and codec.vecs == (576,) and codec.dtype == torch.bfloat16
    assert codec.host_row_bytes == tuple(b.row_bytes for b in host_spec(spec, "int8").buffers) == (16 * 576, 64)
    assert int8_codec(mha(1, 1, 16, kv_quant="fp8").anchor) is None
    assert codec_of(spec, spec) is None


def test_plan_cli_counts_int8_bytes_and_refuses_in_one_line(capsys):
    import json

    from hicache.cli import main
    argv = ["plan", "--model", "llama-3.1-8b", "--device-tokens", "65536", "--json"]
    main(argv)
    bf16 = json.loads(capsys.readouterr().out)
    main(argv + ["--hicache-host-dtype", "int8"])
    int8 = json.loads(capsys.readouterr().out)
    assert int8["pools"][0]["host_row_bytes"] == 135168 and bf16["pools"][0]["host_row_bytes"] == 262144
    assert int8["pools"][0]["host_rows"] == bf16["pools"][0]["host_rows"]
    main(argv[:-1] + ["--hicache-host-dtype", "int8"])
    assert "host B/layer" in capsys.readouterr().out
    assert main(["plan", "--model", "deepseek-v4-flash", "--hicache-host-dtype", "int8"]) == 2
    err = capsys.readouterr().err
    assert "--hicache-host-dtype" in err and "Traceback" not in err and err.count("\n") == 1
