"""``transfer_kernels`` from several threads at once (issue 37 item 1): every public entry
point, byte-checked. Each thread copies between its own random tables through ONE shared
backend (or a name), checking every call against the reference: moved rows, untouched
rows and the source. CPU: the torch and staged paths (the Triton interpreter is serialized
by the library; its tests stay small elsewhere). No timing: a race shows as wrong bytes,
and one case stops a load where a shared ring would lose its bytes (the defect on every run).

Before the fix (06b6e45): a named ``"dma"`` from two threads 30 of 60 calls wrong, one
``StagedBackend(kernel=TorchBackend())`` 43 of 300, one staging ``AutoBackend`` 34 of 60.
"""
from __future__ import annotations

import gc
import threading
from typing import Callable

import pytest
import torch

from tests.concurrent import run_threads
from tests.transfer_kernels.pools import assert_copied, make_pool, snapshot
from transfer_kernels import (AutoBackend, CopyEngineBackend, CopyJob, StagedBackend, TorchBackend,
                              TritonBackend, copy_rows, copy_rows_batch, get_backend, make_plan)
from transfer_kernels.backends.auto_table import AutoTable, Rule
from transfer_kernels.cuda import runtime

MIXED = [((8,), torch.bfloat16), ((3, 4), torch.float32), ((5,), torch.uint8)]
ROWS = 48


def _staging_auto() -> AutoBackend:
    """``auto`` whose table stages every page_first pool (as on a GPU), scattering with
    torch; the other pools go to the kernel (torch here too)."""
    table = AutoTable(rules=(Rule("cpu", "dma", path="stage"), Rule("cpu", "torch")))
    auto = AutoBackend(torch_ref=TorchBackend(), table=table)
    auto.inner["dma"].kernel = TorchBackend()
    return auto


SHARED: dict[str, Callable] = {
    "torch": TorchBackend, "copy_engine": CopyEngineBackend,
    "dma-torch": lambda: StagedBackend(TorchBackend()), "auto-staging": _staging_auto,
}


def _hammer(threads: int, calls: int, backend_of: Callable[[int], object], batch: bool = False,
            seed: int = 0) -> tuple[int, int]:
    """``threads`` threads, each ``calls`` byte-checked copies between its own tables (one
    page_first pool, one layer_first; both directions; alternating single and batched
    calls when ``batch``); returns (wrong calls, calls)."""
    wrong, done, lock = [0], [0], threading.Lock()

    def work(t: int) -> None:
        g = torch.Generator().manual_seed(seed * 100 + t)
        pools = [make_pool(g, 3, ROWS, MIXED, layout, device="cpu", pin=False)
                 for layout in ("page_first", "layer_first")]
        backend = backend_of(t)
        for i in range(calls):
            ok = _one_call(g, pools, backend, batch and i % 2 == 1, i)
            with lock:
                wrong[0] += not ok
                done[0] += 1
    run_threads(threads, work, switch_s=1e-5)
    return wrong[0], done[0]


