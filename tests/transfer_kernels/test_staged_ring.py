"""The dma backend's staging: a region per job (issue 23.1), only the grouped layers
(23.2), the per-group DMA pipeline and its call budget, the ring reused (issue 21.3). CPU."""
from __future__ import annotations

import pytest
import torch

from tests.transfer_kernels.pools import assert_copied, make_pool, snapshot
from transfer_kernels import (AutoBackend, CopyJob, StagedBackend, TorchBackend, TritonBackend,
                              copy_rows_batch, make_plan)
from transfer_kernels.backends.auto_table import AutoTable, Rule

MIXED = [((8,), torch.bfloat16), ((3, 4), torch.float32), ((5,), torch.uint8)]


def _pool(gen, layers=3, rows=12, buffers=MIXED):
    return make_pool(gen, layers, rows, buffers, "page_first", device="cpu", pin=False)


def _sides(pool, direction):
    return ((pool.host_table, pool.device_table) if direction == "h2d"
            else (pool.device_table, pool.host_table))


def _auto_staging(monkeypatch):
    """An AutoBackend that routes every job to its dma path, as it does on CUDA."""
    table = AutoTable(rules=(Rule("cpu", "dma", path="stage"),))
    auto = AutoBackend(triton=TritonBackend(), table=table)
    auto.inner["dma"].kernel = TorchBackend()
    return auto


