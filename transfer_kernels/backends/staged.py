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

The host work of a load does not grow with its layers or groups beyond one pass over its
pieces: the layout of a shape — (launch groups, device, per job: both tables, row count,
layers) — is built once and cached (``StagedLayout``: staging tables, every piece's fixed
fields, sorted by issuing group); a load of a seen shape fills in its host rows' addresses
in one vectorized step per ring, the kernel uploads its indices once, and each group's
launch issues its slice of the pieces in one call.

On a CPU plan the same steps run in program order: memmoves for the DMA, no-ops for the
events (counted all the same: ``copies``, ``records``, ``waits`` are what the CUDA path
would issue).
"""
from __future__ import annotations

import weakref
from typing import NamedTuple, Sequence

import numpy as np
import torch

from transfer_kernels import tuning
from transfer_kernels.backends.base import CopyBackend, Launches
from transfer_kernels.backends.cache import Lru, same_tables, table_refs
from transfer_kernels.backends.ring import DmaQueue, Ring
from transfer_kernels.backends.staged_launches import StagedLaunches
from transfer_kernels.backends.staging import (RingLayout, StagedJob, host_side, layer_groups,
                                               page_piece_bytes, region_end, ring_layout, ring_work,
                                               stage_job)
from transfer_kernels.rows import CopyPlan, LaunchGroups, PlannedJob, RowTable


class StagedLayout(NamedTuple):
    """What every load of one shape reuses (``StagedBackend._layout``)."""

    refs: tuple[tuple[weakref.ref, weakref.ref], ...]  # per job (src, dst): verifies a hit
    swaps: tuple[tuple[int, RowTable, torch.Tensor, bool], ...]  # (job, staging, 0..n-1, h2d)
    rings: tuple[RingLayout, ...]
    stages: tuple[StagedJob, ...]  # for inspection (bench/dma_plan.py)


class StagedBackend(CopyBackend):
    """``"dma"``: stages page chunks of ``page_first`` host pools (module docstring).

    Attributes:
        dma: the DMA calls and event ordering (`ring.DmaQueue`), with their counts
            (``copies``, ``pieces``, ``records``, ``waits`` read them).
        built: shapes laid out (layout cache misses); for tests.
    """

    name = "dma"
    # int8 host pages are staged like any other (the ring holds the host's bytes); the
    # staging table carries the host's codec, so the kernel converts from or into it.
    converts = True

    def __init__(self, kernel: CopyBackend | None = None,
                 min_piece_bytes: int = 1,
                 max_staging_bytes: int = tuning.DMA_STAGING_MAX_BYTES,
                 batch: bool | None = None,
                 window_growth: int = tuning.DMA_WINDOW_GROWTH) -> None:
        """Args:
            kernel: the backend that scatters, gathers and copies the unstaged jobs;
                ``None``: ``"triton"`` (under the interpreter on a CPU plan).
            min_piece_bytes: a job is staged when :func:`page_piece_bytes` is at least
                this; by default every job that can be.
            max_staging_bytes: bytes of each staging ring (one per device and direction).
            batch: use ``cudaMemcpyBatchAsync``; ``None`` means when the runtime has it.
            window_growth: 1: one DMA call per launch group; k > 1: one per window of
                groups, windows growing k-fold (``staging.window_ends``).

        Raises:
            ValueError: ``window_growth`` is not an int >= 1.
        """
        if isinstance(window_growth, bool) or not isinstance(window_growth, int) \
                or window_growth < 1:
            raise ValueError(f"window_growth: must be an int >= 1, got {window_growth!r}")
        super().__init__()
        if kernel is None:
            from transfer_kernels.backends.triton import TritonBackend
            kernel = TritonBackend()
        self.kernel, self.min_piece_bytes = kernel, min_piece_bytes
        self.max_staging_bytes, self.window_growth = max_staging_bytes, window_growth
        self.dma = DmaQueue(batch)
        self.built = 0
        self._rings: dict[tuple[str, str], Ring] = {}
        self._layouts = Lru(64)

    @property
    def copies(self) -> int:
        """DMA calls issued."""
        return self.dma.copies

    @property
    def pieces(self) -> int:
        """Pieces the DMA calls moved."""
        return self.dma.pieces

    @property
    def records(self) -> int:
        """Event records issued (CUDA; counted on CPU too)."""
        return self.dma.records

    @property
    def waits(self) -> int:
        """Stream waits issued (CUDA; counted on CPU too)."""
        return self.dma.waits

    @property
    def held_bytes(self) -> int:
        """Staging bytes allocated (rings used so far)."""
        return sum(r.nbytes for r in self._rings.values() if r.allocated)

    def check(self, plan: CopyPlan) -> None:
        """The kernel backend's check (the unstaged jobs and the scatter go through it;
        converting jobs through its quant backend, `CopyBackend.check_split`)."""
        self.kernel.check_split(plan)

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

    def prepare(self, plan: CopyPlan, groups: LaunchGroups,
                sides: Sequence[str | None] | None = None) -> Launches:
        """Lay the staged jobs out in the rings and prepare the kernel's launches; nothing
        is copied until a group launches (module docstring). The plan is checked when its
        shape is new (the check reads the tables only: a seen shape passed it).

        Args:
            sides: per job, the side to stage (``None``: straight to the kernel); by
                default :meth:`sides` (``"auto"`` passes the choice it made).
        """
        staged = self._layout(plan, groups, sides)
        jobs = plan.jobs
        work = {lay.ring.direction: ring_work(lay, _host_rows(jobs, lay)) for lay in staged.rings}
        if staged.swaps:
            jobs = list(jobs)
            for j, staging, local, h2d in staged.swaps:  # the kernel's side of the ring
                job = jobs[j]
                jobs[j] = (PlannedJob(staging, job.dst, local, job.dst_rows, job.layers) if h2d
                           else PlannedJob(job.src, staging, job.src_rows, local, job.layers))
            plan = plan.subset(jobs)
        return StagedLaunches(self, self.dma, self.kernel.prepare(plan, groups), work, len(groups))

    def _ring(self, plan: CopyPlan, direction: str) -> Ring:
        key = (str(plan.device), direction)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = Ring(plan.device, direction, self.max_staging_bytes)
        return ring

    def _layout(self, plan: CopyPlan, groups: LaunchGroups,
                sides: Sequence[str | None] | None) -> StagedLayout:
        """The plan's :class:`StagedLayout`, cached per (groups, device, sides, per job: both
        tables, rows, layers, where the rows are). Tables are keyed by id and a hit is
        verified against weak references: a new table at a reused id is a miss, and no
        pool is kept alive."""
        try:
            hash(groups)
        except TypeError:  # lists (tests, a caller's own groups): a tuple of them keys the same
            groups = tuple(map(tuple, groups))
        jobs = plan.jobs
        key = (groups, plan.device, sides if sides is None else tuple(sides),
               tuning.DMA_PIECE_BYTES,
               tuple([(id(j.src), id(j.dst), j.src_rows.numel(), len(j.layers),
                       j.src_rows.is_cuda, j.dst_rows.is_cuda) for j in jobs]))
        found = self._layouts.get(key)
        if found is not None and same_tables(jobs, found.refs):
            return found
        found = self._build_layout(plan, groups, sides)
        self._layouts.put(key, found)
        return found

    def _build_layout(self, plan: CopyPlan, groups: LaunchGroups,
                      sides: Sequence[str | None] | None) -> StagedLayout:
        """A new shape: check the plan, then lay out every staged job's chunks and regions."""
        self.check(plan)
        self.built += 1
        jobs = plan.jobs
        if sides is None:
            sides = self.sides(plan)
        else:  # host rows on the device cannot be read without a sync: not staged
            sides = [s if s is not None and getattr(job, f"{s}_rows").device.type == "cpu"
                     else None for job, s in zip(jobs, sides)]
        seen = layer_groups(groups, len(jobs))
        used = {"h2d": 0, "d2h": 0}
        stages: list[StagedJob] = []
        for j, side in enumerate(sides):
            if side is None or not seen[j]:
                continue  # not staged, or no group names a layer of it
            direction = "h2d" if side == "src" else "d2h"
            st = stage_job(j, jobs[j], side, seen[j], self._ring(plan, direction), used[direction])
            if st is not None:  # else over the ring's bytes: the kernel copies it directly
                used[direction] = region_end(st)
                stages.append(st)
        rings = []
        for direction, side in (("h2d", "src"), ("d2h", "dst")):
            mine = [(st, getattr(jobs[st.job], side)) for st in stages if st.ring == direction]
            if mine:
                rings.append(ring_layout(self._ring(plan, direction), mine, len(groups),
                                         self.window_growth))
        swaps = tuple((st.job, st.staging, torch.arange(st.staging.num_rows), st.ring == "h2d")
                      for st in stages)
        return StagedLayout(table_refs(jobs), swaps, tuple(rings), tuple(stages))


def _host_rows(jobs: Sequence[PlannedJob], lay: RingLayout) -> np.ndarray:
    """The host rows of ``lay``'s jobs, concatenated (one torch call), as numpy."""
    rows = [jobs[j].src_rows for j in lay.jobs] if lay.ring.direction == "h2d" else \
        [jobs[j].dst_rows for j in lay.jobs]
    return (torch.cat(rows) if len(rows) > 1 else rows[0]).numpy()
