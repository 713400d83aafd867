"""The controller's transfer paths on CPU: the DMA (staged) path, load launch groups, the
caller's buffers, rollback of the production launches."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.controller.groups import LoadGrouper
from hicache.models import preset
from tests.hicache.controller.test_controller import (STACKS, _equal, alloc_device, allocator_state, backup,
                                           fill_random, make, snapshot)
from tests.hicache.controller.rollback import arm_later_group
from transfer_kernels import FaultyBackend, NullBackend, StagedBackend, TorchBackend, TritonBackend


def _stored(cache, gen, pages: int = 2):
    """Random device bytes, ``pages`` pages (+ one SWA row) backed up, device overwritten;
    returns the host slots and the expected bytes."""
    fill_random(cache, gen)
    kv, extra = alloc_device(cache, pages=pages)
    expected = snapshot(cache, {"kv": kv, **extra})
    host = backup(cache, kv, extra)
    cache.device_pools["kv"].free(kv)
    for name, s in extra.items():
        cache.device_pools[name].free(s)
    fill_random(cache, gen)
    return host, expected


def _load(cache, host) -> dict:
    ctrl = cache.controller
    dev = ctrl.load(host["kv"], {k: v for k, v in host.items() if k == "swa"})
    assert ctrl.start_loading() is not None
    assert [a.success for a in ctrl.poll()] == [True]
    return dev


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("stack_name", list(STACKS))
def test_dma_round_trip_is_byte_exact(stack_name, layout, gen):
    # 1. back up through the staged path (gather, then whole pages out), 2. overwrite the
    # device, 3. load back (whole pages in, then scatter): every pool byte for byte;
    # layer_first hosts stage only their 1-layer pools, the rest go through the kernel.
    staged = StagedBackend(TorchBackend())
    cache = make(stack_name, layout, staged)
    host, expected = _stored(cache, gen)
    host_before = [p.buffer.clone() for p in cache.host_group.pools.values() if p.buffer is not None]
    dev = _load(cache, host)
    assert _equal(snapshot(cache, dev), expected)
    assert all(torch.equal(a, p.buffer) for a, p in
               zip(host_before, [p for p in cache.host_group.pools.values() if p.buffer is not None]))
    if layout == "page_first":  # one DMA per direction and batch (layer_first: 1-layer pools only)
        assert staged.copies == 2
    cache.controller.check_integrity()


def test_dma_with_the_triton_scatter(gen):
    # The production pairing: the interpreted dense kernel scatters the staged pages.
    cache = make("dsv4", "page_first", StagedBackend(TritonBackend()), device_pages=3)
    host, expected = _stored(cache, gen, pages=2)
    assert _equal(snapshot(cache, _load(cache, host)), expected)


def test_back_to_back_loads_reuse_the_staging(gen):
    # Three loads of the same shape (other pages each), started one after another with no
    # poll between: one staging ring serves all three, each byte for byte.
    staged = StagedBackend(TorchBackend())
    cache = make("dsv4", "page_first", staged, device_pages=8)
    ctrl = cache.controller
    stored = [_stored(cache, gen, pages=1) for _ in range(3)]
    devs = []
    for host, _ in stored:
        devs.append(ctrl.load(host["kv"], {"swa": host["swa"]}))
        assert ctrl.start_loading() is not None
    assert [a.success for a in ctrl.poll()] == [True] * 3
    for dev, (_, expected) in zip(devs, stored):
        assert _equal(snapshot(cache, dev), expected)
    # one ring per direction (the backups staged too), allocated once
    bases = [ring.base() for ring in staged._rings.values()]
    assert staged.held_bytes == 2 * staged.max_staging_bytes and len(bases) == 2
    devs.append(_load(cache, stored[0][0]))  # a fourth: nothing new allocated
    assert [ring.base() for ring in staged._rings.values()] == bases


@pytest.mark.parametrize("which", ["first", "last"])
def test_dma_rollback_frees_and_retry_succeeds(gen, which):
    # The staged backend's own prepared launches, one of which fails (the first group, or
    # the last after the others copied): the load is rolled back (its device slots free
    # again), and the retry is byte-exact.
    faulty = FaultyBackend(StagedBackend(TorchBackend()), fail_on_launch=10 ** 9)
    cache = make("dsv4", "page_first", faulty)
    ctrl = cache.controller
    ctrl.load_groups.min_bytes = 0  # one launch group per layer: 4 groups
    host, expected = _stored(cache, gen)
    before = allocator_state(cache)
    arm_later_group(ctrl, faulty, host["kv"], {"swa": host["swa"]}, min_groups=4)
    if which == "first":
        faulty.fail_on_launch = faulty.attempts + 1
    assert ctrl.load(host["kv"], {"swa": host["swa"]}) is not None
    assert ctrl.start_loading() is None
    assert ctrl.rolled_back_ops() == {ctrl.last_op_id}  # CPU: freed at once
    acks = ctrl.poll()
    assert [a.success for a in acks] == [False] and "injected" in acks[0].error
    assert allocator_state(cache) == before
    assert _equal(snapshot(cache, _load(cache, host)), expected)
    ctrl.check_integrity()


def test_caller_reusing_its_buffer_after_load_changes_nothing(gen):
    # A server that reuses its index buffer between load() and start_loading(): the
    # controller copied it at the edge, so the pages land in the order it asked for.
    cache = make("dsv4", "page_first", "torch", device_pages=8)
    host, expected = _stored(cache, gen, pages=4)
    mine = host["kv"].clone()
    dev = cache.controller.load(mine, {"swa": host["swa"]})
    mine.copy_(mine.flip(0))  # pages now in reverse order
    cache.controller.start_loading()
    assert [a.success for a in cache.controller.poll()] == [True]
    assert _equal(snapshot(cache, dev), expected)


def test_caller_numpy_array_is_copied_too(gen):
    cache = make("mha_fp8", "page_first", "torch", device_pages=8)
    host, expected = _stored(cache, gen, pages=3)
    mine = host["kv"].numpy().copy()
    dev = cache.controller.load(mine)
    mine[:] = mine[::-1].copy()
    cache.controller.start_loading()
    assert [a.success for a in cache.controller.poll()] == [True]
    assert _equal(snapshot(cache, dev), expected)


def test_load_groups_bound_what_a_layer_waits_for():
    # DeepSeek-V4-Pro, 16 pages: consecutive layers grouped until >= 1 MiB each; every
    # layer in exactly one group, in order; a group holds < min_bytes + one layer's bytes.
    stack = preset("deepseek-v4-pro")
    pools = tuple(p.name for p in stack.data_pools())
    rows = tuple(16 * stack.page_size // stack.pool(p).tokens_per_row if stack.root_of(p).name == "kv"
                 else 1 for p in pools)
    grouper = LoadGrouper(stack, 1 << 20)
    got = grouper.groups(pools, rows)
    assert grouper.groups(pools, rows) == got  # a function of the pools and row counts
    bounds = np.asarray(got.layers)
    assert bounds[0] == 0 and bounds[-1] == stack.num_model_layers and (np.diff(bounds) > 0).all()
    per_layer = grouper._per_layer_bytes(pools) @ np.asarray(rows)
    group_bytes = np.add.reduceat(per_layer, bounds[:-1])
    assert (group_bytes[:-1] >= 1 << 20).all()
    assert (group_bytes < (1 << 20) + per_layer.max()).all()
    assert len(got.groups) < stack.num_model_layers // 2  # far fewer launches than layers
    # every (job, layer) pair of a group belongs to one of the group's model layers
    for g, pairs in enumerate(got.groups):
        layers = {stack.pool(pools[j]).layer_ids[local] for j, local in pairs}
        assert layers <= set(range(bounds[g], bounds[g + 1]))
    assert sum(map(len, got.groups)) == sum(stack.pool(p).num_layers for p in pools)
    per = LoadGrouper(stack, 0).groups(pools, rows)  # 0: one group per model layer
    assert per.layers == tuple(range(stack.num_model_layers + 1))


def test_load_launches_one_per_group_without_per_layer_work(gen):
    # The controller launches each group once (NullBackend counts launches).
    null = NullBackend()
    cache = make("dsv4", "page_first", null, device_pages=8)
    host, _ = _stored(cache, gen, pages=2)
    cache.controller.load_groups.min_bytes = 1 << 30  # everything in one group
    before = null.launches
    _load(cache, host)
    assert null.launches - before == 1


def test_caller_editing_the_returned_dict_changes_nothing_queued(gen):
    # write / load / write_many hand a server a copy of the op's destination dict (a trusted
    # caller gets the op's own): a server that clears or rebinds it before the launch
    # changes nothing queued; the bytes still land byte-exact where the op said.
    cache = make("dsv4", "page_first", "torch", device_pages=8)
    ctrl = cache.controller
    fill_random(cache, gen)
    kv, extra = alloc_device(cache, pages=2)
    expected = snapshot(cache, {"kv": kv, **extra})
    host = ctrl.write(kv, extra)
    kept = {k: v.clone() for k, v in host.items()}
    host.clear()
    many = ctrl.write_many([(kv, None)])
    many[0]["kv"] = torch.empty(0, dtype=torch.int64)
    ctrl.start_writing()
    assert [a.success for a in ctrl.poll()] == [True, True]
    fill_random(cache, gen)
    dev = ctrl.load(kept["kv"], {"swa": kept["swa"]})
    mine = dict(dev)
    dev.pop("kv")
    ctrl.start_loading()
    assert [a.success for a in ctrl.poll()] == [True]
    assert _equal(snapshot(cache, mine), expected)
    ctrl.check_integrity()