@pytest.mark.parametrize("via", ["dma", "dma-triton", "auto"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_two_jobs_on_one_host_table_get_their_own_staging(gen, monkeypatch, direction, via):
    # Issue 23.1: host rows [0,1]->[4,5] and [7,8]->[9,10] of ONE pool in one call.
    pool = _pool(gen)
    src, dst = _sides(pool, direction)
    host_rows, dev_rows = ([0, 1], [7, 8]), ([4, 5], [9, 10])
    pairs = [(h, d) if direction == "h2d" else (d, h) for h, d in zip(host_rows, dev_rows)]
    jobs = [CopyJob(src, dst, s, d) for s, d in pairs]
    backend = {"dma": lambda: StagedBackend(TorchBackend()),
               "dma-triton": lambda: StagedBackend(TritonBackend()),
               "auto": lambda: _auto_staging(monkeypatch)}[via]()
    before = snapshot(src), snapshot(dst)
    copy_rows_batch(jobs, backend=backend)
    s_all = [r for s, _ in pairs for r in s]
    d_all = [r for _, d in pairs for r in d]
    assert_copied(src, dst, *before, s_all, d_all)
    staged = backend.inner["dma"] if via == "auto" else backend
    assert staged.copies == 1 and staged.pieces == 4  # both jobs staged, a piece per row


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_prepared_copy_touches_only_the_grouped_layers(gen, direction):
    # Issue 23.2: the job names all 3 layers, the groups only layers 2 and 0: layer 1 of
    # the destination keeps its bytes (the other backends leave it alone too).
    pool = _pool(gen)
    src, dst = _sides(pool, direction)
    src_rows, dst_rows = [4, 5, 0], [1, 2, 3]
    staged = StagedBackend(TorchBackend())
    prepared = staged.prepare(make_plan([CopyJob(src, dst, src_rows, dst_rows)]),
                              [[(0, 2)], [(0, 0)]])
    before = snapshot(src), snapshot(dst)
    prepared.launch(0)
    prepared.launch(1)
    assert_copied(src, dst, *before, src_rows, dst_rows, layers=[0, 2])
    assert staged.copies == 2  # a chunk per group (one layer apart: no common piece)


def _layer_bytes(table, layer, rows):
    return [v[rows].clone() for v in table.views[layer]]


@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_h2d_group_by_group_each_dma_brings_only_what_its_group_reads_first(gen, monkeypatch,
                                                                            kernel):
    # 4 layers, a chunk of 2 layers (piece 2 x 69 B), groups {0}, {1, 2}, {3}: launch g
    # DMAs the chunks group g reads first, then scatters; later layers are still untouched
    # (on CUDA: a consumer of group g's layers waits for no later DMA or scatter).
    monkeypatch.setattr("transfer_kernels.tuning.DMA_PIECE_BYTES", 2 * 69)
    pool = _pool(gen, layers=4)
    src_rows, dst_rows = [3, 4, 9], [0, 7, 2]
    staged = StagedBackend(TorchBackend() if kernel == "torch" else TritonBackend())
    groups = [[(0, 0)], [(0, 1), (0, 2)], [(0, 3)]]
    prepared = staged.prepare(make_plan([CopyJob(pool.host_table, pool.device_table, src_rows,
                                                 dst_rows)]), groups)
    before = snapshot(pool.host_table), snapshot(pool.device_table)
    pieces = []
    for g, done in enumerate(([0], [0, 1, 2], [0, 1, 2, 3])):
        prepared.launch(g)
        pieces.append(staged.pieces)
        for layer in range(4):
            got = _layer_bytes(pool.device_table, layer, dst_rows)
            want = (_layer_bytes(pool.host_table, layer, src_rows) if layer in done
                    else [v[dst_rows] for v in before[1][layer]])
            assert all(a.equal(b) for a, b in zip(got, want)), (g, layer)
    # chunks [0, 2) at group 0, [2, 4) at group 1 (layer 2 is read first there), none at 2
    assert pieces == [3, 6, 6] and staged.copies == 2
    assert_copied(pool.host_table, pool.device_table, *before, src_rows, dst_rows)


def test_d2h_chunk_goes_out_once_all_its_layers_are_gathered(gen, monkeypatch):
    monkeypatch.setattr("transfer_kernels.tuning.DMA_PIECE_BYTES", 2 * 69)
    pool = _pool(gen, layers=4)
    src_rows, dst_rows = [1, 5], [6, 2]
    staged = StagedBackend(TorchBackend())
    prepared = staged.prepare(make_plan([CopyJob(pool.device_table, pool.host_table, src_rows,
                                                 dst_rows)]), [[(0, 0)], [(0, 1), (0, 2)], [(0, 3)]])
    before = snapshot(pool.device_table), snapshot(pool.host_table)
    copies = []
    for g in range(3):
        prepared.launch(g)
        copies.append((staged.copies, staged.records, staged.waits))
    # start: 1 record + 1 wait; group 0: nothing complete; group 1: chunk [0, 2); group 2:
    # chunk [2, 4); each DMA: record + wait before it, record + wait after it; the last
    # group frees the ring: one more record (its ``free`` event, after the last gather)
    assert copies == [(0, 1, 1), (1, 3, 3), (2, 6, 5)]
    assert_copied(pool.device_table, pool.host_table, *before, src_rows, dst_rows)


def test_an_older_plan_may_not_launch_after_a_newer_one_started(gen):
    pool = _pool(gen)
    staged = StagedBackend(TorchBackend())
    plan = make_plan([CopyJob(pool.host_table, pool.device_table, [0, 1], [2, 3])])
    first = staged.prepare(plan, [[(0, 0)], [(0, 1), (0, 2)]])
    second = staged.prepare(plan, [[(0, 0)], [(0, 1), (0, 2)]])
    first.launch(0)
    second.launch(0)  # starts: owns the ring now
    with pytest.raises(RuntimeError, match="later load or backup started"):
        first.launch(1)
    second.launch(1)


def test_the_layout_cache_keeps_no_pool_alive(gen):
    import gc
    import weakref
    staged = StagedBackend(TorchBackend())
    pool = _pool(gen)
    copy_rows_batch([CopyJob(pool.host_table, pool.device_table, [1, 2], [3, 4])], backend=staged)
    gone = weakref.ref(pool.host_table)
    del pool
    gc.collect()
    assert gone() is None


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_cuda_groups_while_the_caller_stream_is_busy(gen, monkeypatch, direction):
    # The real DMA stream and events. H2D: the DMA stream is held by a long sleep, so a
    # scatter not ordered after its DMA reads stale staging; D2H: the caller's stream is
    # held, so a DMA not ordered after its gather copies stale staging. Only the caller's
    # stream is synchronized: it must cover every DMA. Chunks of 2 layers.
    monkeypatch.setattr("transfer_kernels.tuning.DMA_PIECE_BYTES", 2 * 69)
    pool = make_pool(gen, 4, 64, MIXED, "page_first", device="cuda", pin=True)
    src, dst = _sides(pool, direction)
    jobs = [CopyJob(src, dst, [0, 1, 9], [4, 5, 30]), CopyJob(src, dst, [7, 8], [9, 10])]
    staged = StagedBackend(TritonBackend())
    prepared = staged.prepare(make_plan(jobs), [[(0, 0), (1, 0)], [(0, 1), (1, 1), (0, 2)],
                                                [(1, 2), (0, 3), (1, 3)]])
    before = snapshot(src), snapshot(dst)
    ring = staged._rings[(str(torch.device("cuda", 0)), direction)]
    held = torch.cuda.ExternalStream(ring.stream) if direction == "h2d" else None
    with torch.cuda.stream(held or torch.cuda.current_stream()):
        torch.cuda._sleep(50_000_000)
    for g in range(3):
        prepared.launch(g)
    torch.cuda.current_stream().synchronize()
    if direction == "d2h":  # host bytes read with no device-wide sync
        for layer in range(4):
            for b, view in enumerate(dst.views[layer]):
                assert view[[4, 5, 30, 9, 10]].equal(before[0][layer][b][[0, 1, 9, 7, 8]])
    assert_copied(src, dst, *before, [0, 1, 9, 7, 8], [4, 5, 30, 9, 10])


def _random_case(gen, seed):
    """Two pools, 1-3 jobs each way on them (disjoint rows per table), random launch groups
    over a random subset of each job's layers."""
    g = torch.Generator().manual_seed(seed)
    layers = int(torch.randint(1, 6, (1,), generator=g))
    pools = [_pool(gen, layers=layers, rows=24) for _ in range(2)]
    jobs, expect = [], []
    for pool in pools:
        perm_host, perm_dev = torch.randperm(24, generator=g), torch.randperm(24, generator=g)
        at = 0
        for direction in ("h2d", "d2h")[:int(torch.randint(1, 3, (1,), generator=g))]:
            n = int(torch.randint(1, 6, (1,), generator=g))
            host, dev = perm_host[at:at + n], perm_dev[at:at + n]
            at += n
            src, dst = _sides(pool, direction)
            jobs.append(CopyJob(src, dst, *((host, dev) if direction == "h2d" else (dev, host))))
    pairs = [(j, layer) for j in range(len(jobs)) for layer in range(layers)
             if bool(torch.rand(1, generator=g) < 0.8)]
    pairs = [pairs[i] for i in torch.randperm(len(pairs), generator=g).tolist()]
    cuts = sorted(torch.randint(0, len(pairs) + 1, (3,), generator=g).tolist())
    groups = [pairs[a:b] for a, b in zip([0] + cuts, cuts + [len(pairs)])]
    return jobs, groups


@pytest.mark.parametrize("seed", range(24))
def test_random_plans_and_groups_match_the_reference(gen, monkeypatch, seed):
    monkeypatch.setattr("transfer_kernels.tuning.DMA_PIECE_BYTES", [1, 69, 200, 1 << 20][seed % 4])
    jobs, groups = _random_case(gen, seed)
    staged = StagedBackend(TorchBackend(), window_growth=1 + seed % 3)
    plan = make_plan(jobs)
    tables = {id(t): t for job in jobs for t in (job.src, job.dst)}
    before = {k: snapshot(t) for k, t in tables.items()}
    prepared = staged.prepare(plan, groups)
    for g in torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed)).tolist():
        prepared.launch(g)
    want = {k: [[v.clone() for v in layer] for layer in b] for k, b in before.items()}
    for j, job in enumerate(jobs):  # the reference: each grouped (job, layer), rows in order
        for layer in {layer for group in groups for jj, layer in group if jj == j}:
            for b in range(job.src.num_buffers):
                want[id(job.dst)][layer][b][torch.as_tensor(job.dst_rows)] = \
                    before[id(job.src)][layer][b][torch.as_tensor(job.src_rows)]
    for k, table in tables.items():
        for layer in range(table.num_layers):
            for b, view in enumerate(table.views[layer]):
                assert view.equal(want[k][layer][b]), (seed, table.name, layer, b)


