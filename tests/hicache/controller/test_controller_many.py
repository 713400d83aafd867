"""``load_many`` / ``write_many``: several ops queued by one call, one allocator call per
pool, all or nothing (shortfall, bad request, a raising allocator), byte-exact, and the
same rollback as single ops when a later launch group fails."""
from __future__ import annotations

import pytest
import torch

from tests.hicache.controller.rollback import arm_later_group
from tests.hicache.controller.test_controller import (_equal, alloc_device, allocator_state, backup, fill_random,
                                           make, snapshot)
from transfer_kernels import FaultyBackend


class Boom(RuntimeError):
    pass


def _stored(cache, gen, ops: int):
    """``ops`` backed-up (1 page + 1 SWA row) prefixes: their load requests and bytes."""
    fill_random(cache, gen)
    reqs, expected = [], []
    for _ in range(ops):
        kv, extra = alloc_device(cache, pages=1)
        expected.append(snapshot(cache, {"kv": kv, **extra}))
        host = backup(cache, kv, extra)
        reqs.append((host["kv"], {"swa": host["swa"]}))
        cache.device_pools["kv"].free(kv)
        cache.device_pools["swa"].free(extra["swa"])
    fill_random(cache, gen)
    return reqs, expected


def _load_and_check(cache, devs: list, expected: list) -> list:
    """Start the queued loads; every op acked, its device rows byte-exact; the acks."""
    ctrl = cache.controller
    assert ctrl.start_loading() is not None
    acks = ctrl.poll()
    assert [a.success for a in acks] == [True] * len(devs)
    for dev, want in zip(devs, expected):
        assert _equal(snapshot(cache, dev), want)
    ctrl.check_integrity()
    return acks


def test_load_many_is_byte_exact_with_one_allocation_per_pool(gen, monkeypatch):
    cache = make("dsv4", "page_first", "torch", device_pages=8)
    ctrl = cache.controller
    reqs, expected = _stored(cache, gen, ops=3)
    calls = {"kv": 0, "swa": 0}
    for name in calls:
        alloc = cache.device_pools[name].allocator
        real = alloc.alloc_pages
        monkeypatch.setattr(alloc, "alloc_pages",
                            lambda n, _r=real, _p=name: (calls.__setitem__(_p, calls[_p] + 1), _r(n))[1])
    got = ctrl.load_many(reqs)
    assert calls == {"kv": 1, "swa": 1}
    last = ctrl.last_op_id
    acks = _load_and_check(cache, got, expected)
    assert [a.op_id for a in acks] == [last - 2, last - 1, last]  # consecutive ids, in order
    assert [a.tokens["kv"] for a in acks] == [256] * 3


def test_write_many_backs_up_and_loads_back(gen):
    cache = make("dsv4", "layer_first", "torch", device_pages=8)
    ctrl = cache.controller
    fill_random(cache, gen)
    ops = [alloc_device(cache, pages=1), (alloc_device(cache, pages=2, swa_rows=0)[0], {})]
    expected = [snapshot(cache, {"kv": kv, **extra}) for kv, extra in ops]
    hosts = ctrl.write_many([(kv, extra or None) for kv, extra in ops])
    ctrl.start_writing()
    assert [a.success for a in ctrl.poll()] == [True, True]
    for kv, extra in ops:
        cache.device_pools["kv"].free(kv)
        for name, s in extra.items():
            cache.device_pools[name].free(s)
    fill_random(cache, gen)
    devs = ctrl.load_many([(h["kv"], {k: v for k, v in h.items() if k != "kv"}) for h in hosts])
    _load_and_check(cache, devs, expected)


def test_a_shortfall_or_a_bad_request_changes_nothing(gen):
    cache = make("dsv4", "page_first", "torch", device_pages=4)
    ctrl = cache.controller
    reqs, _ = _stored(cache, gen, ops=3)
    held = cache.device_pools["kv"].alloc(2 * 256)  # 2 of 4 device pages free: 3 do not fit
    before = allocator_state(cache)
    assert ctrl.load_many(reqs) is None
    assert allocator_state(cache) == before and ctrl.pending() == 0
    cache.device_pools["kv"].free(held)
    with pytest.raises(ValueError, match=r"requests\[1\]: host_indices"):
        ctrl.load_many([reqs[0], (reqs[1][0][:100], None)])  # not whole pages
    with pytest.raises(TypeError, match=r"requests\[0\]"):
        ctrl.load_many([reqs[0][0]])
    assert ctrl.load_many([]) == []
    assert ctrl.pending() == 0
    ctrl.check_integrity()


