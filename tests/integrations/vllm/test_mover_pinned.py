"""The mover's pinned host pools: registrations start between rows, and the host tables
know where (issue 26, item 6). On CUDA a copy may not span two ``cudaHostRegister``
registrations (``cudaMemcpyBatchAsync`` refuses it); the pools are pinned in ~1 GiB
chunks, so a row that straddled a chunk start would fail every load that touched it.

On CPU the pinning is faked (registrations recorded, not made) with a small chunk target,
so a few rows span several chunks; on a GPU a real pool over 1 GiB whose row does not
divide 1 GiB goes through every CUDA backend byte for byte.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hicache.integrations.vllm.mover as mover_module
from host_pools.memory import HostBudget, HostReservation
from hicache.integrations.vllm.config import SpecConfig
from hicache.integrations.vllm.mover import BlockMover
from tests.integrations.vllm.test_mover import vllm_cache
from transfer_kernels import StagedBackend, TorchBackend, make_plan

BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)
LAYERS, PAGE = 3, 1536  # a page_first row of 4608 B: lcm with a 4 KiB page is 8 rows


class FakePinning:
    """Stands in for host_pools.cuda_host: records registrations (start -> bytes)."""

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}

    def register(self, ptr: int, nbytes: int) -> None:
        self.registered[ptr] = nbytes

    def unregister(self, ptr: int) -> None:
        del self.registered[ptr]

    def device_pointer(self, ptr: int) -> int:
        return ptr


@pytest.fixture
def pinned_on_cpu(monkeypatch) -> FakePinning:
    """The mover pins its CPU pools (faked), in chunks of about 20 KiB (4.4 rows)."""
    import host_pools.cuda_host as cuda_host

    fake = FakePinning()
    for name in ("register", "unregister", "device_pointer"):
        monkeypatch.setattr(cuda_host, name, getattr(fake, name))
    monkeypatch.setattr("host_pools.memory._PIN_CHUNK_BYTES", 5 * 4096)
    monkeypatch.setattr(mover_module, "HostReservation", lambda pin: HostReservation(pin=True))
    return fake


def _crossing(starts: np.ndarray, begin: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Which of the spans [begin, begin + nbytes) contain a registration start past their first byte."""
    return np.searchsorted(starts, begin, side="right") != np.searchsorted(starts, begin + nbytes - 1,
                                                                           side="right")


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_pinned_chunks_start_between_rows_and_the_host_tables_know_them(gen, pinned_on_cpu, layout):
    m = BlockMover([vllm_cache(gen, LAYERS, 8, PAGE)], [16], 40, 1,
                   SpecConfig.from_extra({"io_backend": "torch", "mem_layout": layout}), budget=BIG)
    part = m.parts[0][0]
    starts = m.reservation.chunks["group0"]
    assert len(starts) > 2 and sorted(pinned_on_cpu.registered) == starts.tolist()
    assert part.host.chunk_starts is not None and part.host.chunk_starts.tolist() == starts.tolist()
    rows = np.arange(part.host.num_rows, dtype=np.int64)
    stride = part.host.row_strides[0]
    for layer in range(LAYERS):  # no row of any layer straddles a registration
        begin = int(part.host.ptrs[layer, 0]) + rows * stride
        assert not _crossing(starts, begin, np.full_like(rows, PAGE)).any()
    m.close()
    assert pinned_on_cpu.registered == {}


def test_no_staged_piece_crosses_a_registration_start(gen, pinned_on_cpu):
    # Every host row of the pool in one load: the DMA path's pieces (whole rows, or layer
    # runs of one row) each lie inside one registration, and the load is byte-exact.
    cache = vllm_cache(gen, LAYERS, 40, PAGE)
    m = BlockMover([cache], [16], 40, 1, SpecConfig.from_extra({"io_backend": "torch"}), budget=BIG)
    pool = m.host_pools[0]
    pool.buffer.copy_(torch.randint(0, 256, pool.buffer.shape, generator=gen, dtype=torch.uint8))
    host_rows, dev_rows = np.random.default_rng(7).permutation(40), np.arange(40)
    jobs = m._jobs("load", 0, dev_rows, host_rows)
    plan = make_plan(jobs)
    staged = StagedBackend(TorchBackend())
    prepared = staged.prepare(plan, [[(0, layer) for layer in range(LAYERS)]])
    (work,) = prepared.work  # the H2D ring's DMA of this load
    _, src, size = work.pieces
    assert len(src) == 40  # one piece per host row, each inside one registration
    assert not _crossing(m.reservation.chunks["group0"], src, size).any()
    before = pool.buffer.clone()
    prepared.launch(0)
    for d, h in zip(dev_rows, host_rows):
        assert all(torch.equal(cache[layer][d], pool.row_views()[layer][0][h]) for layer in range(LAYERS))
    assert torch.equal(pool.buffer, before)  # the source is unchanged
    m.close()


@pytest.mark.gpu
@pytest.mark.parametrize("io_backend", ["auto", "dma", "copy_engine"])
def test_cuda_pool_over_1_gib_with_rows_that_do_not_divide_it(gen, io_backend):
    # 3 layers of 128 KiB pages: 384 KiB rows, 2800 of them (1.03 GiB); 1 GiB is 2730.7
    # rows, so a 1 GiB registration would end inside row 2730.
    torch.cuda.init()
    layers = [v.cuda() for v in vllm_cache(gen, LAYERS, 8, 128 << 10)]
    ref = [v.clone() for v in layers]
    m = BlockMover([layers], [16], 2800, 1, SpecConfig.from_extra({"io_backend": io_backend}), budget=BIG)
    assert m.host_bytes > 1 << 30 and len(m.reservation.chunks["group0"]) == 2
    blocks, chunks = np.arange(8), np.array([2728, 2729, 2730, 2731, 2732, 0, 1365, 2799])
    m.submit(1, "store", blocks, [8], [0], chunks)
    m.wait({1})
    for v in layers:
        v.zero_()
    m.submit(2, "load", blocks[::-1].copy(), [8], [0], chunks)
    m.wait({2})
    torch.cuda.synchronize()
    assert [f.ok for f in m.finished()] == [True, True]
    for v, r in zip(layers, ref):
        assert torch.equal(v.cpu(), r.flip(0).cpu())
    m.close()
