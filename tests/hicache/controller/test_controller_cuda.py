"""The controller on a real GPU: layer events, rollback, close with copies in flight.

Caches come from ``hicache.build(..., device="cuda")``: host pools are the production
reservation (mmap + cudaHostRegister), transfers run on the controller's own streams.
"""
from __future__ import annotations

import pytest
import torch

from tests.hicache.controller.test_controller import (_equal, alloc_device, allocator_state, backup,
                                           fill_random, make, snapshot)
from tests.hicache.controller.rollback import arm_later_group
from transfer_kernels import FaultyBackend

pytestmark = pytest.mark.gpu


def _stored(cache, gen, pages: int):
    """Random device bytes, ``pages`` pages (+ one SWA row) backed up; returns what to load."""
    fill_random(cache, gen)
    kv, extra = alloc_device(cache, pages=pages)
    expected = snapshot(cache, {"kv": kv, **extra})
    host = backup(cache, kv, extra)
    cache.device_pools["kv"].free(kv)
    cache.device_pools["swa"].free(extra["swa"])
    fill_random(cache, gen)
    return host, expected


@pytest.mark.parametrize("backend", ["triton", "copy_engine"])
def test_wait_until_orders_compute_after_each_layer(gen, backend):
    # The compute stream reads each layer right after wait_until, with no host sync in
    # between; the copies it reads must be the loaded bytes.
    cache = make("dsv4", backend=backend, device="cuda", device_pages=24)
    ctrl = cache.controller
    host, expected = _stored(cache, gen, pages=8)
    dev = ctrl.load(host["kv"], {"swa": host["swa"]})
    k = ctrl.start_loading()
    assert k is not None
    seen = {}
    rows = cache.stack.derive_rows(dev)
    for layer in range(cache.stack.num_model_layers):
        ctrl.layer_done.wait_until(layer, k)
        for name, r in rows.items():
            pool = cache.device_pools[name]
            spec = cache.stack.pool(name)
            if layer in spec.layer_ids:
                local = spec.layer_ids.index(layer)
                seen[(name, local)] = [v.index_select(0, r.cuda()) for v in pool.row_views()[local]]
    torch.cuda.synchronize()
    for (name, local), got in seen.items():
        assert all(torch.equal(g.cpu(), e.cpu()) for g, e in zip(got, expected[name][local]))
    assert [a.success for a in ctrl.poll()] == [True]
    ctrl.check_integrity()


@pytest.mark.parametrize("which", ["first", "last"])
def test_rollback_on_cuda_frees_and_signals_every_layer(gen, which):
    # The first launch group fails, or the last one after every other group was enqueued
    # (one group per model layer: the grouping is computed from the plan, not assumed).
    cache = make("dsv4", backend="triton", device="cuda")
    host, _ = _stored(cache, gen, pages=2)
    ctrl = cache.controller
    ctrl.backend = faulty = FaultyBackend("triton", fail_on_launch=10 ** 9)
    ctrl.load_groups.min_bytes = 0
    arm_later_group(ctrl, faulty, host["kv"], {"swa": host["swa"]}, min_groups=3)
    if which == "first":
        faulty.fail_on_launch = faulty.attempts + 1
    before = allocator_state(cache)
    assert ctrl.load(host["kv"], {"swa": host["swa"]}) is not None
    assert ctrl.start_loading() is None  # rolled back: no consumer to wait on
    for layer in range(cache.stack.num_model_layers):
        ctrl.layer_done.wait_until(layer)  # every layer event was recorded: no hang
    torch.cuda.synchronize()
    acks = ctrl.poll()
    assert [(a.direction, a.success) for a in acks] == [("h2d", False)]
    assert "injected fault" in acks[0].error
    assert allocator_state(cache) == before
    ctrl.check_integrity()


def test_close_waits_for_copies_in_flight(gen):
    cache = make("dsv4", backend="triton", device="cuda", device_pages=24)
    ctrl = cache.controller
    fill_random(cache, gen)
    kv, extra = alloc_device(cache, pages=16)
    expected = snapshot(cache, {"kv": kv, **extra})
    host = ctrl.write(kv, extra)
    ctrl.start_writing()
    queued = ctrl.write(*alloc_device(cache, pages=1))  # queued, never launched
    assert queued is not None
    cache.close()  # no sync before: close must wait for the launched backup
    acks = ctrl.poll()
    assert [(a.success, a.error) for a in acks] == [(True, None), (False, acks[1].error)]
    assert "closed" in acks[1].error
    rows = cache.stack.derive_rows(host)
    for name, r in rows.items():
        pool = cache.host_group.pools[name]
        for layer, views in enumerate(pool.row_views()):
            for v, e in zip(views, expected[name][layer]):
                assert torch.equal(v.index_select(0, r), e.cpu())
    with pytest.raises(RuntimeError, match="closed"):
        ctrl.write(kv, extra)
    with pytest.raises(RuntimeError, match="closed"):
        ctrl.start_loading()


def test_cuda_slots_are_refused_without_a_sync(gen):
    cache = make("dsv4", backend="triton", device="cuda")
    kv, extra = alloc_device(cache)
    with pytest.raises(ValueError, match="device_indices: must be a CPU tensor"):
        cache.controller.write(kv.cuda(), extra)
    assert cache.controller.pending() == 0


def test_round_trip_all_backends_match(gen):
    # Every backend moves the same bytes through the production pinned pools.
    results = []
    for backend in ("triton", "copy_engine", "auto", "torch"):
        g = torch.Generator().manual_seed(7)
        cache = make("dsv4", backend=backend, device="cuda")
        host, expected = _stored(cache, g, pages=2)
        dev = cache.controller.load(host["kv"], {"swa": host["swa"]})
        cache.controller.start_loading()
        torch.cuda.synchronize()
        assert [a.success for a in cache.controller.poll()] == [True]
        got = snapshot(cache, dev)
        assert _equal(got, expected)
        results.append({n: [[t.cpu() for t in l] for l in v] for n, v in got.items()})
        cache.close()
    assert all(_equal(r, results[0]) for r in results[1:])