def test_dma_windows_grow_and_keep_the_first_group_alone():
    from transfer_kernels.backends.staging import window_ends
    ends = tuple(range(1, 8))  # 7 groups, each bringing one piece
    assert window_ends(ends, 1, True) == ends
    assert window_ends(ends, 2, True) == (1, 3, 3, 7, 7, 7, 7)  # before the window's first
    assert window_ends(ends, 2, False) == (1, 1, 3, 3, 3, 3, 7)  # after the window's last
    with pytest.raises(ValueError, match="window_growth: must be an int >= 1"):
        StagedBackend(TorchBackend(), window_growth=0)


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_windowed_dma_makes_one_call_per_window(gen, monkeypatch, direction):
    # 7 layers, a group each, a chunk per layer: windows [0], [1, 2], [3..6] -> 3 DMA
    # calls (and their record + wait) instead of 7; bytes as ever.
    monkeypatch.setattr("transfer_kernels.tuning.DMA_PIECE_BYTES", 1)
    pool = make_pool(gen, 7, 12, MIXED, "page_first", device="cpu", pin=False)
    src, dst = _sides(pool, direction)
    staged = StagedBackend(TorchBackend(), window_growth=2)
    before = snapshot(src), snapshot(dst)
    prepared = staged.prepare(make_plan([CopyJob(src, dst, [4, 5, 0], [1, 2, 3])]),
                              [[(0, layer)] for layer in range(7)])
    for g in range(7):
        prepared.launch(g)
    assert_copied(src, dst, *before, [4, 5, 0], [1, 2, 3])
    per_call = 1 if direction == "h2d" else 2  # D2H also orders the DMA after the gathers
    assert staged.copies == 3 and staged.pieces == 21
    # the claim's record + wait, per DMA call its own, and the release's record (``free``)
    assert staged.records - 1 == staged.waits == 1 + 3 * per_call