def _one_call(g: torch.Generator, pools, backend, batched: bool, i: int) -> bool:
    """One copy (or a batch of a load and a backup) with random rows, checked."""
    n = int(torch.randint(1, ROWS // 2, (1,), generator=g))
    jobs = []
    for k, pool in enumerate(pools if batched else pools[i % 2:i % 2 + 1]):
        h2d = (i + k) % 2 == 0
        src, dst = (pool.host_table, pool.device_table) if h2d else (pool.device_table, pool.host_table)
        rows = torch.randperm(ROWS, generator=g)
        jobs.append(CopyJob(src, dst, rows[:n], rows[ROWS - n:]))
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
    if batched:
        copy_rows_batch(jobs, backend=backend)
    else:
        copy_rows(jobs[0].src, jobs[0].dst, jobs[0].src_rows, jobs[0].dst_rows, backend=backend)
    try:
        for job, (sb, db) in zip(jobs, befores):
            assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)
    except AssertionError:
        return False
    return True


def test_a_name_builds_its_own_backend_and_two_threads_copy_exact_bytes(monkeypatch):
    # Case 1: copy_rows(..., backend="dma") from two threads. A name was a process-wide
    # instance, so both threads staged through ONE ring. The scatter runs on torch here
    # (the named "dma" kernel is triton, interpreted on the CPU).
    from transfer_kernels.backends import triton
    monkeypatch.setattr(triton, "TritonBackend", TorchBackend)
    assert _hammer(2, 30, lambda t: "dma") == (0, 60)
    assert get_backend("dma") is not get_backend("dma")


@pytest.mark.parametrize("threads", [2, 8])
def test_one_staged_backend_shared_by_threads(threads):
    # Case 2: one StagedBackend(kernel=TorchBackend()) used by every thread: a load's
    # DMA and its scatter never see another load's bytes in the ring.
    staged = StagedBackend(TorchBackend())
    calls = 100 if threads == 2 else 20
    assert _hammer(threads, calls, lambda t: staged) == (0, threads * calls)
    assert staged.copies > 0


def test_one_staging_auto_backend_shared_by_two_threads():
    # Case 3: one AutoBackend whose table stages page_first pools.
    auto = _staging_auto()
    assert _hammer(2, 30, lambda t: auto) == (0, 60)
    assert auto.inner["dma"].copies > 0


@pytest.mark.parametrize("name", list(SHARED))
def test_every_backend_shared_by_four_threads_single_and_batched(name):
    # Batches of a load and a backup (both rings of a staged backend claimed by one load).
    backend = SHARED[name]()
    assert _hammer(4, 10, lambda t: backend, batch=True, seed=1) == (0, 40)


def test_launch_counts_are_exact_under_threads():
    backend = TorchBackend()
    _hammer(4, 10, lambda t: backend, seed=2)
    assert backend.launches == 40


def test_a_load_launched_group_by_group_holds_its_ring_against_other_threads():
    # One thread launches a 3-group staged load one group at a time while another runs
    # whole loads on the same backend: the ring is the first load's until its last group.
    staged = StagedBackend(TorchBackend())
    g = torch.Generator().manual_seed(5)
    pool = make_pool(g, 3, ROWS, MIXED, "page_first", device="cpu", pin=False)
    src_rows, dst_rows = [4, 9, 1, 30], [0, 2, 40, 7]
    plan = make_plan([CopyJob(pool.host_table, pool.device_table, src_rows, dst_rows)])
    before = snapshot(pool.host_table), snapshot(pool.device_table)
    launches = staged.prepare(plan, [[(0, 0)], [(0, 1)], [(0, 2)]])
    launches.launch(0)  # holds the ring from here
    got = []
    other = threading.Thread(target=lambda: got.append(_hammer(1, 4, lambda t: staged)))
    other.start()
    launches.launch(1)
    launches.launch(2)  # the last group: the ring is released
    other.join()
    assert got == [(0, 4)]
    assert_copied(pool.host_table, pool.device_table, *before, src_rows, dst_rows)


def test_an_abandoned_load_gives_its_ring_back_when_dropped():
    staged = StagedBackend(TorchBackend())
    g = torch.Generator().manual_seed(6)
    pool = make_pool(g, 3, ROWS, MIXED, "page_first", device="cpu", pin=False)
    plan = make_plan([CopyJob(pool.host_table, pool.device_table, [1, 2], [3, 4])])
    launches = staged.prepare(plan, [[(0, 0)], [(0, 1), (0, 2)]])
    launches.launch(0)  # never launches group 1
    del launches
    gc.collect()
    assert _hammer(2, 4, lambda t: staged, seed=3) == (0, 8)  # no thread waits for it


def _two_jobs(g: torch.Generator, direction: str, n: int, device: str) -> tuple[list, list]:
    """Two page_first pools' jobs of ``n`` random rows in ``direction``, and each one's
    (source, destination) before the copy."""
    jobs, befores = [], []
    for _ in range(2):
        pool = make_pool(g, 3, ROWS, MIXED, "page_first", device=device, pin=device == "cuda")
        src, dst = ((pool.host_table, pool.device_table) if direction == "h2d"
                    else (pool.device_table, pool.host_table))
        rows = torch.randperm(ROWS, generator=g)
        jobs.append(CopyJob(src, dst, rows[:n], rows[ROWS - n:]))
        befores.append((snapshot(src), snapshot(dst)))
    return jobs, befores


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_a_load_stopped_while_the_ring_holds_its_bytes_loses_none(monkeypatch, direction):
    # No race to win: load A of one StagedBackend stops where a shared ring holds its bytes
    # (H2D: after its DMA into the ring, before its scatter; D2H: after its gather, before
    # its DMA out) and load B of another thread, same backend, runs until it ends or waits
    # on the ring's condition. Before the fix B always ended, its bytes over A's in the
    # ring: A's copy was wrong on every run (docs/RESULTS.md: the figures).
    staged = StagedBackend(TorchBackend())
    jobs, befores = _two_jobs(torch.Generator().manual_seed(11), direction, 16, "cpu")
    a, b_stopped, b_thread, issue = threading.get_ident(), threading.Event(), [], runtime.DmaQueue.issue

    class Noting(threading.Condition):
        def wait(self, timeout=None) -> bool:
            b_stopped.set()  # B waits for the ring: A may go on
            return super().wait(timeout)

    def run_b() -> None:
        try:
            copy_rows(jobs[1].src, jobs[1].dst, jobs[1].src_rows, jobs[1].dst_rows, backend=staged)
        finally:
            b_stopped.set()

    def stopping_issue(queue, ring, pieces, caller) -> None:
        if direction == "h2d":
            issue(queue, ring, pieces, caller)
        if threading.get_ident() == a and not b_thread:  # A, its bytes in the ring: B runs
            ring.cond = Noting(threading.RLock())  # nobody waits on the ring yet
            b_thread.append(threading.Thread(target=run_b))
            b_thread[0].start()
            assert b_stopped.wait(60), "load B neither ended nor waited for the ring"
        if direction == "d2h":
            issue(queue, ring, pieces, caller)
    monkeypatch.setattr(runtime.DmaQueue, "issue", stopping_issue)
    copy_rows(jobs[0].src, jobs[0].dst, jobs[0].src_rows, jobs[0].dst_rows, backend=staged)
    b_thread[0].join()
    for job, (sb, db) in zip(jobs, befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_cuda_a_ring_reused_from_another_stream_waits_for_the_last_kernel(direction):
    # One ring, two streams: load A's stream is held by a sleep, so its DMA and kernel run
    # late; load B starts on another stream right after A's launches were enqueued. B's
    # first DMA (H2D) or gather (D2H) overwrites the ring: it must wait for A's kernel
    # (the ``free`` event A recorded after it), else A reads B's bytes or the reverse.
    staged = StagedBackend(TritonBackend())
    jobs, befores = _two_jobs(torch.Generator().manual_seed(9), direction, 12, "cuda")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for job, stream, hold in zip(jobs, streams, (True, False)):
        with torch.cuda.stream(stream):
            if hold:
                torch.cuda._sleep(50_000_000)
            copy_rows(job.src, job.dst, job.src_rows, job.dst_rows, backend=staged)
    for stream in streams:
        stream.synchronize()
    for job, (sb, db) in zip(jobs, befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)


@pytest.mark.gpu
def test_cuda_threads_on_their_own_streams_share_one_staged_backend():
    staged = StagedBackend(TritonBackend())
    wrong = [0]

    def work(t: int) -> None:
        g = torch.Generator().manual_seed(t)
        pool = make_pool(g, 3, ROWS, MIXED, "page_first", device="cuda", pin=True)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for i in range(20):
                h2d = i % 2 == 0
                src, dst = ((pool.host_table, pool.device_table) if h2d
                            else (pool.device_table, pool.host_table))
                rows = torch.randperm(ROWS, generator=g)
                before = snapshot(src), snapshot(dst)
                if i % 5 == 0:
                    torch.cuda._sleep(5_000_000)  # this stream late: the ring's next user waits
                copy_rows(src, dst, rows[:16], rows[ROWS - 16:], backend=staged)
                stream.synchronize()
                try:
                    assert_copied(src, dst, *before, rows[:16], rows[ROWS - 16:])
                except AssertionError:
                    wrong[0] += 1
    run_threads(4, work)
    assert wrong[0] == 0 and staged.copies > 0
