"""Narrated controller scenarios: round trips byte-exact, merging, shortfalls, rollback."""
from __future__ import annotations

import pytest
import torch

from hicache import HiCacheConfig, build
from hicache.controller.batch import Op
from hicache.models import deepseek_v4, dsa, mha, mla
from host_pools.memory import HostBudget
from tests.hicache.controller.oracles import plan_jobs
from tests.hicache.controller.rollback import arm_later_group, landed_before
from transfer_kernels import FaultyBackend

BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)

STACKS = {
    "dsv4": lambda: deepseek_v4([4, 128, 0, 4]),
    "mha_int8": lambda: mha(2, 2, 16, kv_quant="int8", page_size=4),
    "mha_fp8": lambda: mha(2, 2, 16, kv_quant="fp8", page_size=4),
    "mla": lambda: mla(2, kv_lora_rank=128, rope_dim=64, page_size=4),
    "dsa": lambda: dsa(2, kv_lora_rank=128, rope_dim=64, page_size=4),
}


def make(stack_name: str, layout: str = "page_first", backend="copy_engine", ratio: float = 2.0,
         device_pages: int = 8, device: str = "cpu"):
    stack = STACKS[stack_name]()
    config = HiCacheConfig(mem_layout=layout, io_backend="torch", hicache_ratio=ratio, swa_full_tokens_ratio=0.5)
    return build(stack, device_pages * stack.page_size, config, device=device, budget=BIG, backend=backend)


def fill_random(cache, gen) -> None:
    for pool in cache.device_pools.values():
        for views in pool.row_views():
            for v in views:
                v.copy_(torch.randint(0, 256, v.shape, dtype=torch.uint8, generator=gen).to(v.device))


def snapshot(cache, own_slots) -> dict:
    """Bytes of the rows behind ``own_slots`` in every data pool, per layer and buffer."""
    rows = cache.stack.derive_rows(own_slots)
    return {name: [[v.index_select(0, r.to(v.device)).clone() for v in views]
                   for views in cache.device_pools[name].row_views()] for name, r in rows.items()}


def alloc_device(cache, pages: int = 2, swa_rows: int = 1) -> tuple[torch.Tensor, dict]:
    kv = cache.device_pools[cache.stack.anchor.name].alloc(pages * cache.stack.page_size)
    extra = {}
    if "swa" in cache.device_pools:
        extra["swa"] = cache.device_pools["swa"].alloc(swa_rows * 128)
    return kv, extra


def allocator_state(cache) -> dict:
    state = {f"dev:{n}": p.available() for n, p in cache.device_pools.items() if p.allocator}
    state.update({f"host:{n}": p.available() for n, p in cache.host_group.pools.items() if p.allocator})
    return state


def backup(cache, kv, extra):
    host = cache.controller.write(kv, extra)
    cache.controller.start_writing()
    if cache.controller.write_stream is not None:
        torch.cuda.synchronize()
    acks = cache.controller.poll()
    assert [a.success for a in acks] == [True]
    return host


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("stack_name", list(STACKS))
@pytest.mark.parametrize("backend", ["copy_engine", "torch"])
def test_round_trip_is_byte_exact(stack_name, layout, backend, gen):
    cache = make(stack_name, layout, backend)
    ctrl = cache.controller
    # 1. random bytes everywhere on the device, then back up two pages (+ one SWA row)
    fill_random(cache, gen)
    kv, extra = alloc_device(cache)
    expected = snapshot(cache, {"kv": kv, **extra})
    host = backup(cache, kv, extra)
    host_before = [p.buffer.clone() for p in cache.host_group.pools.values() if p.buffer is not None]
    # 2. the device is overwritten (the pages were evicted and their slots reused)
    fill_random(cache, gen)
    # 3. load into fresh device slots: every data pool, state pools included, comes back
    dev = ctrl.load(host["kv"], {k: host[k] for k in extra})
    untouched = snapshot(cache, {"kv": kv, **extra})
    consumer = ctrl.start_loading()
    assert consumer >= 0
    acks = ctrl.poll()
    assert [(a.direction, a.success) for a in acks] == [("h2d", True)]
    assert _equal(snapshot(cache, dev), expected)
    # 4. rows outside the load and the host side are unchanged
    assert _equal(snapshot(cache, {"kv": kv, **extra}), untouched)
    host_after = [p.buffer for p in cache.host_group.pools.values() if p.buffer is not None]
    assert all(torch.equal(a, b) for a, b in zip(host_before, host_after))
    ctrl.check_integrity()


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(x, y) for name in a for la, lb in zip(a[name], b[name]) for x, y in zip(la, lb))