def test_chunks_are_runs_of_grouped_layers_cut_evenly():
    from transfer_kernels.backends.staging import chunk_layers
    assert chunk_layers(list(range(30)), 4) == [[0, 4], [4, 4], [8, 4], [12, 4], [16, 4],
                                                [20, 4], [24, 3], [27, 3]]
    assert chunk_layers([0, 1, 2, 5, 6, 9], 2) == [[0, 2], [2, 1], [5, 2], [9, 1]]
    assert chunk_layers([3, 4, 5], 8) == [[3, 3]]


def test_cuda_calls_are_the_runtime_calls_with_the_ring_stream(monkeypatch):
    # The CUDA branch of the DMA and event helpers, with the runtime replaced by a log
    # (the CPU has no device; a GPU machine runs test_cuda_groups_... for real).
    import numpy as np

    from transfer_kernels.cuda.runtime import DmaQueue
    from transfer_kernels.backends.ring import Ring
    from transfer_kernels.cuda import cudart
    calls = []
    monkeypatch.setattr(cudart, "memcpy_batch_rows", lambda p, st: calls.append(
        ("batch", *p.tolist(), st)))
    monkeypatch.setattr(cudart, "memcpy_async", lambda d, s, n, st: calls.append(("one", d, s, n, st)))
    monkeypatch.setattr(cudart, "event_record", lambda ev, st: calls.append(("record", ev, st)))
    monkeypatch.setattr(cudart, "stream_wait_event", lambda st, ev: calls.append(("wait", st, ev)))
    ring = Ring(torch.device("cuda", 0), "h2d", 1 << 20)
    ring.stream, ring.events = 7, (11, 12)
    pieces = np.array([[100, 200], [300, 400], [8, 16]], dtype=np.int64)
    batched, single = DmaQueue(batch=True), DmaQueue(batch=False)
    batched.issue(ring, pieces, 3)
    single.issue(ring, pieces, 3)
    assert (batched.copies, single.copies, batched.pieces, single.pieces) == (1, 2, 2, 2)
    batched.record(ring, 12, 7)
    batched.wait(ring, 3, 12)
    assert calls == [("batch", [100, 200], [300, 400], [8, 16], 7), ("record", 12, 7), ("wait", 3, 12),
                     ("one", 100, 300, 8, 7), ("one", 200, 400, 16, 7), ("record", 12, 7),
                     ("wait", 3, 12), ("record", 12, 7), ("wait", 3, 12)]
    assert (batched.records, batched.waits) == (2, 2)


def test_batched_dma_reads_a_column_slice_in_place(monkeypatch):
    # A group's slice of a load's uint64 pieces reaches cudaMemcpyBatchAsync as three row
    # addresses into the array itself, with the cached attributes (source reads in stream
    # order, one attribute set at index 0). The runtime is a C-callable stand-in with the
    # CUDA 13 signature, so the ctypes marshalling is the real one.
    import ctypes

    import numpy as np

    from transfer_kernels.cuda import cudart
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    seen = []

    def batch(dsts, srcs, sizes, count, attrs, idxs, num_attrs, stream):
        rows = [np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_uint64)), (count,))
                for p in (dsts, srcs, sizes)]
        seen.append(([r.tolist() for r in rows], attrs[0].srcAccessOrder, idxs[0], num_attrs,
                     stream))
        return 0
    proto = ctypes.CFUNCTYPE(ctypes.c_int, vp, vp, vp, sz, ctypes.POINTER(cudart._MemcpyAttributes),
                             ctypes.POINTER(sz), sz, vp)
    fake = proto(batch)
    monkeypatch.setattr(cudart, "_batch_fn", lambda: fake)
    monkeypatch.setattr(cudart, "runtime_version", lambda: 13000)
    pieces = np.arange(30, dtype=np.uint64).reshape(3, 10)
    cudart.memcpy_batch_rows(pieces[:, 4:7], 5)
    cudart.memcpy_batch_rows(pieces.astype(np.int64)[:, 8:], 6)  # other dtype: converted
    assert seen == [([[4, 5, 6], [14, 15, 16], [24, 25, 26]], 1, 0, 1, 5),
                    ([[8, 9], [18, 19], [28, 29]], 1, 0, 1, 6)]
