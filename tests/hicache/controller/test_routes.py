"""Issue 26 item 1: a route per (direction, pool set), decided when the controller is built,
and ONE cache of prepared objects per route (one per size class).

Byte-exact on the CPU through the production paths: the dma backend's staging (whole
pages by the DMA stand-in, then the scatter) and ``auto`` deciding as on a GPU.
"""
from __future__ import annotations

import pytest
import torch

from bench.host_only import cuda_rules_on_cpu
from hicache import HiCacheConfig, build
from hicache.models import deepseek_v4, mha
from tests.hicache.controller.rollback import arm_later_group
from tests.hicache.controller.test_controller import BIG, _equal, alloc_device, make, snapshot
from tests.hicache.controller.test_controller_transfers import _load, _stored
from transfer_kernels import AutoBackend, FaultyBackend, StagedBackend, TorchBackend, TritonBackend, copy_rows
from transfer_kernels.backends import auto_table
from transfer_kernels.quant.reference import dequantize_int8_ref, quantize_int8_ref


def _staged() -> StagedBackend:
    return StagedBackend(TorchBackend())


def _auto_as_on_cuda() -> AutoBackend:
    auto = AutoBackend(triton=TritonBackend(), table=cuda_rules_on_cpu(auto_table.SEED))
    auto.inner["dma"].kernel = TorchBackend()  # the scatter by the reference (fast on the CPU)
    return auto


BACKENDS = {"dma": _staged, "auto": _auto_as_on_cuda}
# the production pairing (the interpreted kernel scatters): its kept buffers too
ROLLBACK = {**BACKENDS, "dma-triton": lambda: StagedBackend(TritonBackend())}


def _routes(ctrl, direction: str = "h2d") -> dict:
    return {roots: route for (d, roots), route in ctrl._launcher._routes.items() if d == direction}


def _prepared(ctrl) -> list:
    return [p for route in _routes(ctrl).values() for p in route.prepared.values()]


def test_every_route_is_decided_when_the_controller_is_built():
    cache = make("dsv4", backend=_staged())
    routes = cache.controller._launcher._routes
    pool_sets = {(d, ps.roots) for d, planner in cache.controller._planners.items() for ps in planner.pool_sets.values()}
    assert set(routes) == pool_sets and len(pool_sets) == 6  # {kv}, {swa}, {kv, swa} per direction
    assert all(not r.prepared for r in routes.values())  # nothing laid out before a batch


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_two_controllers_of_one_geometry_never_share_a_prepared_object(backend, gen):
    shared = BACKENDS[backend]()  # ONE backend instance behind both
    first, second = make("dsv4", backend=shared), make("dsv4", backend=shared)
    stored = [_stored(cache, gen, pages=2) for cache in (first, second)]
    for _ in range(2):  # the second time: each controller's warm size class
        for cache, (host, expected) in zip((first, second), stored):
            dev = _load(cache, host)
            assert _equal(snapshot(cache, dev), expected)
            for name, s in dev.items():
                cache.device_pools[name].free(s)
    mine, theirs = _prepared(first.controller), _prepared(second.controller)
    assert mine and theirs and not {id(p) for p in mine} & {id(p) for p in theirs}
    for cache in (first, second):  # each route moves its own controller's tables
        tables = {id(t) for pair in cache.controller._planners["h2d"].tables.values() for t in pair}
        for route in _routes(cache.controller).values():
            assert all(id(lane.src) in tables and id(lane.dst) in tables for lane in route.lanes)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_one_size_class_with_other_pages_or_pools_moves_the_right_bytes(backend, gen):
    cache = make("dsv4", backend=BACKENDS[backend](), device_pages=8)
    ctrl = cache.controller
    stored = [_stored(cache, gen, pages=2) for _ in range(3)]  # other host pages each time
    for host, expected in stored:
        dev = _load(cache, host)
        assert _equal(snapshot(cache, dev), expected)
        for name, s in dev.items():
            cache.device_pools[name].free(s)
    both = _routes(ctrl)[frozenset({"kv", "swa"})]
    assert both.built == 1 and len(both.prepared) == 1  # one class, laid out once
    # the same kv rows without the SWA state: another pool set, its own route and class
    host, expected = stored[0]
    dev = ctrl.load(host["kv"])
    assert ctrl.start_loading() is not None and [a.success for a in ctrl.poll()] == [True]
    got = snapshot(cache, dev)
    assert _equal(got, {name: expected[name] for name in got})
    assert _routes(ctrl)[frozenset({"kv"})].built == 1 and both.built == 1


@pytest.mark.parametrize("backend", ["dma", "auto"])
def test_one_size_class_with_other_layers_moves_the_right_bytes(backend, gen):
    # copy_rows through one backend: the same rows of layer 0, then of layer 2 (one route
    # each: layers are part of a lane); the other layers keep their bytes.
    from tests.transfer_kernels.pools import assert_copied, make_pool, random_map, snapshot as snap
    impl = BACKENDS[backend]()
    pool = make_pool(gen, 3, 12, [((8,), torch.bfloat16), ((5,), torch.uint8)], "page_first",
                     device="cpu", pin=False)
    src_rows, dst_rows = random_map(gen, 12, 12, 4)
    for layer in (0, 2):
        before = snap(pool.host_table), snap(pool.device_table)
        copy_rows(pool.host_table, pool.device_table, src_rows, dst_rows, layers=[layer], backend=impl)
        assert_copied(pool.host_table, pool.device_table, *before, src_rows, dst_rows, layers=[layer])
    assert len(impl.route_cache) == 2