def _round_trip(cache, gen) -> None:
    fill_random(cache, gen)
    kv, extra = alloc_device(cache, pages=1)
    expected = snapshot(cache, {"kv": kv, **extra})
    host = backup(cache, kv, extra)
    fill_random(cache, gen)
    dev = cache.controller.load(host["kv"], {"swa": host["swa"]})
    cache.controller.start_loading()
    if cache.controller.write_stream is not None:
        torch.cuda.synchronize()
    assert [a.success for a in cache.controller.poll()] == [True]
    assert _equal(snapshot(cache, dev), expected)
    cache.controller.check_integrity()


def test_triton_round_trip_small(gen):
    _round_trip(make("dsv4", backend="triton", device_pages=2), gen)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("backend", ["triton", "copy_engine", "auto", "torch"])
def test_cuda_round_trip(backend, layout, gen):
    _round_trip(make("dsv4", layout, backend, device="cuda"), gen)


def test_three_writes_merge_into_one_launch(gen):
    counting = FaultyBackend("copy_engine", fail_on_launch=10**9)
    cache = make("dsv4", backend=counting)
    ctrl = cache.controller
    fill_random(cache, gen)
    # three queued writes: 1 page + SWA row, 2 pages, 1 page + SWA row
    ops = [alloc_device(cache, 1), (alloc_device(cache, 2, 0)[0], {}), alloc_device(cache, 1)]
    for kv, extra in ops:
        assert ctrl.write(kv, extra) is not None
    # one batch, one launch for all pools and layers
    ctrl.start_writing()
    assert counting.launches == 1
    acks = ctrl.poll()
    assert [a.success for a in acks] == [True, True, True]
    # tokens and bytes add up: 4 pages of 256 anchor tokens, 2 SWA rows
    assert sum(a.tokens["kv"] for a in acks) == 4 * 256
    assert sum(a.tokens["swa"] for a in acks if "swa" in a.tokens) == 2 * 128
    c4 = cache.stack.pool("c4_kv")
    assert sum(a.bytes["c4_kv"] for a in acks) == 4 * c4.num_layers * c4.row_bytes
    assert ctrl.stats()["d2h"]["bytes"]["c4_kv"] == 4 * c4.num_layers * c4.row_bytes
    ctrl.check_integrity()


def test_the_counters_equal_the_acks_of_single_pool_single_op_batches_mixed_and_failed(gen):
    # A batch of one op of one pool (the tree's step) is counted when the counters are
    # read, the others at their ack: the totals are the acks' either way, read any time.
    counting = FaultyBackend("copy_engine", fail_on_launch=3)  # the 3rd batch fails
    cache = make("dsv4", backend=counting, device_pages=16)
    ctrl = cache.controller
    fill_random(cache, gen)
    acks = []
    for kv, extra in [(alloc_device(cache, 1, 0)[0], {}), (alloc_device(cache, 2, 0)[0], {}),
                      (alloc_device(cache, 1, 0)[0], {}), alloc_device(cache, 1), (alloc_device(cache, 1, 0)[0], {})]:
        assert ctrl.write(kv, extra or None) is not None
        ctrl.start_writing()
        acks += ctrl.poll()
        if len(acks) == 2:
            ctrl.stats()  # a read in between counts what was acked so far, once
    assert [a.success for a in acks] == [True, True, False, True, True]
    stats = ctrl.stats()["d2h"]
    assert (stats["ops"], stats["failed_ops"]) == (4, 1)
    ok = [a for a in acks if a.success]
    pools = {p for a in ok for p in a.tokens}
    assert pools >= {"kv", "swa", "c4_kv"}
    assert stats["tokens"] == {p: sum(a.tokens.get(p, 0) for a in ok) for p in pools}
    assert stats["bytes"] == {p: sum(a.bytes.get(p, 0) for a in ok) for p in {p for a in ok for p in a.bytes}}
    assert ctrl.stats()["d2h"] == stats  # read again: nothing counted twice
    acks[0].tokens["kv"] = -1  # an ack's dicts are its own
    assert acks[1].tokens["kv"] == 512 and ctrl.stats()["d2h"] == stats


def test_transfers_are_keyed_by_pool_and_source():
    cache = make("dsv4")
    dev = {"kv": torch.arange(512), "swa": torch.arange(128)}
    ops = [Op(0, "d2h", dev, {"kv": torch.arange(512), "swa": torch.arange(128)})]
    jobs = plan_jobs(cache.stack, ops, lambda name: (name, name))
    assert set(jobs) == {("swa", "swa"), ("c4_kv", "kv"), ("c4_indexer", "kv"), ("c128_kv", "kv"),
                         ("c4_state", "swa"), ("c4_indexer_state", "swa")}
    assert jobs[("c4_kv", "kv")].src_rows.tolist() == [0, 1]


