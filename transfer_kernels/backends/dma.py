"""The ``"dma"`` backend at load time: DMA calls, a size class's prepared staging and one
load's launches (the rings themselves: `ring`).

    RingWork        one load's pieces in one ring (the layout's fixed fields plus its rows)
    DmaQueue        the DMA calls (cudaMemcpyBatchAsync; a memmove per piece on the CPU)
                    and event ordering of one backend, counted
    StagedPrepared  a size class's ring layouts and kernel preparation; a load fills in its
                    host rows' addresses (one vectorized step per ring)
    StagedLaunches  per launch group: its DMA slice, then its one kernel launch (D2H: the
                    gather, then the DMA of the chunks it completed), ordered by events
                    (`staged`'s module docstring has the sequence and the call budget)
"""
from __future__ import annotations

import ctypes
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from transfer_kernels.backends.launches import Launches, Prepared
from transfer_kernels.backends.ring import Ring
from transfer_kernels.backends.staging import RingLayout
from transfer_kernels.cuda import cudart, runtime
from transfer_kernels.rows import Lane, RowTable


class RingWork(NamedTuple):
    """One ring's DMA of one load: pieces in issue order and, per group, the end of the
    pieces issued by then."""

    ring: Ring
    pieces: np.ndarray  # uint64 [3, P] (dst, src, bytes), sorted by the group issuing them
    ends: tuple[int, ...]  # per group


class DmaQueue:
    """The DMA calls and cross-stream ordering of one ``"dma"`` backend, counted (on the
    CPU too: what the CUDA path would issue).

    Attributes:
        batch: use ``cudaMemcpyBatchAsync``; ``None`` means when the runtime has it.
        copies / pieces: DMA calls issued and pieces they moved.
        records / waits: event records and stream waits issued.
    """

    def __init__(self, batch: bool | None = None) -> None:
        self.batch = batch
        self.copies = self.pieces = self.records = self.waits = 0

    def issue(self, ring: Ring, pieces: np.ndarray, caller: int) -> None:
        """DMA ``pieces`` (``[3, n]`` dst, src, bytes) on ``ring``'s stream, record its done
        event there and make the ``caller`` stream wait for it (one launch group's DMA).

        On CUDA one ``cudaMemcpyBatchAsync`` (CUDA >= 12.8, ``batch`` None or True; a
        uint64 slice of a load's pieces goes to the runtime in place), else one
        ``cudaMemcpyAsync`` per piece; on the CPU a memmove per piece (addresses of live
        tensors the staged backend holds), the events counted only."""
        self.pieces += pieces.shape[1]
        self.records += 1
        self.waits += 1
        if not ring.cuda:
            for d, s, n in pieces.T.tolist():
                ctypes.memmove(d, s, n)
            self.copies += 1
            return
        if cudart.batch_available() if self.batch is None else self.batch:
            cudart.memcpy_batch_rows(pieces, ring.stream)
            self.copies += 1
        else:
            for d, s, n in pieces.T.tolist():
                cudart.memcpy_async(d, s, n, ring.stream)
            self.copies += pieces.shape[1]
        cudart.event_record(ring.events[1], ring.stream)
        cudart.stream_wait_event(caller, ring.events[1])

    def record(self, ring: Ring, event: int, stream: int) -> None:
        """Record ``event`` on ``stream`` (CUDA; counted everywhere)."""
        if ring.cuda:
            cudart.event_record(event, stream)
        self.records += 1

    def wait(self, ring: Ring, stream: int, event: int) -> None:
        """Make ``stream`` wait for ``event`` (CUDA; counted everywhere)."""
        if ring.cuda:
            cudart.stream_wait_event(stream, event)
        self.waits += 1


