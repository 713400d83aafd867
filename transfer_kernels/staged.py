"""The ``"dma"`` backend: page chunks by DMA on the copy engines into a device staging
ring, then a device-side scatter per launch group (H2D) — or a gather per group, then DMA
(D2H).

A ``page_first`` host table holds all layers of a row back to back (``RowTable.page_span``):
a chunk of consecutive layers of one row is one contiguous piece (``staging``'s module
docstring: chunks of >= 128 KiB, or whole rows). Per launch group of a load, in order::

    H2D   DMA stream:   [wait for the caller]  DMA(chunks first read by g)  record done
          load stream:  wait done  ->  ONE kernel launch (scatter of g + the unstaged jobs)
    D2H   load stream:  ONE kernel launch (gather of g + ...)  record mark
          DMA stream:   wait mark  DMA(chunks complete after g)  record done; caller waits done

so group g+1's DMA runs on the copy engines while group g's scatter runs on the SMs, and a
consumer of group g's layers waits for nothing later (the caller's per-group event follows
the scatter). Per group: at most one DMA call, one kernel launch, and one event record (H2D;
D2H two: the caller's stream waits for each group's DMA, so a caller that abandons the plan
after any launch has every issued copy behind its stream). Per load, one more record + wait
orders the DMA stream after the caller's stream.

Staging rings: one per (device, direction), ``max_staging_bytes`` each, allocated on first
use and reused by every load (default 128 MiB: a 64-page DeepSeek-V4-Pro load, 98.6 MB,
fits whole). Each staged job of a load gets its own region; a job that does not fit what
is left goes straight through the kernel. A load that starts waits (on the device) for the
previous user of the ring; the plan that started last owns it, and an older plan that
launches after that raises ``RuntimeError`` instead of racing it.

On a CPU plan the same steps run in program order: memmoves for the DMA, no-ops for the
events (counted all the same: ``copies``, ``records``, ``waits`` are what the CUDA path
would issue).
"""
from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np
import torch

from transfer_kernels import tuning
from transfer_kernels.base import CopyBackend, PreparedPlan
from transfer_kernels.plan import CopyPlan, LaunchGroups, PlannedJob
from transfer_kernels.quant import check_split
from transfer_kernels.staged_launches import StagedLaunches
from transfer_kernels.staging import Ring, RingLayout, RingWork, StagedJob, dma, layer_groups, \
    plan_job, region_end, ring_layout, ring_work
from transfer_kernels.triton_layout import _Lru


def host_side(job: PlannedJob, plan: CopyPlan) -> str | None:
    """``"src"`` or ``"dst"``: the side of ``job`` whose whole pages can be staged, or
    ``None``. On a CUDA plan: a ``page_span`` table in CPU memory facing a CUDA table; on a
    CPU plan: a ``page_span`` table facing one that is not (both contiguous: nothing to
    gain)."""
    for side, other in (("src", "dst"), ("dst", "src")):
        table, peer = getattr(job, side), getattr(job, other)
        if table.device.type != "cpu" or table.page_span() is None:
            continue
        if peer.device.type == "cuda" if plan.device.type == "cuda" else peer.page_span() is None:
            return side
    return None


def page_piece_bytes(job: PlannedJob, side: str) -> int:
    """Mean bytes of one whole-row DMA piece of ``job`` staged on ``side``: its layers'
    bytes of a row, times the mean run of consecutive host rows when it copies every layer
    (chunks of a multi-group load are cut to ``tuning.DMA_PIECE_BYTES``)."""
    table = getattr(job, side)
    rows = (job.src_rows if side == "src" else job.dst_rows).numpy()
    per_row = len(job.layers) * sum(table.row_bytes)
    if len(job.layers) != table.num_layers:
        return per_row
    num_runs = 1 + int(np.count_nonzero(np.diff(rows) != 1)) if rows.size else 1
    return per_row * rows.size // num_runs


