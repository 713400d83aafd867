"""The dma backend behind the controller (CPU): every pool geometry byte for byte with
several launch groups and chunks, rollback when any group (or any DMA) fails, and the
calls a 16-page DeepSeek-V4-Pro load makes per launch group (issue 21 item 3)."""
from __future__ import annotations

import pytest

from hicache import HiCacheConfig, build
from hicache.models import preset
from tests.hicache.controller.test_controller import BIG, STACKS, _equal, allocator_state, make, snapshot
from tests.hicache.controller.test_controller_transfers import _load, _stored
from transfer_kernels import FaultyBackend, NullBackend, StagedBackend, TorchBackend, tuning
from transfer_kernels.cuda.runtime import DmaQueue
from transfer_kernels.cuda import runtime


def _per_layer(cache) -> int:
    """One launch group per model layer; returns how many a load has."""
    cache.controller.load_groups.min_bytes = 0
    return cache.stack.num_model_layers


@pytest.mark.parametrize("piece", [1, None])  # 1: a chunk per layer; None: the tuned size
@pytest.mark.parametrize("stack_name", list(STACKS))
def test_every_geometry_round_trips_through_per_group_dma(stack_name, piece, gen, monkeypatch):
    if piece is not None:
        monkeypatch.setattr(tuning, "DMA_PIECE_BYTES", piece)
    staged = StagedBackend(TorchBackend())
    cache = make(stack_name, "page_first", staged, device_pages=8)
    groups = _per_layer(cache)
    host, expected = _stored(cache, gen, pages=3)
    host_before = {n: p.buffer.clone() for n, p in cache.host_group.pools.items()
                   if p.buffer is not None}
    copies = staged.copies
    dev = _load(cache, host)
    assert _equal(snapshot(cache, dev), expected)
    for name, before in host_before.items():  # the source is unchanged
        assert before.equal(cache.host_group.pools[name].buffer)
    assert 1 <= staged.copies - copies <= groups  # at most one DMA call per group
    cache.controller.check_integrity()


def _rollback_then_retry(cache, gen, arm) -> None:
    """A load whose failure ``arm()`` injects is rolled back; the retry is byte-exact."""
    ctrl = cache.controller
    host, expected = _stored(cache, gen, pages=2)
    before = allocator_state(cache)
    arm()
    assert ctrl.load(host["kv"], {"swa": host["swa"]}) is not None
    assert ctrl.start_loading() is None
    acks = ctrl.poll()
    assert [a.success for a in acks] == [False] and "injected" in acks[0].error
    assert allocator_state(cache) == before
    assert _equal(snapshot(cache, _load(cache, host)), expected)
    ctrl.check_integrity()


@pytest.mark.parametrize("fail_on", [1, 2, 3, 4])
def test_rollback_when_any_group_fails(gen, fail_on):
    faulty = FaultyBackend(StagedBackend(TorchBackend()), fail_on_launch=10 ** 9)
    cache = make("dsv4", "page_first", faulty)
    assert _per_layer(cache) == 4

    def arm():
        faulty.fail_on_launch = faulty.attempts + fail_on
    _rollback_then_retry(cache, gen, arm)


@pytest.mark.parametrize("fail_on", [1, 2, 3])
def test_rollback_when_any_dma_fails(gen, monkeypatch, fail_on):
    # The runtime call itself raises on the k-th DMA of the load (later groups' DMA too).
    monkeypatch.setattr(tuning, "DMA_PIECE_BYTES", 1)  # a chunk per layer: a DMA per group
    staged = StagedBackend(TorchBackend())
    cache = make("dsv4", "page_first", staged)
    _per_layer(cache)
    real, calls = DmaQueue.issue, {"left": 10 ** 9}

    def issue(*args):
        calls["left"] -= 1
        if calls["left"] == 0:
            raise RuntimeError("injected DMA fault")
        return real(*args)
    monkeypatch.setattr(DmaQueue, "issue", issue)

    def arm():
        calls["left"] = fail_on
    _rollback_then_retry(cache, gen, arm)


def per_group_calls(monkeypatch, staged: StagedBackend) -> list[tuple[int, ...]]:
    """A log filled from now on: per launch group (each ends with its layer event's
    ``runtime.record``, made on the CPU too), the (DMA calls, event records, stream waits,
    kernel launches) it issued; launches are seen at their hook, ``runtime.launch``."""
    log: list[tuple[int, ...]] = []
    launched = [0]
    last = [(staged.copies, staged.records, staged.waits, 0)]
    real_record, real_launch = runtime.record, runtime.launch

    def launch(launcher, group: int) -> None:
        launched[0] += 1
        real_launch(launcher, group)

    def record(event, stream) -> None:
        now = (staged.copies, staged.records, staged.waits, launched[0])
        log.append(tuple(b - a for a, b in zip(last[0], now)))
        last[0] = now
        real_record(event, stream)
    monkeypatch.setattr(runtime, "launch", launch)
    monkeypatch.setattr(runtime, "record", record)
    return log


def test_dsv4_pro_16_page_load_call_budget(monkeypatch):
    # All 61 layers x 6 data pools, 16 pages: per launch group at most ONE DMA call, one
    # event record, one stream wait and one kernel launch; the first group adds one record
    # and one wait that order the DMA stream after the caller's.
    stack = preset("deepseek-v4-pro")
    staged = StagedBackend(NullBackend())
    config = HiCacheConfig(mem_layout="page_first", io_backend="torch", hicache_ratio=2.0,
                           swa_full_tokens_ratio=0.5)
    cache = build(stack, 34 * stack.page_size, config, device="cpu", budget=BIG, backend=staged)
    ctrl = cache.controller
    kv = cache.device_pools["kv"].alloc(16 * stack.page_size)
    host = ctrl.write(kv, {"swa": cache.device_pools["swa"].alloc(128)})
    ctrl.start_writing()
    assert [a.success for a in ctrl.poll()] == [True]
    log = per_group_calls(monkeypatch, staged)  # the load's groups, then the batch's own event
    assert ctrl.load(host["kv"], {"swa": host["swa"]}) is not None
    assert ctrl.start_loading() is not None
    assert [a.success for a in ctrl.poll()] == [True]
    assert log[-1] == (0, 1, 0, 0)  # the batch's ack event: after the last group, the ring freed
    log = log[:-1]
    assert len(log) >= 16  # ~1 MB launch groups
    assert log[0] == (1, 2, 2, 1)
    assert all(calls <= (1, 1, 1, 1) for calls in log[1:])
    assert sum(c[0] for c in log) == len(log)  # every group brings chunks of its own