class StagedPrepared(Prepared):
    """What every load of one size class reuses: the ring layouts (every piece's fixed
    fields), the staged jobs' staging tables and the kernel's preparation over them.

    Args:
        backend: the ``"dma"`` backend (counted per launch).
        rings: per direction, the ring's layout.
        swaps: per staged job: (job, staging table, its rows 0..n-1, h2d).
        inner: the kernel's prepared object over the plan with the staging tables swapped in.
        stages: the staged jobs (for inspection: ``bench/dma_plan.py``).
    """

    def __init__(self, backend: Any, dma: DmaQueue, rings: tuple[RingLayout, ...],
                 swaps: tuple[tuple[int, RowTable, torch.Tensor, bool], ...], inner: Prepared,
                 stages: tuple) -> None:
        self.backend, self.dma, self.rings, self.swaps = backend, dma, rings, swaps
        self.inner, self.stages, self.counters = inner, stages, (backend,)

    @property
    def num_groups(self) -> int:
        return self.inner.num_groups

    def start(self, lanes, src_rows, dst_rows) -> StagedLaunches:
        work = {}
        for lay in self.rings:  # this load's host rows, concatenated (one torch call)
            rows = [src_rows[j] for j in lay.jobs] if lay.ring.direction == "h2d" else \
                [dst_rows[j] for j in lay.jobs]
            rows = (torch.cat(rows) if len(rows) > 1 else rows[0]).numpy()
            pieces = lay.fixed.copy()  # the fixed fields plus each piece's host row
            pieces[1 if lay.ring.direction == "h2d" else 0] += rows[lay.row] * lay.span
            work[lay.ring.direction] = RingWork(lay.ring, pieces.view(np.uint64), lay.ends)
        if self.swaps:  # the kernel's side of each staged job is its staging table
            lanes, src_rows, dst_rows = list(lanes), list(src_rows), list(dst_rows)
            for j, staging, local, h2d in self.swaps:
                lane = lanes[j]
                if h2d:
                    lanes[j], src_rows[j] = Lane(staging, lane.dst, lane.layers), local
                else:
                    lanes[j], dst_rows[j] = Lane(lane.src, staging, lane.layers), local
        return StagedLaunches(self, self.inner.start(lanes, src_rows, dst_rows), work)