class StagedBackend(CopyBackend):
    """``"dma"``: stages page chunks of ``page_first`` host pools (module docstring).

    Attributes:
        copies / pieces: DMA calls issued and pieces they moved.
        records / waits: event records and stream waits issued (CUDA; counted on CPU too).
    """

    name = "dma"
    # int8 host pages are staged like any other (the ring holds the host's bytes); the
    # staging table carries the host's codec, so the kernel converts from or into it.
    converts = True

    def __init__(self, kernel: CopyBackend | None = None,
                 min_piece_bytes: int = 1,
                 max_staging_bytes: int = tuning.DMA_STAGING_MAX_BYTES,
                 batch: bool | None = None) -> None:
        """Args:
            kernel: the backend that scatters, gathers and copies the unstaged jobs;
                ``None``: ``"triton"`` (under the interpreter on a CPU plan).
            min_piece_bytes: a job is staged when its mean DMA piece is at least this;
                by default every job that can be (``"auto"`` passes
                ``tuning.DMA_MIN_PIECE_BYTES``).
            max_staging_bytes: bytes of each staging ring (one per device and direction).
            batch: use ``cudaMemcpyBatchAsync``; ``None`` means when the runtime has it.
        """
        super().__init__()
        if kernel is None:
            from transfer_kernels.triton_backend import TritonBackend
            kernel = TritonBackend()
        self.kernel, self.min_piece_bytes = kernel, min_piece_bytes
        self.max_staging_bytes, self.batch = max_staging_bytes, batch
        self.copies = self.pieces = self.records = self.waits = 0
        self._rings: dict[tuple[str, str], Ring] = {}
        self._layouts = _Lru(64)

    @property
    def _held(self) -> int:
        """Staging bytes allocated (rings used so far)."""
        return sum(r.nbytes for r in self._rings.values() if r._buffer is not None)

    def check(self, plan: CopyPlan) -> None:
        """The kernel backend's check (the unstaged jobs and the scatter go through it;
        converting jobs through its quant backend, `quant.check_split`)."""
        check_split(self.kernel, plan)

    def stages(self, job: PlannedJob, plan: CopyPlan) -> str | None:
        """The side ``job`` is staged on, or ``None`` when it goes straight to the kernel."""
        if not job.num_rows or not job.layers:
            return None
        side = host_side(job, plan)
        if side is None or getattr(job, f"{side}_rows").device.type != "cpu":
            return None  # host rows on the device: reading them would synchronize
        if self.min_piece_bytes > 1 and page_piece_bytes(job, side) < self.min_piece_bytes:
            return None
        return side

    def sides(self, plan: CopyPlan) -> list[str | None]:
        """Per job: the side it is staged on (:meth:`stages`)."""
        return [self.stages(job, plan) for job in plan.jobs]

    def _execute(self, plan: CopyPlan, sides: Sequence[str | None] | None = None) -> None:
        """One group of every layer: one DMA call per direction, one kernel launch."""
        group = tuple((j, layer) for j, job in enumerate(plan.jobs) if job.num_rows
                      for layer in job.layers)
        self._prepare(plan, (group,), sides)._run(0)

    def prepare(self, plan: CopyPlan, groups: LaunchGroups,
                sides: Sequence[str | None] | None = None) -> PreparedPlan:
        """Lay the staged jobs out in the rings and prepare the kernel's launches; nothing
        is copied until a group launches (module docstring).

        Args:
            sides: per job, the side to stage (``None``: straight to the kernel); by
                default :meth:`sides` (``"auto"`` passes the choice it made).
        """
        self.check(plan)
        return self._prepare(plan, groups, sides)

    def _prepare(self, plan: CopyPlan, groups: LaunchGroups,
                 sides: Sequence[str | None] | None) -> StagedLaunches:
        stages, rings = self._layout(plan, groups, sides or self.sides(plan))
        jobs = list(plan.jobs)
        for st in stages:
            job = jobs[st.job]
            local = _arange(job.num_rows)  # rows 0..n-1 of the job's staging regions
            jobs[st.job] = (PlannedJob(st.staging, job.dst, local, job.dst_rows, job.layers)
                            if st.ring == "h2d" else
                            PlannedJob(job.src, st.staging, job.src_rows, local, job.layers))
        work = {}
        for direction, lay in rings.items():
            side = "src" if direction == "h2d" else "dst"
            work[direction] = ring_work(lay, [getattr(plan.jobs[j], side) for j in lay.jobs],
                                        [getattr(plan.jobs[j], f"{side}_rows").numpy()
                                         for j in lay.jobs])
        inner = self.kernel.prepare(plan.subset(jobs), groups)
        return StagedLaunches(self, inner, work, len(groups))

    def _ring(self, plan: CopyPlan, direction: str) -> Ring:
        key = (str(plan.device), direction)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = Ring(plan.device, direction, self.max_staging_bytes)
        return ring

    def _layout(self, plan: CopyPlan, groups: LaunchGroups,
                sides: Sequence[str | None]) -> tuple[list[StagedJob], dict[str, RingLayout]]:
        """The staged jobs' chunks and regions, cached per (tables, sides, row counts,
        groups): a load of a seen shape reuses its staging tables (and the kernel's layout
        cache, keyed by tables, hits)."""
        picked = [(j, s) for j, s in enumerate(sides) if s is not None]
        if not picked:
            return [], {}
        try:
            hash(groups)
        except TypeError:  # lists (auto's sub-groups): a tuple of them keys the same layout
            groups = tuple(map(tuple, groups))
        key = (groups, str(plan.device), self.max_staging_bytes,
               tuple((weakref.ref(plan.jobs[j].src), weakref.ref(plan.jobs[j].dst), s,
                      plan.jobs[j].num_rows) for j, s in picked))
        found = self._layouts.get(key)
        if found is None:
            found = self._build_layout(plan, groups, picked)
            self._layouts.put(key, found)
        return found

    def _build_layout(self, plan: CopyPlan, groups: LaunchGroups, picked: list[tuple[int, str]]
                      ) -> tuple[list[StagedJob], dict[str, RingLayout]]:
        seen = layer_groups(groups, len(plan.jobs))
        used = {"h2d": 0, "d2h": 0}
        stages: list[StagedJob] = []
        for j, side in picked:
            if not seen[j]:
                continue  # no group names a layer of it
            direction = "h2d" if side == "src" else "d2h"
            st = plan_job(j, plan.jobs[j], side, seen[j], self._ring(plan, direction),
                          used[direction])
            if st is not None:  # else over the ring's bytes: the kernel copies it directly
                used[direction] = region_end(st)
                stages.append(st)
        rings = {}
        for direction, side in (("h2d", "src"), ("d2h", "dst")):
            mine = [(st, getattr(plan.jobs[st.job], side)) for st in stages if st.ring == direction]
            if mine:
                rings[direction] = ring_layout(self._ring(plan, direction), mine, len(groups))
        return stages, rings

    def _dma(self, work: RingWork, begin: int, end: int) -> None:
        pieces = work.pieces[:, begin:end]
        self.copies += dma(pieces, work.ring.stream, work.ring.device, self.batch)
        self.pieces += pieces.shape[1]

    def _record(self, ring: Ring, event: int, stream: int) -> None:
        if ring.device.type == "cuda":
            from transfer_kernels import cudart
            cudart.event_record(event, stream)
        self.records += 1

    def _wait(self, ring: Ring, stream: int, event: int) -> None:
        if ring.device.type == "cuda":
            from transfer_kernels import cudart
            cudart.stream_wait_event(stream, event)
        self.waits += 1


_ARANGE = torch.arange(0)


def _arange(n: int) -> torch.Tensor:
    """Rows ``0..n-1`` as an int64 CPU tensor (a view of one cached range)."""
    global _ARANGE
    if _ARANGE.numel() < n:
        _ARANGE = torch.arange(max(n, 2 * _ARANGE.numel()), dtype=torch.int64)
    return _ARANGE[:n]
