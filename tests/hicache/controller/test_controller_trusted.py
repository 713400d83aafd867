"""The trusted entry (the radix tree's own slots) and what internal hops still refuse."""
from __future__ import annotations

import pytest
import torch

from tests.hicache.controller.test_controller import (_equal, alloc_device, allocator_state, backup,
                                           fill_random, make, snapshot)


def test_trusted_round_trip_is_byte_exact(gen):
    cache = make("dsv4")
    ctrl = cache.controller
    # 1. random device bytes; a trusted backup of two pages and one SWA row
    fill_random(cache, gen)
    kv, extra = alloc_device(cache)
    expected = snapshot(cache, {"kv": kv, **extra})
    host = ctrl.write(kv, extra, trusted=True)
    op = ctrl.last_op_id
    ctrl.start_writing()
    assert [(a.op_id, a.success) for a in ctrl.poll()] == [(op, True)]
    # 2. the device is overwritten; a trusted load brings every pool back
    fill_random(cache, gen)
    dev = ctrl.load(host["kv"], {"swa": host["swa"]}, trusted=True)
    ctrl.start_loading()
    acks = ctrl.poll()
    assert [(a.direction, a.success, a.tokens["kv"]) for a in acks] == [("h2d", True, 512)]
    assert _equal(snapshot(cache, dev), expected)
    ctrl.check_integrity()


def test_trusted_write_of_extra_only_and_of_nothing(gen):
    cache = make("dsv4")
    ctrl = cache.controller
    _, extra = alloc_device(cache, pages=0)
    # an empty anchor with a snapshot moves the snapshot only
    host = ctrl.write(torch.empty(0, dtype=torch.int64), extra, trusted=True)
    assert set(host) == {"swa"}
    # nothing at all is still refused, and nothing changes
    before = allocator_state(cache)
    with pytest.raises(ValueError, match="nothing to transfer"):
        ctrl.write(torch.empty(0, dtype=torch.int64), None, trusted=True)
    assert allocator_state(cache) == before and ctrl.pending() == 1
    ctrl.start_writing()
    assert [a.success for a in ctrl.poll()] == [True]
    ctrl.check_integrity()


def test_server_allocator_handing_out_a_slot_twice_is_refused(gen):
    # A server-supplied device allocator is checked: a page twice in one call is refused
    # and everything it handed out goes back.
    cache = make("dsv4")
    fill_random(cache, gen)
    host = backup(cache, *alloc_device(cache))
    pools = cache.device_pools
    freed: list = []

    def twice(n):  # the same page twice
        slots = pools["kv"].alloc(n // 2)
        return None if slots is None else torch.cat([slots, slots])

    def free_kv(slots):
        freed.append(slots)
        return pools["kv"].free(slots[: slots.numel() // 2])

    ctrl = type(cache.controller)(pools, cache.host_group, cache.config, backend="torch",
                                  device_alloc={"kv": twice}, device_free={"kv": free_kv})
    ctrl.mark_host_written(host["kv"], {"swa": host["swa"]})  # the same, already backed-up pages
    before = allocator_state(cache)
    with pytest.raises(ValueError, match=r"device_alloc \(pool 'kv'\).*twice"):
        ctrl.load(host["kv"], {"swa": host["swa"]})
    assert allocator_state(cache) == before and ctrl.pending() == 0 and len(freed) == 1
    ctrl.check_integrity()


def test_destination_page_of_two_queued_ops_rolls_the_batch_back(gen):
    # A server frees the device slots of a queued load and the next load gets them again:
    # launching both would write one page twice. The batch is refused and rolled back.
    cache = make("dsv4")
    ctrl = cache.controller
    fill_random(cache, gen)
    host = backup(cache, *alloc_device(cache, pages=1))
    first = ctrl.load(host["kv"], {"swa": host["swa"]})
    cache.device_pools["kv"].free(first["kv"])  # the server's bug: freed while queued
    cache.device_pools["swa"].free(first["swa"])
    second = ctrl.load(host["kv"], {"swa": host["swa"]})
    assert torch.equal(first["kv"], second["kv"])
    assert ctrl.start_loading() is None
    acks = ctrl.poll()
    assert [a.success for a in acks] == [False, False]
    assert "belongs to two ops of one batch" in acks[0].error
    # the rollback freed the second op's slots; freeing the first's again was refused
    assert "double free" in acks[0].error
    ctrl.check_integrity()
