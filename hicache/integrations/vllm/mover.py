"""`BlockMover`: the worker side of the vLLM plugin, on hicache's host pools and copy backends.

Device side: vLLM's KV cache, one ``[num_blocks, page_bytes]`` uint8 view per layer and
KV cache group, adopted without a copy as a ``transfer_kernels.RowTable`` (one row = one
vLLM block). Host side: one ``host_pools.HostPool`` per group (``page_first`` by default:
a block of all layers is one contiguous span), all groups in one ``HostReservation``
checked against the host budget before any memory is touched, pinned on CUDA. A host
chunk ``c`` is ``blocks_per_chunk`` consecutive host rows::

    host rows of chunk c:   c*k, c*k+1, ..., c*k+k-1            (k = blocks_per_chunk)
    a job's rows, group g:  rows of its chunks, minus the first block_indices[g] % k
                            (a request whose first block is mid-chunk), n = group_sizes[g]

Every store (device -> host) and load (host -> device) is one ``copy_rows_batch`` call
over all groups, through the configured backend (``auto``: triton for small pieces and
the copy engine for large ones on CUDA; numpy/torch copies on CPU). On CUDA each
direction has its own stream, ordered after the compute stream, and completion is an
event; on CPU the copy runs inside ``submit``. A copy that raises reports its job as
failed and frees nothing: host chunk ids belong to the scheduler-side index.
No vLLM import: the worker adapter translates vLLM's specs into plain arrays.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np
import torch

from host_pools.memory import HostReservation
from host_pools.pools import HostPool
from host_pools.spec import BufferSpec, PoolKind, PoolSpec
from hicache.config import HiCacheConfig
from hicache.stats import TransferStats
from hicache.integrations.vllm.config import FLAG_HINT, SpecConfig
from transfer_kernels import AutoBackend, CopyBackend, CopyJob, RowTable, TritonBackend
from transfer_kernels import copy_rows_batch, get_backend

log = logging.getLogger(__name__)
DIRECTIONS = {"store": "d2h", "load": "h2d"}


class Finished(NamedTuple):
    """A finished job: its id, success, bytes moved and seconds the copy took."""

    job_id: int
    ok: bool
    nbytes: int
    seconds: float


@dataclass(slots=True)
class _InFlight:
    job_id: int
    nbytes: int
    start: object  # torch.cuda.Event
    end: object
    keep: list = field(default_factory=list)  # index tensors the launch may still read


def make_backend(config: HiCacheConfig) -> CopyBackend:
    """The copy backend ``config.io_backend`` names, with the Triton grid bound applied."""
    if config.io_backend == "triton":
        return TritonBackend(max_programs=config.max_copy_programs)
    if config.io_backend == "auto":
        return AutoBackend(triton=TritonBackend(max_programs=config.max_copy_programs))
    return get_backend(config.io_backend, fresh=True)


def chunk_rows(chunks: np.ndarray, blocks_per_chunk: int, skip: int, count: int) -> np.ndarray:
    """Host rows of ``count`` blocks starting ``skip`` blocks into the first of ``chunks``."""
    k = blocks_per_chunk
    rows = (chunks.astype(np.int64)[:, None] * k + np.arange(k, dtype=np.int64)).ravel()
    return rows[skip:skip + count]


class BlockMover:
    """Host pools for vLLM's KV cache groups and the asynchronous copies between the tiers.

    Args:
        groups: per KV cache group, per layer, a 2-D uint8 ``[num_blocks, page_bytes]``
            view of vLLM's cache (row stride may exceed ``page_bytes``).
        tokens_per_block: vLLM tokens per block, per group.
        num_chunks: host chunks per group (from ``SpecConfig.host_chunks``).
        blocks_per_chunk: vLLM blocks per host chunk, >= 1.
        config: the plugin settings (backend, layout, budget).
        world_size: vLLM workers (splits the host budget unless ranks were given).
        budget: override the measured host budget (tests).
        backend: override the backend ``config`` names (tests: fault injection).
    Raises:
        ValueError: bad views (names group and layer); HostMemoryError: over budget.
    """

    def __init__(self, groups: Sequence[Sequence[torch.Tensor]], tokens_per_block: Sequence[int],
                 num_chunks: int, blocks_per_chunk: int, config: SpecConfig, world_size: int = 1,
                 budget=None, backend: CopyBackend | None = None) -> None:
        if not groups or len(groups) != len(tokens_per_block):
            raise ValueError(f"groups: need one entry per KV cache group and a tokens_per_block "
                             f"each, got {len(groups)} and {len(tokens_per_block)}")
        if blocks_per_chunk < 1 or num_chunks < 1:
            raise ValueError(f"blocks_per_chunk, num_chunks: must be >= 1, got "
                             f"{blocks_per_chunk}, {num_chunks}")
        self.blocks_per_chunk, self.num_chunks = blocks_per_chunk, num_chunks
        self.device_tables = [RowTable.from_views([[v] for v in views], name=f"vllm.group{g}")
                              for g, views in enumerate(groups)]
        self.device = self.device_tables[0].device
        self.specs = [self._pool_spec(g, t, tpb) for g, (t, tpb)
                      in enumerate(zip(self.device_tables, tokens_per_block))]
        self.host_pools = self._allocate(config, world_size, budget)
        self.host_tables = [RowTable.from_views(p.row_views(), name=f"{p.name}.host")
                            for p in self.host_pools]
        self.backend = backend or make_backend(config.hicache)
        self.counters = TransferStats()
        self.seconds = {"d2h": 0.0, "h2d": 0.0}
        self._done: deque[Finished] = deque()
        self._inflight: dict[str, deque[_InFlight]] = {"store": deque(), "load": deque()}
        on_cuda = self.device.type == "cuda"
        self._streams = ({d: torch.cuda.Stream(self.device) for d in DIRECTIONS} if on_cuda else {})

    @staticmethod
    def _pool_spec(g: int, table: RowTable, tokens_per_block: int) -> PoolSpec:
        buf = BufferSpec("kv", (table.row_bytes[0],), torch.uint8)
        return PoolSpec(f"group{g}", PoolKind.ANCHOR, table.num_layers, (buf,),
                        tokens_per_row=tokens_per_block)

    def _allocate(self, config: SpecConfig, world_size: int, budget) -> list[HostPool]:
        rows = self.num_chunks * self.blocks_per_chunk
        requests = {s.name: HostPool.bytes_for(s, rows) for s in self.specs}
        budget = config.check_budget(requests, world_size, budget)
        self.reservation = HostReservation(pin=self.device.type == "cuda")
        storage = self.reservation.reserve(requests, budget, FLAG_HINT)
        return [HostPool(s, rows, config.hicache.mem_layout, storage[s.name]) for s in self.specs]

    def block_bytes(self, group: int) -> int:
        """Bytes of one vLLM block of ``group``, all layers."""
        table = self.device_tables[group]
        return table.num_layers * table.row_bytes[0]

    @property
    def host_bytes(self) -> int:
        """Bytes of every host pool together."""
        return sum(p.nbytes for p in self.host_pools)

    def plan(self, device_blocks: np.ndarray, group_sizes: Sequence[int],
             block_indices: Sequence[int], chunks: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Per group with blocks: ``(group, device rows, host rows)`` of one job.

        Raises:
            ValueError: the spec's lengths disagree (names the argument).
        """
        if len(group_sizes) != len(self.device_tables) or len(block_indices) != len(group_sizes):
            raise ValueError(f"group_sizes, block_indices: need {len(self.device_tables)} entries, "
                             f"got {len(group_sizes)} and {len(block_indices)}")
        out, d_off, h_off, k = [], 0, 0, self.blocks_per_chunk
        for g, (n, first) in enumerate(zip(group_sizes, block_indices)):
            if n == 0:
                continue
            skip = int(first) % k
            n_chunks = -(-(int(n) + skip) // k)
            dev = np.asarray(device_blocks[d_off:d_off + n], dtype=np.int64)
            host = chunk_rows(np.asarray(chunks[h_off:h_off + n_chunks]), k, skip, int(n))
            if len(dev) != n or len(host) != n:
                raise ValueError(f"device_blocks, chunks: group {g} needs {n} blocks in "
                                 f"{n_chunks} chunk(s), got {len(dev)} and {len(host)} rows")
            out.append((g, dev, host))
            d_off, h_off = d_off + n, h_off + n_chunks
        if d_off != len(device_blocks) or h_off != len(chunks):
            raise ValueError(f"device_blocks, chunks: {len(device_blocks)} blocks and {len(chunks)} "
                             f"chunks given, group_sizes use {d_off} and {h_off}")
        return out

    def submit(self, job_id: int, direction: str, device_blocks: np.ndarray,
               group_sizes: Sequence[int], block_indices: Sequence[int], chunks: np.ndarray) -> None:
        """Start one store or load; its outcome comes back from :meth:`finished`.

        Never raises for a failed copy (bad ids, a backend error): the job is reported
        failed instead, and nothing is freed. Not thread-safe (vLLM's worker thread).

        Raises:
            ValueError: ``direction`` is not ``"store"`` or ``"load"`` (a caller bug).
        """
        if direction not in DIRECTIONS:
            raise ValueError(f"direction: must be one of {tuple(DIRECTIONS)}, got {direction!r}")
        try:
            parts = self.plan(device_blocks, group_sizes, block_indices, chunks)
            jobs = [self._job(direction, g, dev, host) for g, dev, host in parts]
            nbytes = sum(len(dev) * self.block_bytes(g) for g, dev, _ in parts)
            if self.device.type == "cuda":
                self._launch_cuda(job_id, direction, jobs, nbytes)
            else:
                started = time.perf_counter()
                copy_rows_batch(jobs, backend=self.backend)
                self._finish(direction, Finished(job_id, True, nbytes, time.perf_counter() - started))
        except (ValueError, RuntimeError) as exc:  # report, never half-publish
            log.error("hicache %s job %d failed: %s", direction, job_id, exc)
            self._finish(direction, Finished(job_id, False, 0, 0.0))

    def _job(self, direction: str, g: int, dev: np.ndarray, host: np.ndarray) -> CopyJob:
        d_rows, h_rows = torch.from_numpy(dev), torch.from_numpy(host)
        if direction == "store":
            return CopyJob(self.device_tables[g], self.host_tables[g], d_rows, h_rows)
        return CopyJob(self.host_tables[g], self.device_tables[g], h_rows, d_rows)

    def _launch_cuda(self, job_id: int, direction: str, jobs: list[CopyJob], nbytes: int) -> None:
        stream = self._streams[direction]
        # A store reads KV the model may still be writing; a load writes blocks whose
        # earlier writes (zeroing, a previous owner) are queued on the compute stream.
        stream.wait_stream(torch.cuda.current_stream(self.device))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            copy_rows_batch(jobs, backend=self.backend)
            end.record(stream)
        self._inflight[direction].append(_InFlight(job_id, nbytes, start, end, jobs))

    def _finish(self, direction: str, done: Finished) -> None:
        self._done.append(done)
        nbytes = {"kv": done.nbytes} if done.ok else {}
        self.counters.record(DIRECTIONS[direction], done.ok, {}, nbytes)
        self.seconds[DIRECTIONS[direction]] += done.seconds

    def finished(self) -> list[Finished]:
        """Jobs finished since the last call (per direction in submission order)."""
        for direction, queue in self._inflight.items():
            while queue and queue[0].end.query():
                job = queue.popleft()
                seconds = job.start.elapsed_time(job.end) / 1e3
                self._finish(direction, Finished(job.job_id, True, job.nbytes, seconds))
        out = list(self._done)
        self._done.clear()
        return out

    def wait(self, job_ids: set[int]) -> None:
        """Block until the given jobs' copies are done (a no-op on CPU, where submit copies)."""
        for queue in self._inflight.values():
            for job in queue:
                if job.job_id in job_ids:
                    job.end.synchronize()

    def stats(self) -> dict:
        """Ops, bytes and GB/s per direction (``d2h`` stores, ``h2d`` loads)."""
        out = self.counters.as_dict()
        for d, secs in self.seconds.items():
            nbytes = sum(out[d]["bytes"].values())
            out[d]["seconds"] = secs
            out[d]["gbps"] = nbytes / secs / 1e9 if secs > 0 else 0.0
        return out

    def close(self) -> None:
        """Wait for in-flight copies, then unpin the host pools (idempotent)."""
        for queue in self._inflight.values():
            for job in queue:
                job.end.synchronize()
        self.reservation.release()