def test_host_short_returns_none_and_changes_nothing(gen):
    cache = make("dsv4", ratio=0.5)
    ctrl = cache.controller
    # the host anchor holds 4 pages; ask for 6
    kv = cache.device_pools["kv"].alloc(6 * 256)
    before = allocator_state(cache)
    assert ctrl.write(kv, {"swa": cache.device_pools["swa"].alloc(128)}) is None
    # SWA fit but the anchor did not: nothing stays allocated, nothing is queued
    after = allocator_state(cache)
    assert after["host:kv"] == before["host:kv"] and after["host:swa"] == before["host:swa"]
    assert ctrl.pending() == 0
    ctrl.check_integrity()


def test_device_short_on_load_returns_none(gen):
    cache = make("dsv4", device_pages=4)
    ctrl = cache.controller
    fill_random(cache, gen)
    kv, extra = alloc_device(cache, pages=3)
    host = backup(cache, kv, extra)
    # 3 of 4 device pages are still held: a 3-page load cannot fit
    before = allocator_state(cache)
    assert ctrl.load(host["kv"], {"swa": host["swa"]}) is None
    assert allocator_state(cache) == before and ctrl.pending() == 0
    ctrl.check_integrity()


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_fault_rolls_back_then_retry_succeeds(direction, gen):
    faulty = FaultyBackend("torch", fail_on_launch=10**9)
    cache = make("dsv4", backend=faulty)
    ctrl = cache.controller
    fill_random(cache, gen)
    kv, extra = alloc_device(cache)
    if direction == "h2d":
        expected = snapshot(cache, {"kv": kv, **extra})
        host = backup(cache, kv, extra)
        fill_random(cache, gen)
        before = allocator_state(cache)
        # one launch group per model layer: 4 groups; the last one raises after the
        # first three copied their layers
        ctrl.load_groups.min_bytes = 0
        _, first = arm_later_group(ctrl, faulty, host["kv"], {"swa": host["swa"]}, min_groups=4)
        dev = ctrl.load(host["kv"], {"swa": host["swa"]})
        ctrl.start_loading()
        assert landed_before(cache, dev, expected, first)  # earlier groups did run
    else:
        backup(cache, *alloc_device(cache, 1, 0)[:1], {})  # one launch, it succeeds
        before = allocator_state(cache)
        faulty.fail_on_launch = faulty.attempts + 1  # a backup is one launch: it raises
        ctrl.write(kv, extra)
        ctrl.start_writing()
    acks = ctrl.poll()
    # the batch failed as a whole and its destination slots are free again
    assert [a.success for a in acks] == [False] and "injected" in acks[0].error
    assert allocator_state(cache) == before
    assert ctrl.stats()[direction]["rollbacks"] == 1
    # a retry succeeds
    if direction == "h2d":
        dev = ctrl.load(host["kv"], {"swa": host["swa"]})
        ctrl.start_loading()
    else:
        ctrl.write(kv, extra)
        ctrl.start_writing()
    assert [a.success for a in ctrl.poll()] == [True]
    ctrl.check_integrity()


def test_bad_input_changes_nothing(gen):
    cache = make("dsv4")
    ctrl = cache.controller
    kv, extra = alloc_device(cache)
    before = allocator_state(cache)
    with pytest.raises(ValueError, match="whole pages"):
        ctrl.write(kv[:100])  # not page-aligned
    with pytest.raises(ValueError, match="extra"):
        ctrl.write(kv, {"c4_kv": kv})  # a sidecar has no slots of its own
    with pytest.raises(ValueError, match="extra"):
        ctrl.write(kv, {"nope": kv})
    with pytest.raises(ValueError, match="never written"):
        ctrl.load(torch.arange(256))  # host slots never written
    host = backup(cache, kv, extra)
    cache.host_group.pools["kv"].free(host["kv"])
    with pytest.raises(ValueError, match="never written, or freed"):
        ctrl.load(host["kv"])  # freed
    cache.host_group.pools["swa"].free(host["swa"])
    assert allocator_state(cache) == before and ctrl.pending() == 0
    ctrl.check_integrity()


def test_server_allocator_with_unaligned_slots_is_refused(gen):
    cache = make("dsv4")
    fill_random(cache, gen)
    kv, extra = alloc_device(cache)
    host = backup(cache, kv, extra)
    # a server allocator that hands out slots off by one: refused, and given back
    given_back = []
    ctrl = type(cache.controller)(cache.device_pools, cache.host_group, cache.config, backend="torch",
                                  device_alloc={"kv": lambda n: torch.arange(1, n + 1)},
                                  device_free={"kv": given_back.append})
    ctrl.mark_host_written(host["kv"], {n: s for n, s in host.items() if n != "kv"})  # same, backed-up pages
    with pytest.raises(ValueError, match="device_alloc"):
        ctrl.load(host["kv"])
    assert len(given_back) == 1 and ctrl.pending() == 0