class StagedLaunches(Launches):
    """The kernel's prepared launches with each group's DMA before (H2D) or after (D2H)
    it. Groups may launch in any order; each launches once. A launch reads its group's
    piece bounds from tuples and issues one slice: no per-launch array work.

    Args:
        prepared: the size class's `StagedPrepared`.
        inner: the kernel's launches of this load (scatter, gather, unstaged jobs).
        work: per direction, this load's pieces in that direction's ring.
    """

    def __init__(self, prepared: StagedPrepared, inner: Launches, work: dict[str, RingWork]) -> None:
        self.counters, self.dma, self.inner, self.work = prepared.counters, prepared.dma, inner, work
        num_groups = inner.num_groups
        self.h2d, self.d2h = work.get("h2d"), work.get("d2h")
        self._rings = tuple(w.ring for w in work.values())
        self._h2d_at = self._d2h_at = 0  # pieces issued so far, per ring
        self._launched = [False] * num_groups if self.d2h is not None else None
        self._prefix = 0  # groups 0.._prefix-1 have all launched
        self._current: int | None = None  # the caller's stream, from the first launch
        self._h2d_ends = self.h2d.ends if self.h2d is not None else None

    @property
    def num_groups(self) -> int:
        return self.inner.num_groups

    def run(self, events: Sequence[Any], stream: Any) -> None:
        """Every group in order, each followed by a record of ``events[g]``: per group its
        DMA slice (H2D), one kernel launch, (D2H: the DMA of the chunks it completed), one
        record. The loop a CUDA graph per size class would replace (the DMA slices'
        host addresses change per load: the pieces would move to a device table first)."""
        inner, n = self.inner, self.num_groups
        for backend in self.counters:
            backend.launches += n
        direct = inner.direct()  # the kernel's pre-bound launcher: launched uncounted below
        live = inner.live() if direct is not None else None
        if direct is not None:
            launched = sum(1 for x in live if x)
            for backend in inner.counters:
                backend.launches += launched
        self._claim()
        h2d, d2h, queue, caller = self.h2d, self.d2h, self.dma, self._current
        launch, record = runtime.launch, runtime.record
        try:
            for g in range(n):
                if h2d is not None and h2d.ends[g] > self._h2d_at:
                    end = h2d.ends[g]
                    queue.issue(h2d.ring, h2d.pieces[:, self._h2d_at:end], caller)
                    self._h2d_at = end
                if direct is None:
                    inner.launch(g)
                elif live[g]:
                    launch(direct, g)
                if d2h is not None:
                    self._d2h(d2h, d2h.ends[g])
                record(events[g], stream)
        except BaseException:
            self._join()
            raise

    def _launch(self, group: int) -> None:
        """Launch ``group`` with its DMA (groups in any order, each once)."""
        self._claim()
        try:
            ends = self._h2d_ends
            if ends is not None:
                end = ends[group]
                if end > self._h2d_at:
                    # the chunks groups up to this one read first; the caller's stream waits
                    self.dma.issue(self.h2d.ring, self.h2d.pieces[:, self._h2d_at:end], self._current)
                    self._h2d_at = end
            self.inner.launch(group)
            if self.d2h is not None:
                launched = self._launched
                launched[group] = True
                while self._prefix < len(launched) and launched[self._prefix]:
                    self._prefix += 1
                if self._prefix:
                    self._d2h(self.d2h, self.d2h.ends[self._prefix - 1])
        except BaseException:
            self._join()
            raise

    def _claim(self) -> None:
        """On the first launch, claim the rings (`_start`); later, check they are still ours."""
        if self._current is None:
            self._start()
            return
        for ring in self._rings:
            if ring.owner is not self:
                raise RuntimeError("dma: a later load or backup started on this staging "
                                   "ring before this one's launches ended; launch a "
                                   "prepared plan's groups before starting another")

    def _start(self) -> None:
        """First launch: claim the rings and order them after the caller's stream and the
        previous user (the rings were allocated when the size class was laid out)."""
        b = self.dma
        for w in self.work.values():
            ring = w.ring
            cur = self._current = runtime.stream_handle(ring.device)
            mark, done = ring.events
            if ring.direction == "h2d":  # the DMA writes the ring and reads the host
                b.record(ring, mark, cur)
                b.wait(ring, ring.stream, mark)
                if ring.last_stream not in (None, cur):  # an older load's scatter elsewhere
                    b.record(ring, done, ring.last_stream)
                    b.wait(ring, ring.stream, done)
            else:  # the gathers overwrite what the previous backup's DMA may still read
                b.record(ring, done, ring.stream)
                b.wait(ring, cur, done)
                if ring.last_stream not in (None, cur):  # an older backup's gathers elsewhere
                    b.record(ring, mark, ring.last_stream)
                    b.wait(ring, cur, mark)
            ring.owner, ring.last_stream = self, cur
        if self._current is None:
            self._current = 0

    def _d2h(self, w: RingWork, end: int) -> None:
        """DMA the chunks whose layers are all gathered, after the gathers; the caller's
        stream waits for it."""
        if end <= self._d2h_at:
            return
        b, ring = self.dma, w.ring
        b.record(ring, ring.events[0], self._current)
        b.wait(ring, ring.stream, ring.events[0])
        b.issue(ring, w.pieces[:, self._d2h_at:end], self._current)
        self._d2h_at = end

    def _join(self) -> None:
        """After a failure: the caller's stream waits for whatever the DMA streams hold."""
        if self._current is None:
            return
        for w in self.work.values():
            self.dma.record(w.ring, w.ring.events[1], w.ring.stream)
            self.dma.wait(w.ring, self._current, w.ring.events[1])
