"""GPU regressions of the transfer review (A.1-A.7): stream ordering, rollback, the caller's
buffers, staging reuse, many ops, close and rebuild, host pools past 4 GiB.

Every test queues work behind a ``torch.cuda._sleep`` so that the race it guards is open
while the host enqueues; none depends on timing to pass (a missing wait makes it fail
whenever the sleep outlasts the host's enqueue, which 0.1-0.2 s always does).
"""
from __future__ import annotations

import pytest
import torch

from hicache import HiCacheConfig, build
from hicache.models import mha
from tests.hicache.controller.test_controller import (BIG, _equal, alloc_device, allocator_state, fill_random,
                                           make, snapshot)
from tests.hicache.controller.test_controller_cuda import _stored
from tests.hicache.controller.rollback import arm_later_group
from transfer_kernels import CopyBackend, FaultyBackend, get_backend

pytestmark = pytest.mark.gpu
SLEEP = 200_000_000  # GPU cycles: ~0.1 s


def _load_and_check(cache, host, expected) -> None:
    ctrl = cache.controller
    dev = ctrl.load(host["kv"], {"swa": host["swa"]})
    assert ctrl.start_loading() is not None
    torch.cuda.synchronize()
    assert [a.success for a in ctrl.poll()] == [True]
    assert _equal(snapshot(cache, dev), expected)


def test_first_copy_after_build_on_a_busy_other_stream(gen):
    # A.1: built under a busy stream, first transfer under another: nothing the kernel
    # reads may still be in flight on the first stream.
    s_init, s_run = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(s_init):
        torch.cuda._sleep(2 * SLEEP)
        cache = make("dsv4", backend="triton", device="cuda", device_pages=8)
    with torch.cuda.stream(s_run):
        host, expected = _stored(cache, gen, pages=2)
        _load_and_check(cache, host, expected)


class _CopiesThenFails(CopyBackend):
    """Enqueues the whole copy with a real backend, then raises (a later part of a batch
    failing after an earlier part was enqueued)."""

    name = "copies-then-fails"

    def __init__(self, inner: str) -> None:
        super().__init__()
        self.inner = get_backend(inner)

    def _execute(self, plan) -> None:
        self.inner.execute(plan)
        raise RuntimeError("injected fault after the copies were enqueued")


@pytest.mark.parametrize("backend", ["triton", "dma"])
def test_rolled_back_backup_keeps_its_host_pages_until_its_copies_end(gen, backend):
    # A.2: the backup's copies queue behind a sleep, then the batch fails. Until its ack is
    # polled its host pages stay allocated, so a CPU writer (the storage tier) handed
    # every free page cannot get one of them and be overwritten by the late copies.
    cache = make("dsv4", backend=_CopiesThenFails(backend), device="cuda")
    ctrl = cache.controller
    fill_random(cache, gen)
    kv, extra = alloc_device(cache, pages=2)
    before = allocator_state(cache)
    torch.cuda._sleep(SLEEP)  # the write stream waits for the current stream
    failed = ctrl.write(kv, extra)
    ctrl.start_writing()
    assert ctrl.rolled_back_ops() == set()  # not freed: its copies may still run
    writers = {n: p.alloc(p.available()) for n, p in cache.host_group.pools.items()
               if p.allocator is not None and p.available()}
    for name, slots in writers.items():
        assert not set(slots.tolist()) & set(failed[name].tolist())
    rows = cache.stack.derive_rows(writers)
    for name, r in rows.items():
        for views in cache.host_group.pools[name].row_views():
            for v in views:
                v[r] = 0x5A
    torch.cuda.synchronize()
    for name, r in rows.items():
        for views in cache.host_group.pools[name].row_views():
            assert all(bool((v[r] == 0x5A).all()) for v in views)
    acks = ctrl.poll()
    assert [a.success for a in acks] == [False] and "injected" in acks[0].error
    for name, slots in writers.items():
        cache.host_group.pools[name].free(slots)
    assert allocator_state(cache) == before  # freed by the poll that returned the ack
    ctrl.check_integrity()


