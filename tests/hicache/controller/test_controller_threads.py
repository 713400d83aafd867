"""One `HybridCacheController` driven by 2-8 threads at once (docs/DESIGN.md §12): each
thread backs up its own device pages, gets them back into fresh device slots, and checks
every byte of every pool; two controllers share one staged backend (its staging ring) too.
No timing: a race shows as wrong bytes, a lost ack or a broken allocator."""
from __future__ import annotations

import threading

import pytest
import torch

from tests.concurrent import run_threads
from tests.hicache.controller.test_controller import alloc_device, make, snapshot
from transfer_kernels import StagedBackend, TorchBackend, TritonBackend


class Acks:
    """The acks of one controller, whichever thread polled them."""

    def __init__(self, ctrl) -> None:
        self.ctrl, self.seen, self.lock = ctrl, {}, threading.Lock()

    def wait(self, op_id: int, start) -> bool:
        """Launch and poll until ``op_id`` is acked (CPU: its batch ends within the launch);
        True when it succeeded."""
        while True:
            with self.lock:
                if op_id in self.seen:
                    return self.seen.pop(op_id).success
            start()
            got = self.ctrl.poll()
            with self.lock:
                self.seen.update((a.op_id, a) for a in got)


def _fill(cache, own: dict, gen: torch.Generator) -> None:
    """Random bytes into the rows of ``own`` slots (this thread's) in every data pool."""
    for name, rows in cache.stack.derive_rows(own).items():
        for views in cache.device_pools[name].row_views():
            for v in views:
                v[rows] = torch.randint(0, 256, (rows.numel(), *v.shape[1:]), dtype=torch.uint8, generator=gen)


def _round_trips(cache, acks: Acks, seed: int, rounds: int, wrong: list) -> None:
    ctrl, gen = cache.controller, torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        kv, extra = alloc_device(cache, pages=1)
        own = {"kv": kv, **extra}
        _fill(cache, own, gen)
        want = snapshot(cache, own)
        with ctrl.mutex:  # the op and its id: one state
            host = ctrl.write(kv, extra)
            op = ctrl.last_op_id
        assert host is not None and acks.wait(op, ctrl.start_writing)
        for name, slots in own.items():  # evicted: the device slots go to others
            cache.device_pools[name].free(slots)
        with ctrl.mutex:
            dev = ctrl.load(host["kv"], {n: s for n, s in host.items() if n != "kv"})
            op = ctrl.last_op_id
        assert dev is not None and acks.wait(op, ctrl.start_loading)
        got = snapshot(cache, dev)
        wrong[0] += sum(not torch.equal(a, b) for n in want for la, lb in zip(want[n], got[n])
                        for a, b in zip(la, lb))
        for name, slots in dev.items():
            cache.device_pools[name].free(slots)
        for name, slots in host.items():
            cache.host_group.pools[name].free(slots)


def _run(caches, threads: int, rounds: int) -> int:
    wrong = [0]
    acks = {id(c): Acks(c.controller) for c in caches}

    def work(t: int) -> None:
        cache = caches[t % len(caches)]
        _round_trips(cache, acks[id(cache)], t, rounds, wrong)
    run_threads(threads, work)
    for cache in caches:
        assert cache.controller.pending() == 0
        cache.controller.check_integrity()
    return wrong[0]


@pytest.mark.parametrize("threads", [2, 8])
def test_one_controller_many_threads_round_trips_exact(threads):
    cache = make("dsv4", "page_first", TorchBackend(), device_pages=16)
    assert _run([cache], threads, 24 // threads) == 0
    stats = cache.controller.stats()
    assert stats["d2h"]["ops"] == stats["h2d"]["ops"] == threads * (24 // threads)


def test_two_controllers_on_one_staged_backend_from_four_threads():
    # Each controller serializes its own batches; the shared ring is held load by load.
    staged = StagedBackend(TorchBackend())
    caches = [make("dsv4", "page_first", staged, device_pages=8) for _ in range(2)]
    assert _run(caches, 4, 6) == 0
    assert staged.copies > 0


def test_one_controller_on_the_kernel_s_kept_buffers_from_four_threads():
    # The triton kernel keeps its index buffer from load to load (a held route): without
    # the controller's lock two threads' loads write each other's rows into it.
    cache = make("mla", "page_first", TritonBackend(), device_pages=8)
    assert _run([cache], 4, 2) == 0
