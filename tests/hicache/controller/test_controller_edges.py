"""The controller's promises at its edges: ids it issues, callees that raise, stale host
pages, slot arguments of every shape, per-direction acks, rolled-back loads, close()."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.controller.batch import Batch
from tests.hicache.controller.test_controller import (alloc_device, allocator_state, backup, fill_random,
                                           make, snapshot)
from tests.hicache.controller.rollback import arm_later_group
from transfer_kernels import FaultyBackend


def test_op_ids_are_issued_by_the_controller(gen):
    # A server's op and the tree's op can never share an id: the controller issues them.
    cache = make("dsv4")
    ctrl = cache.controller
    fill_random(cache, gen)
    ids = []
    for _ in range(3):
        assert ctrl.write(*alloc_device(cache, pages=1)) is not None
        ids.append(ctrl.last_op_id)
    ctrl.start_writing()
    assert len(set(ids)) == 3 and [a.op_id for a in ctrl.poll()] == ids
    with pytest.raises(TypeError):
        ctrl.write(*alloc_device(cache, pages=1), op_id=5)  # no caller-chosen ids


class Boom(RuntimeError):
    pass


def _raising_alloc(cache, fail_pool: str, given_back: list):
    """Server allocators for kv and swa; the one of ``fail_pool`` raises."""
    def alloc(name):
        def fn(n):
            if name == fail_pool:
                raise Boom(f"allocator of {name} is down")
            return cache.device_pools[name].alloc(n)
        return fn

    def free(name):
        def fn(slots):
            given_back.append(name)
            return cache.device_pools[name].free(slots)
        return fn
    return {n: alloc(n) for n in ("kv", "swa")}, {n: free(n) for n in ("kv", "swa")}


@pytest.mark.parametrize("fail_pool", ["kv", "swa"])
def test_server_allocator_that_raises_leaks_nothing(gen, fail_pool):
    cache = make("dsv4")
    fill_random(cache, gen)
    kv, extra = alloc_device(cache)
    host = backup(cache, kv, extra)
    given_back: list = []
    alloc, free = _raising_alloc(cache, fail_pool, given_back)
    ctrl = type(cache.controller)(cache.device_pools, cache.host_group, cache.config,
                                  backend="torch", device_alloc=alloc, device_free=free)
    ctrl.mark_host_written(host["kv"], {"swa": host["swa"]})  # the same, already backed-up pages
    before = allocator_state(cache)
    with pytest.raises(Boom):
        ctrl.load(host["kv"], {"swa": host["swa"]})
    # whatever the first allocator handed out went back; nothing is queued
    assert allocator_state(cache) == before and ctrl.pending() == 0
    assert given_back == ([] if fail_pool == "kv" else ["kv"])
    ctrl.check_integrity()


def test_a_raising_free_during_rollback_still_frees_the_rest_and_acks(gen):
    cache = make("dsv4", backend=FaultyBackend("torch", fail_on_launch=1))
    fill_random(cache, gen)
    ctrl = cache.controller
    host_pools = cache.host_group.pools
    real_free = host_pools["swa"].free
    host_pools["swa"].free = lambda slots: (_ for _ in ()).throw(Boom("free of swa failed"))
    before = allocator_state(cache)
    for _ in range(2):
        assert ctrl.write(*alloc_device(cache, pages=1)) is not None
    ctrl.start_writing()  # launch 1 raises; the rollback's swa free raises too
    acks = ctrl.poll()
    assert [a.success for a in acks] == [False, False]
    assert "free of 'swa' raised Boom" in acks[0].error
    after = allocator_state(cache)
    assert after["host:kv"] == before["host:kv"]  # the anchor slots of both ops came back
    host_pools["swa"].free = real_free


def test_load_refuses_host_pages_freed_and_allocated_again(gen):
    # The tree freed the backed-up pages and someone else took them: old bytes are gone.
    cache = make("dsv4")
    fill_random(cache, gen)
    ctrl = cache.controller
    kv, extra = alloc_device(cache)
    host = backup(cache, kv, extra)
    pool = cache.host_group.pools["kv"]
    pool.free(host["kv"])
    again = pool.alloc(host["kv"].numel())
    assert torch.equal(again, host["kv"])  # the same slots, a new allocation
    with pytest.raises(ValueError, match=r"host_indices \(pool 'kv'\): .*allocated again"):
        ctrl.load(host["kv"], {"swa": host["swa"]})
    assert ctrl.pending() == 0


def test_write_refuses_device_slots_not_allocated(gen):
    cache = make("dsv4")
    ctrl = cache.controller
    kv, extra = alloc_device(cache)
    cache.device_pools["kv"].free(kv)
    before = allocator_state(cache)
    with pytest.raises(ValueError, match=r"device_indices \(pool 'kv'\): slots that are not allocated"):
        ctrl.write(kv, extra)
    with pytest.raises(ValueError, match=r"device_indices \(pool .kv.\): slots: values must be in"):
        ctrl.write(torch.arange(256 * 4000, 256 * 4001), extra)
    assert allocator_state(cache) == before and ctrl.pending() == 0


@pytest.mark.parametrize("form", ["list", "numpy", "int32"])
def test_slots_as_list_or_numpy(gen, form):
    cache = make("dsv4")
    fill_random(cache, gen)
    kv, extra = alloc_device(cache)
    expected = snapshot(cache, {"kv": kv, **extra})
    conv = {"list": lambda t: t.tolist(), "numpy": lambda t: t.numpy(),
            "int32": lambda t: t.to(torch.int32)}[form]
    host = cache.controller.write(conv(kv), {"swa": conv(extra["swa"])})
    cache.controller.start_writing()
    assert [a.success for a in cache.controller.poll()] == [True]
    dev = cache.controller.load(conv(host["kv"]), {"swa": conv(host["swa"])})
    cache.controller.start_loading()
    assert [a.success for a in cache.controller.poll()] == [True]
    got = snapshot(cache, dev)
    assert all(torch.equal(a, b) for n in got for la, lb in zip(got[n], expected[n])
               for a, b in zip(la, lb))


@pytest.mark.parametrize("bad,exc,match", [
    (np.arange(256, dtype=np.float64), ValueError, "host_indices: must hold integers"),
    (torch.ones(256, dtype=torch.bool), ValueError, "host_indices: dtype must be an integer"),
    (torch.arange(256).view(2, 128), ValueError, "host_indices: must be 1-D"),
    ("0-255", TypeError, "host_indices: must be a tensor"),
])
def test_load_errors_name_host_indices(bad, exc, match):
    cache = make("dsv4")
    with pytest.raises(exc, match=match):
        cache.controller.load(bad)


class FakeEvent:
    def __init__(self, done: bool) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done


def test_poll_does_not_hold_a_finished_load_behind_an_unfinished_backup():
    cache = make("dsv4")
    ctrl = cache.controller
    backup_batch = Batch([], "d2h", event=FakeEvent(False))
    load_batch = Batch([], "h2d", event=FakeEvent(True))
    ctrl._queue.launched(backup_batch)
    ctrl._queue.launched(load_batch)
    fake = backup_batch.event
    ctrl.poll()
    # only the load was acked (an acked batch's event is taken back for reuse)
    assert load_batch.event is None and backup_batch.event is fake
    fake.done = True
    ctrl.poll()
    assert backup_batch.event is None


def test_rolled_back_load_returns_none(gen):
    faulty = FaultyBackend("torch", fail_on_launch=10 ** 9)
    cache = make("dsv4", backend=faulty)
    ctrl = cache.controller
    fill_random(cache, gen)
    host = backup(cache, *alloc_device(cache))
    before = allocator_state(cache)
    ctrl.load_groups.min_bytes = 0  # one group per model layer: the last of 4 raises
    arm_later_group(ctrl, faulty, host["kv"], {"swa": host["swa"]}, min_groups=4)
    assert ctrl.load(host["kv"], {"swa": host["swa"]}) is not None
    assert ctrl.start_loading() is None  # rolled back after 3 groups had copied
    assert [a.success for a in ctrl.poll()] == [False]
    assert allocator_state(cache) == before


def test_close_fails_queued_ops_and_refuses_more(gen):
    cache = make("dsv4")
    ctrl = cache.controller
    fill_random(cache, gen)
    before = allocator_state(cache)
    kv, extra = alloc_device(cache)
    after_alloc = allocator_state(cache)
    assert ctrl.write(kv, extra) is not None
    cache.close()
    cache.close()  # idempotent
    acks = ctrl.poll()
    assert [a.success for a in acks] == [False] and "closed" in acks[0].error
    assert allocator_state(cache) == after_alloc != before  # host slots of the op came back
    for call in (lambda: ctrl.write(kv, extra), ctrl.start_writing, ctrl.start_loading,
                 lambda: ctrl.load(torch.arange(256))):
        with pytest.raises(RuntimeError, match="closed"):
            call()


def test_host_pages_written_elsewhere_load_once_marked(gen):
    # The storage tier reads pages straight into host slots: the controller did not write
    # them, so they load only after mark_host_written, and then byte for byte.
    cache = make("dsv4")
    fill_random(cache, gen)
    ctrl, host = cache.controller, cache.host_group.pools
    kv_host, swa_host = host["kv"].alloc(2 * 256), host["swa"].alloc(128)
    own = {"kv": kv_host, "swa": swa_host}
    for name, rows in cache.stack.derive_rows(own).items():  # "read from storage": random bytes
        for layer in range(cache.stack.pool(name).num_layers):
            view = host[name].buffer[rows, layer] if host[name].layout == "page_first" else host[name].buffer[layer, rows]
            view.copy_(torch.randint(0, 256, view.shape, dtype=torch.uint8, generator=gen))
    with pytest.raises(ValueError, match="never written"):
        ctrl.load(kv_host, {"swa": swa_host})
    # 1. refused when a slot is not allocated: nothing is marked
    stray = host["kv"].alloc(256)
    host["kv"].free(stray)
    with pytest.raises(ValueError, match=r"host_indices \(pool 'kv'\): slots that are not allocated"):
        ctrl.mark_host_written(torch.cat([kv_host, stray]), {"swa": swa_host})
    with pytest.raises(ValueError, match="never written"):
        ctrl.load(kv_host, {"swa": swa_host})
    # 2. marked: the load moves exactly those bytes into every data pool
    ctrl.mark_host_written(kv_host, {"swa": swa_host})
    dev = ctrl.load(kv_host, {"swa": swa_host})
    ctrl.start_loading()
    assert [a.success for a in ctrl.poll()] == [True]
    for name, rows in cache.stack.derive_rows(own).items():
        dev_rows = cache.stack.derive_rows({k: dev[k] for k in own})[name]
        for layer, views in enumerate(cache.device_pools[name].row_views()):
            got = torch.cat([v.index_select(0, dev_rows).reshape(len(dev_rows), -1) for v in views], dim=1)
            want = (host[name].buffer[rows, layer] if host[name].layout == "page_first"
                    else host[name].buffer[layer, rows])
            assert torch.equal(got, want), name
    # 3. freed and allocated again: stale, refused like any stale host page
    host["kv"].free(kv_host)
    assert torch.equal(host["kv"].alloc(kv_host.numel()), kv_host)
    with pytest.raises(ValueError, match="allocated again"):
        ctrl.load(kv_host, {"swa": swa_host})