@pytest.mark.parametrize("backend", ["triton", "dma", "copy_engine"])
def test_rolled_back_load_on_the_production_launches(gen, backend):
    # A.7.2: FaultyBackend fails one of the real backend's own prepared launches.
    cache = make("dsv4", backend=FaultyBackend(backend, fail_on_launch=10 ** 9), device="cuda",
                 device_pages=24)
    ctrl = cache.controller
    host, expected = _stored(cache, gen, pages=4)
    ctrl.load_groups.min_bytes = 0  # one group per layer: the last one fails, after the others
    arm_later_group(ctrl, ctrl.backend, host["kv"], {"swa": host["swa"]}, min_groups=3)
    before = allocator_state(cache)
    assert ctrl.load(host["kv"], {"swa": host["swa"]}) is not None
    assert ctrl.start_loading() is None
    for layer in range(cache.stack.num_model_layers):
        ctrl.layer_done.wait_until(layer)
    torch.cuda.synchronize()
    assert [a.success for a in ctrl.poll()] == [False]
    assert allocator_state(cache) == before
    _load_and_check(cache, host, expected)


@pytest.mark.parametrize("backend", ["triton", "copy_engine", "dma"])
def test_queued_load_ignores_later_changes_to_the_callers_tensors(gen, backend):
    # A.3: the caller reuses its index buffer between load() and start_loading().
    cache = make("dsv4", backend=backend, device="cuda", device_pages=24)
    host, expected = _stored(cache, gen, pages=4)
    mine = host["kv"].clone()
    dev = cache.controller.load(mine, {"swa": host["swa"]})
    mine.copy_(mine.flip(0))
    cache.controller.start_loading()
    torch.cuda.synchronize()
    assert [a.success for a in cache.controller.poll()] == [True]
    assert _equal(snapshot(cache, dev), expected)


def test_copy_streams_run_at_the_highest_priority():
    # A.6
    cache = make("dsv4", backend="triton", device="cuda")
    streams = (cache.controller.load_stream, cache.controller.write_stream)
    if hasattr(torch.cuda.Stream, "priority_range"):
        assert all(s.priority == min(torch.cuda.Stream.priority_range()) for s in streams)
    else:  # torch mapped the out-of-range request to its highest priority
        assert all(s.priority < 0 for s in streams)


@pytest.mark.parametrize("backend", ["triton", "dma", "auto"])
def test_same_shape_loads_back_to_back_without_a_sync(gen, backend):
    # A.7.1: three loads of one shape queue behind a sleep on the load stream; staged
    # indices, layouts and staging buffers must not be reused while still being read.
    cache = make("dsv4", backend=backend, device="cuda", device_pages=24)
    ctrl = cache.controller
    stored = [_stored(cache, gen, pages=2) for _ in range(3)]
    with torch.cuda.stream(ctrl.load_stream):
        torch.cuda._sleep(SLEEP)
    devs = []
    for host, _ in stored:
        devs.append(ctrl.load(host["kv"], {"swa": host["swa"]}))
        assert ctrl.start_loading() is not None
    torch.cuda.synchronize()
    assert [a.success for a in ctrl.poll()] == [True] * 3
    for dev, (_, expected) in zip(devs, stored):
        assert _equal(snapshot(cache, dev), expected)


@pytest.mark.parametrize("backend", ["triton", "dma"])
def test_wait_until_orders_compute_while_the_load_stream_is_slow(gen, backend):
    # A.7.3: the load stream is held back; the compute stream reads each layer right after
    # wait_until (no host sync): it must see the loaded bytes, never the old ones.
    cache = make("dsv4", backend=backend, device="cuda", device_pages=24)
    ctrl = cache.controller
    host, expected = _stored(cache, gen, pages=8)
    with torch.cuda.stream(ctrl.load_stream):
        torch.cuda._sleep(SLEEP)
    dev = ctrl.load(host["kv"], {"swa": host["swa"]})
    k = ctrl.start_loading()
    rows = cache.stack.derive_rows(dev)
    seen = {}
    for layer in range(cache.stack.num_model_layers):
        ctrl.layer_done.wait_until(layer, k)
        for name, r in rows.items():
            spec = cache.stack.pool(name)
            if layer in spec.layer_ids:
                local = spec.layer_ids.index(layer)
                views = cache.device_pools[name].row_views()[local]
                seen[(name, local)] = [v.index_select(0, r.cuda()) for v in views]
    torch.cuda.synchronize()
    for (name, local), got in seen.items():
        assert all(torch.equal(g.cpu(), e.cpu()) for g, e in zip(got, expected[name][local]))
    assert [a.success for a in ctrl.poll()] == [True]