@pytest.mark.parametrize("many", [False, True])
def test_an_allocator_that_raises_gives_back_what_the_others_took(gen, monkeypatch, many):
    cache = make("dsv4", "page_first", "torch", device_pages=8)
    ctrl = cache.controller
    reqs, _ = _stored(cache, gen, ops=2)
    before = allocator_state(cache)
    alloc = cache.device_pools["swa"].allocator
    for method in ("alloc_pages", "alloc_page_slots"):  # one op takes its pages and slots in one call
        monkeypatch.setattr(alloc, method, lambda n: (_ for _ in ()).throw(Boom("swa is down")))
    with pytest.raises(Boom):  # kv was taken first: given back
        ctrl.load_many(reqs) if many else ctrl.load(*reqs[0])
    assert allocator_state(cache) == before and ctrl.pending() == 0
    monkeypatch.undo()
    ctrl.check_integrity()


def test_a_server_allocator_going_short_mid_way_undoes_the_queued_ops(gen):
    cache = make("dsv4", "page_first", "torch", device_pages=8)
    reqs, _ = _stored(cache, gen, ops=3)
    pools, left = cache.device_pools, [2]

    def kv_alloc(n):  # the server's kv allocator serves two ops, then is short
        left[0] -= 1
        return pools["kv"].alloc(n) if left[0] >= 0 else None
    ctrl = type(cache.controller)(pools, cache.host_group, cache.config, backend="torch",
                                  device_alloc={"kv": kv_alloc}, device_free={"kv": pools["kv"].free})
    for anchor, extra in reqs:  # the same, already backed-up pages
        ctrl.mark_host_written(anchor, extra)
    before, last = allocator_state(cache), ctrl.last_op_id
    assert ctrl.load_many(reqs) is None
    assert allocator_state(cache) == before and ctrl.pending() == 0
    assert ctrl.last_op_id == last
    ctrl.check_integrity()


def test_a_later_group_failing_rolls_back_every_op(gen):
    faulty = FaultyBackend("torch", fail_on_launch=10 ** 9)
    cache = make("dsv4", "page_first", faulty, device_pages=8)
    ctrl = cache.controller
    reqs, _ = _stored(cache, gen, ops=3)
    before = allocator_state(cache)
    ctrl.load_groups.min_bytes = 0  # one group per layer: the last of 4 raises
    arm_later_group(ctrl, faulty, torch.cat([r[0] for r in reqs]),
                    {"swa": torch.cat([r[1]["swa"] for r in reqs])}, min_groups=4)
    assert ctrl.load_many(reqs) is not None
    assert ctrl.start_loading() is None
    acks = ctrl.poll()
    assert [a.success for a in acks] == [False] * 3 and "injected" in acks[0].error
    assert allocator_state(cache) == before
    ctrl.check_integrity()


def test_acks_of_ops_of_one_shape_have_their_own_volume_dicts(gen):
    # the batch computes one shape's volume once; every ack still gets dicts of its own
    cache = make("dsv4")
    reqs, _ = _stored(cache, gen, 3)
    ctrl = cache.controller
    assert ctrl.load_many(reqs) is not None
    ctrl.start_loading()
    acks = ctrl.poll()
    assert [a.success for a in acks] == [True] * 3
    assert acks[0].tokens == acks[2].tokens and acks[0].bytes == acks[2].bytes
    acks[0].tokens["kv"] = -1
    acks[0].bytes.clear()
    assert acks[1].tokens["kv"] == acks[2].tokens["kv"] == 256 and acks[1].bytes == acks[2].bytes != {}
    assert ctrl.stats()["h2d"]["tokens"]["kv"] == 3 * 256
