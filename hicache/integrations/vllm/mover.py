"""`BlockMover`: the worker side of the vLLM plugin, on hicache's host pools and copy backends.

Device side: vLLM's KV cache, one ``[num_blocks, page_bytes]`` uint8 view per layer and
KV cache group, adopted without a copy as a ``transfer_kernels.RowTable`` (one row = one
vLLM block). Host side: one ``host_pools.HostPool`` per group (``page_first`` by default:
a block of all layers is one contiguous span; a group whose layers differ in page size
gets one pool per size, with the same rows), each group with its own number of chunks,
all in one ``HostReservation`` checked against the host budget before any memory is
touched, pinned on CUDA in registrations that start between rows (the host tables carry
their starts: no copy spans two, which ``cudaMemcpyBatchAsync`` refuses). A host chunk ``c`` is ``blocks_per_chunk`` consecutive host rows::

    host rows of chunk c:   c*k, c*k+1, ..., c*k+k-1            (k = blocks_per_chunk)
    a job's rows, group g:  rows of its chunks, minus the first block_indices[g] % k
                            (a request whose first block is mid-chunk), n = group_sizes[g]

Every store (device -> host) and load (host -> device) is one ``copy_rows_batch`` call
over all groups, through the configured backend (``auto``: triton for small pieces and
the copy engine for large ones on CUDA; numpy/torch copies on CPU). On CUDA stores,
loads and expedited loads each have their own stream, ordered after the compute stream,
and completion is an event; on CPU the copy runs inside ``submit``. A copy that raises reports its job as
failed and frees nothing: host chunk ids belong to the scheduler-side index.
With ``host_dtype: "int8"`` a group given its K/V ``vectors`` keeps int8 values + fp32
scales on the host (``host_codec.py``): stores quantize and loads dequantize inside the same
copy call; bytes reported are the device blocks'.
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
from host_pools.spec import PoolSpec
from hicache.controller.launcher import make_backend
from hicache.controller.stats import TransferStats
from hicache.integrations.vllm.config import FLAG_HINT, SpecConfig
from hicache.integrations.vllm.host_codec import HostPart, Vector, host_part
from transfer_kernels import CopyBackend, CopyJob, RowTable, copy_rows_batch

log = logging.getLogger(__name__)
DIRECTIONS = {"store": "d2h", "load": "h2d"}
QUEUES = {"store": "store", "load": "load", "expedited": "load"}  # queue -> direction


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


def chunk_rows(chunks: np.ndarray, blocks_per_chunk: int, skip: int, count: int) -> np.ndarray:
    """Host rows of ``count`` blocks starting ``skip`` blocks into the first of ``chunks``."""
    k = blocks_per_chunk
    rows = (chunks.astype(np.int64)[:, None] * k + np.arange(k, dtype=np.int64)).ravel()
    return rows[skip:skip + count]


class _Part(NamedTuple):
    """Layers of one group that share a page size and row stride: one host pool."""

    device: RowTable
    host: RowTable
    pool: HostPool


def split_layers(views: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """A group's layer views, parted by (page bytes, row stride), first appearance first
    (DeepSeek-V4's compressed-KV group mixes C4 and C128 KV and indexer pages)."""
    parts: dict[tuple[int, int], list[torch.Tensor]] = {}
    for v in views:
        parts.setdefault((int(v.shape[1]), int(v.stride(0))), []).append(v)
    return list(parts.values())


class BlockMover:
    """Host pools for vLLM's KV cache groups and the asynchronous copies between the tiers.

    Args:
        groups: per KV cache group, per layer, a 2-D uint8 ``[num_blocks, page_bytes]``
            view of vLLM's cache (row stride may exceed ``page_bytes``). Layers of one
            group that differ in page size get a host pool each, with the same rows.
        tokens_per_block: vLLM tokens per block, per group.
        num_chunks: host chunks, one count for every group or one per group (sliding-
            window groups keep fewer: ``groups.py``).
        blocks_per_chunk: vLLM blocks per host chunk, >= 1.
        config: the plugin settings (backend, layout, budget).
        world_size: vLLM workers (splits the host budget unless ranks were given).
        budget: override the measured host budget (tests).
        backend: override the backend ``config`` names (tests: fault injection).
        vectors: per group, the bf16/fp16 K/V vectors its blocks hold when the host tier is
            int8 (``host_codec.py``), ``None`` for a byte-exact group; default: all exact.
    Raises:
        ValueError: bad views (names group and layer) or counts; HostMemoryError: over budget.
    """

    def __init__(self, groups: Sequence[Sequence[torch.Tensor]], tokens_per_block: Sequence[int],
                 num_chunks: int | Sequence[int], blocks_per_chunk: int, config: SpecConfig,
                 world_size: int = 1, budget=None, backend: CopyBackend | None = None,
                 vectors: Sequence[Vector | None] | None = None) -> None:
        if not groups or len(groups) != len(tokens_per_block):
            raise ValueError(f"groups: need one entry per KV cache group and a tokens_per_block "
                             f"each, got {len(groups)} and {len(tokens_per_block)}")
        counts = [num_chunks] * len(groups) if isinstance(num_chunks, int) else list(num_chunks)
        if blocks_per_chunk < 1 or len(counts) != len(groups) or min(counts) < 1:
            raise ValueError(f"blocks_per_chunk, num_chunks: must be >= 1 (one count per group), "
                             f"got {blocks_per_chunk}, {num_chunks}")
        self.blocks_per_chunk, self.chunks_per_group = blocks_per_chunk, counts
        tables = [[RowTable.from_views([[v] for v in part], name=f"vllm.group{g}.{i}")
                   for i, part in enumerate(split_layers(views))] for g, views in enumerate(groups)]
        self.device = tables[0][0].device
        vectors = list(vectors) if vectors is not None else [None] * len(groups)
        if len(vectors) != len(groups):
            raise ValueError(f"vectors: need one entry per KV cache group, got {len(vectors)}")
        hosts = [[self._pool_spec(g, i, len(ts), t, tpb, vec) for i, t in enumerate(ts)]
                 for g, (ts, tpb, vec) in enumerate(zip(tables, tokens_per_block, vectors))]
        pools = self._allocate([[h.spec for h in hs] for hs in hosts], config, world_size, budget)
        self.parts = [[_Part(t, self._host_table(pools[h.spec.name], h), pools[h.spec.name])
                       for t, h in zip(ts, hs)] for ts, hs in zip(tables, hosts)]
        self.host_pools = [part.pool for group in self.parts for part in group]
        self.backend = backend or make_backend(config.hicache)
        self.counters = TransferStats()
        self.seconds = {"d2h": 0.0, "h2d": 0.0}
        self._done: deque[Finished] = deque()
        # expedited loads (vLLM >= 0.33 waits on them within the step) do not queue behind others
        self._inflight: dict[str, deque[_InFlight]] = {q: deque() for q in QUEUES}
        on_cuda = self.device.type == "cuda"
        self._streams = ({q: torch.cuda.Stream(self.device) for q in QUEUES} if on_cuda else {})

    @staticmethod
    def _pool_spec(g: int, i: int, count: int, table: RowTable, tokens_per_block: int,
                   vector: Vector | None) -> HostPart:
        name = f"group{g}" if count == 1 else f"group{g}.{i}"
        return host_part(name, table.num_layers, table.row_bytes[0], tokens_per_block, vector)

    def _allocate(self, specs: list[list[PoolSpec]], config: SpecConfig, world_size: int,
                  budget) -> dict[str, HostPool]:
        rows = {s.name: n * self.blocks_per_chunk for ss, n in zip(specs, self.chunks_per_group)
                for s in ss}
        flat = [s for ss in specs for s in ss]
        requests = {s.name: HostPool.bytes_for(s, rows[s.name]) for s in flat}
        budget = config.check_budget(requests, world_size, budget)
        layout = config.hicache.mem_layout
        # Pinned registrations start between rows (a copy never spans two of them).
        strides = {s.name: HostPool.row_stride_for(s, layout) for s in flat}
        self.reservation = HostReservation(pin=self.device.type == "cuda")
        storage = self.reservation.reserve(requests, budget, FLAG_HINT, strides)
        return {s.name: HostPool(s, rows[s.name], layout, storage[s.name]) for s in flat}

    def _host_table(self, pool: HostPool, part: HostPart) -> RowTable:
        """A host pool's rows, with its registrations' starts (the copy engine cuts runs there)."""
        return RowTable.from_views(pool.row_views(), name=f"{pool.spec.name}.host", codec=part.codec,
                                   chunk_starts=self.reservation.chunks.get(pool.spec.name))

    @property
    def num_chunks(self) -> int:
        """Host chunks of all groups together."""
        return sum(self.chunks_per_group)

    def block_bytes(self, group: int) -> int:
        """Bytes of one vLLM block of ``group``, all layers."""
        return sum(p.device.num_layers * p.device.row_bytes[0] for p in self.parts[group])

    def group_host_bytes(self) -> list[int]:
        """Host bytes of each group's pools."""
        return [sum(p.pool.nbytes for p in group) for group in self.parts]

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
        if len(group_sizes) != len(self.parts) or len(block_indices) != len(group_sizes):
            raise ValueError(f"group_sizes, block_indices: need {len(self.parts)} entries, "
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
               group_sizes: Sequence[int], block_indices: Sequence[int], chunks: np.ndarray,
               expedited: bool = False) -> None:
        """Start one store or load; its outcome comes back from :meth:`finished`.

        Never raises for a failed copy (bad ids, a backend error): the job is reported
        failed instead, and nothing is freed. An ``expedited`` load (vLLM waits on it
        within the step) runs on its own CUDA stream, not behind queued loads. Not
        thread-safe (vLLM's worker thread).

        Raises:
            ValueError: ``direction`` is not ``"store"`` or ``"load"`` (a caller bug).
        """
        if direction not in DIRECTIONS:
            raise ValueError(f"direction: must be one of {tuple(DIRECTIONS)}, got {direction!r}")
        try:
            parts = self.plan(device_blocks, group_sizes, block_indices, chunks)
            jobs = [job for g, dev, host in parts for job in self._jobs(direction, g, dev, host)]
            nbytes = sum(len(dev) * self.block_bytes(g) for g, dev, _ in parts)
            if self.device.type == "cuda":
                queue = "expedited" if expedited and direction == "load" else direction
                self._launch_cuda(job_id, queue, jobs, nbytes)
            else:
                started = time.perf_counter()
                copy_rows_batch(jobs, backend=self.backend)
                self._finish(direction, Finished(job_id, True, nbytes, time.perf_counter() - started))
        except (ValueError, RuntimeError) as exc:  # report, never half-publish
            log.error("hicache %s job %d failed: %s", direction, job_id, exc)
            self._finish(direction, Finished(job_id, False, 0, 0.0))

    def _jobs(self, direction: str, g: int, dev: np.ndarray, host: np.ndarray) -> list[CopyJob]:
        """One copy per part of group ``g`` (same rows on every part)."""
        d_rows, h_rows = torch.from_numpy(dev), torch.from_numpy(host)
        if direction == "store":
            return [CopyJob(p.device, p.host, d_rows, h_rows) for p in self.parts[g]]
        return [CopyJob(p.host, p.device, h_rows, d_rows) for p in self.parts[g]]

    def _launch_cuda(self, job_id: int, queue: str, jobs: list[CopyJob], nbytes: int) -> None:
        stream = self._streams[queue]
        # A store reads KV the model may still be writing; a load writes blocks whose
        # earlier writes (zeroing, a previous owner) are queued on the compute stream.
        stream.wait_stream(torch.cuda.current_stream(self.device))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            copy_rows_batch(jobs, backend=self.backend)
            end.record(stream)
        self._inflight[queue].append(_InFlight(job_id, nbytes, start, end, jobs))

    def _finish(self, direction: str, done: Finished) -> None:
        self._done.append(done)
        nbytes = {"kv": done.nbytes} if done.ok else {}
        self.counters.record(DIRECTIONS[direction], done.ok, {}, nbytes)
        self.seconds[DIRECTIONS[direction]] += done.seconds

    def finished(self) -> list[Finished]:
        """Jobs finished since the last call (per queue in submission order)."""
        for name, queue in self._inflight.items():
            while queue and queue[0].end.query():
                job = queue.popleft()
                seconds = job.start.elapsed_time(job.end) / 1e3
                self._finish(QUEUES[name], Finished(job.job_id, True, job.nbytes, seconds))
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