def test_sixteen_ops_and_a_concurrent_backup(gen):
    # A.7.4: a 16-op load batch and a backup in flight at the same time.
    cache = make("dsv4", backend="auto", device="cuda", device_pages=48)
    ctrl = cache.controller
    stored = [_stored(cache, gen, pages=1) for _ in range(16)]
    fill_random(cache, gen)
    kv, extra = alloc_device(cache, pages=2)
    backup_expected = snapshot(cache, {"kv": kv, **extra})
    host_b = ctrl.write(kv, extra)
    devs = [ctrl.load(h["kv"], {"swa": h["swa"]}) for h, _ in stored]
    ctrl.start_writing()
    assert ctrl.start_loading() is not None
    torch.cuda.synchronize()
    acks = ctrl.poll()
    assert sorted(a.direction for a in acks) == ["d2h"] + ["h2d"] * 16 and all(a.success for a in acks)
    for dev, (_, expected) in zip(devs, stored):
        assert _equal(snapshot(cache, dev), expected)
    rows = cache.stack.derive_rows(host_b)
    for name, r in rows.items():
        for layer, views in enumerate(cache.host_group.pools[name].row_views()):
            for v, e in zip(views, backup_expected[name][layer]):
                assert torch.equal(v.index_select(0, r), e.cpu())


@pytest.mark.parametrize("backend", ["triton", "dma"])
def test_close_and_rebuild_then_the_same_shape(gen, backend):
    # A.7.5: a rebuilt cache often gets the same addresses: cached layouts keyed by dead
    # tables must never serve the new ones.
    for _ in range(2):
        cache = make("dsv4", backend=backend, device="cuda", device_pages=24)
        host, expected = _stored(cache, gen, pages=2)
        _load_and_check(cache, host, expected)
        cache.close()
        del cache, host
        torch.cuda.empty_cache()


@pytest.mark.parametrize("backend", ["triton", "dma", "copy_engine"])
def test_host_pool_over_4_gib_through_the_controller(gen, backend):
    # A.7.6: host rows past byte 2**32 of their pool (2 layers x 4 KiB per token).
    stack = mha(2, 8, 128, page_size=64, model="big")
    config = HiCacheConfig(hicache_ratio=8.0, io_backend="torch")
    cache = build(stack, 76 * 1024, config, device="cuda", budget=BIG, backend=backend)
    pool = cache.host_group.pools["kv"]
    assert pool.nbytes > 4 << 30
    ctrl = cache.controller
    everything = pool.alloc(pool.available())
    last = everything.sort().values[-4 * 64:]  # the last four pages: beyond 4 GiB
    rows = stack.derive_rows({"kv": last})["kv"]
    for views in pool.row_views():
        for v in views:
            v[rows] = torch.randint(0, 256, (rows.numel(), v.shape[1]), dtype=torch.uint8, generator=gen)
    expected = [[v[rows].clone() for v in views] for views in pool.row_views()]
    ctrl.mark_host_written(last)
    dev = ctrl.load(last)
    ctrl.start_loading()
    torch.cuda.synchronize()
    assert [a.success for a in ctrl.poll()] == [True]
    dev_rows = stack.derive_rows(dev)["kv"].cuda()
    for views, want in zip(cache.device_pools["kv"].row_views(), expected):
        assert all(torch.equal(v.index_select(0, dev_rows).cpu(), w) for v, w in zip(views, want))
    cache.close()