def test_one_geometry_with_other_host_dtypes_moves_the_right_bytes(gen):
    # one backend behind an exact and an int8 host tier of the same geometry: each its own
    # routes; the exact one byte for byte, the int8 one the reference's bytes
    shared = _auto_as_on_cuda()
    caches = {}
    for dtype in ("auto", "int8"):
        config = HiCacheConfig(host_dtype=dtype, mem_layout="page_first", hicache_ratio=2.0)
        caches[dtype] = build(mha(2, 2, 16, page_size=4), 8 * 4, config, device="cpu", budget=BIG,
                              backend=shared)
    for dtype, cache in caches.items():
        dev = cache.device_pools["kv"]
        for layer in dev.tensors:
            for t in layer:
                t.copy_((torch.randn(t.shape, generator=gen) * 2).to(t.dtype))
        slots = dev.alloc(2 * 4)
        before = [[t[slots[::4] // 4].clone() for t in layer] for layer in dev.tensors]
        host = cache.controller.write(slots)
        cache.controller.start_writing()
        assert [a.success for a in cache.controller.poll()] == [True]
        back = cache.controller.load(host["kv"])
        cache.controller.start_loading()
        assert all(a.success for a in cache.controller.poll())
        rows = back["kv"][::4] // 4
        for layer, old in zip(dev.tensors, before):
            for t, want in zip(layer, old):
                if dtype == "int8":
                    q, s = quantize_int8_ref(want)
                    want = dequantize_int8_ref(q, s, want.dtype)
                assert torch.equal(t[rows].view(torch.uint8), want.view(torch.uint8))
    assert not {id(p) for p in _prepared(caches["auto"].controller)} & \
        {id(p) for p in _prepared(caches["int8"].controller)}


@pytest.mark.parametrize("backend", list(ROLLBACK))
def test_a_prepared_object_survives_a_rolled_back_load(backend, gen):
    faulty = FaultyBackend(ROLLBACK[backend](), fail_on_launch=10 ** 9)
    cache = make("dsv4", backend=faulty, device_pages=8)
    cache.controller.load_groups.min_bytes = 0  # one group per layer: a later one fails
    ctrl = cache.controller
    host, expected = _stored(cache, gen, pages=2)
    dev = _load(cache, host)  # the size class laid out
    for name, s in dev.items():
        cache.device_pools[name].free(s)
    route = _routes(ctrl)[frozenset({"kv", "swa"})]
    (prepared,) = route.prepared.values()
    arm_later_group(ctrl, faulty, host["kv"], {"swa": host["swa"]})
    assert ctrl.load(host["kv"], {"swa": host["swa"]}) is not None
    assert ctrl.start_loading() is None  # rolled back
    assert [a.success for a in ctrl.poll()] == [False]
    dev = _load(cache, host)  # the same class again: the same prepared object, exact bytes
    assert _equal(snapshot(cache, dev), expected)
    assert list(route.prepared.values()) == [prepared] and route.built == 1


def test_a_backend_that_refuses_the_tables_fails_each_batch_not_the_build(gen, monkeypatch):
    # decided at construction: a check that fails there is raised by each batch's launch
    # (the batch rolls back, its ack says why), as a failing launch always was
    def refuse(self, plan):
        raise ValueError("tables refused")
    monkeypatch.setattr(StagedBackend, "check", refuse)
    cache = make("dsv4", backend=_staged())
    kv, extra = alloc_device(cache, pages=1)
    assert cache.controller.write(kv, extra) is not None
    cache.controller.start_writing()
    (ack,) = cache.controller.poll()
    assert not ack.success and "tables refused" in ack.error
    cache.controller.check_integrity()


@pytest.mark.parametrize("backend", ["torch", *BACKENDS])
def test_an_anchor_without_data_pools_moves_its_sidecar_and_nothing_else(backend, gen):
    # DeepSeek-V4 layers that are all sliding-window: the anchor "kv" holds no data, so an
    # op naming {kv, swa} moves swa's rows and one naming {kv} alone moves nothing. Was: a
    # KeyError at launch (the pool sets were keyed by roots with data), every transfer failed
    stack = deepseek_v4([0])
    assert all(stack.root_of(p.name).name == "swa" for p in stack.data_pools())
    picked = TorchBackend() if backend == "torch" else BACKENDS[backend]()
    config = HiCacheConfig(mem_layout="page_first", io_backend="torch", hicache_ratio=2.0, swa_full_tokens_ratio=0.5)
    cache = build(stack, 8 * stack.page_size, config, device="cpu", budget=BIG, backend=picked)
    ctrl = cache.controller
    host, expected = _stored(cache, gen, pages=2)
    other = {"swa": cache.device_pools["swa"].alloc(128)}  # a row no load may touch
    untouched = snapshot(cache, other)
    dev = _load(cache, host)
    assert _equal(snapshot(cache, dev), expected)
    alone = ctrl.load(host["kv"])  # the anchor alone: pages taken, nothing to copy, acked
    assert alone is not None and ctrl.start_loading() is not None
    assert [a.success for a in ctrl.poll()] == [True]
    assert _equal(snapshot(cache, other), untouched)
    cache.close()
