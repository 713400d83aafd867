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
is left goes straight through the kernel. Every size class lays its regions out from the
ring's first byte, so a load holds the ring from its first launch to its last
(`launches.take`): a load of another thread waits on the host (CUDA: and its first DMA or
gather waits on the device for the device work that used the ring before); a later load
of the same thread takes the ring over, and the older load raises ``RuntimeError`` at its
next launch instead of racing it.

The host work of a load does not grow with its layers or groups beyond one pass over its
pieces: which side of a lane can be staged is decided once per route (`decide_lanes`), and
a size class's staging is laid out once (`lay_out` -> a `launches.Prepared` with the
staging tables, every piece's fixed fields sorted by issuing group (`staging.RingLayout`)
and the kernel's step); a load fills in its host rows' addresses in one vectorized step per
ring, the kernel uploads its indices once, and each group issues its slice of the pieces
in one call (the loop: `launches.Launches`).

On a CPU plan the same steps run in program order: memmoves for the DMA, no-ops for the
events (counted all the same: ``copies``, ``records``, ``waits`` are what the CUDA path
would issue).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from transfer_kernels import tuning
from transfer_kernels.backends.base import CopyBackend
from transfer_kernels.backends.launches import Prepared
from transfer_kernels.backends.ring import Ring
from transfer_kernels.backends.staging import (StagedJob, host_side, layer_groups, page_piece_bytes,
                                               region_end, ring_layout, stage_job)
from transfer_kernels.rows import CopyPlan, Lane, LaunchGroups, PlannedJob


class StagedBackend(CopyBackend):
    """``"dma"``: stages page chunks of ``page_first`` host pools (module docstring). Safe
    from any number of threads: a load holds its rings from its first launch to its last.

    Attributes:
        copies / pieces / records / waits: the DMA calls, pieces, event records and
            stream waits its rings issued (`launches.DmaQueue`; counted on the CPU too).
        built: size classes laid out (route cache misses); for tests.
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
        self.max_staging_bytes, self.window_growth, self.batch = max_staging_bytes, window_growth, batch
        self.built = 0
        self._rings: dict[tuple[str, str], Ring] = {}

    def _dma_total(self, field: str) -> int:
        return sum(getattr(r.dma, field) for r in list(self._rings.values()))

    copies = property(lambda self: self._dma_total("copies"), doc="DMA calls issued.")
    pieces = property(lambda self: self._dma_total("pieces"), doc="Pieces the DMA calls moved.")
    records = property(lambda self: self._dma_total("records"), doc="Event records (counted on the CPU too).")
    waits = property(lambda self: self._dma_total("waits"), doc="Stream waits (counted on the CPU too).")

    @property
    def held_bytes(self) -> int:
        """Staging bytes allocated (rings used so far)."""
        return sum(r.nbytes for r in list(self._rings.values()) if r.allocated)
    def check(self, plan: CopyPlan) -> None:
        """The kernel backend's check (the unstaged jobs and the scatter go through it;
        converting jobs through its quant backend, `CopyBackend.check_split`)."""
        self.kernel.check_split(plan)

    def decide_lanes(self, lanes: CopyPlan) -> tuple[str | None, ...]:
        """Per lane, the side its whole pages can be staged on (``None``: straight to the
        kernel), from its tables alone; the kernel's check of the lanes (once per route)."""
        self.check(lanes)
        return tuple(self.stage_side(job, lanes.device) for job in lanes.jobs)

    def stage_side(self, lane: Lane | PlannedJob, device: torch.device) -> str | None:
        """The side ``lane``'s whole pages can be staged on, or ``None``
        (`staging.host_side`, and a piece of at least ``min_piece_bytes``)."""
        if not lane.layers:
            return None
        side = host_side(lane, device)
        if side is None or (self.min_piece_bytes > 1
                            and page_piece_bytes(lane, side) < self.min_piece_bytes):
            return None
        return side

    def stages(self, job: PlannedJob, plan: CopyPlan) -> str | None:
        """The side ``job`` is staged on in ``plan``, or ``None`` when it goes straight to
        the kernel (no rows, or host rows on the device: reading them would synchronize)."""
        side = self.stage_side(job, plan.device) if job.num_rows else None
        if side is None or getattr(job, f"{side}_rows").device.type != "cpu":
            return None
        return side

    def sides(self, plan: CopyPlan) -> list[str | None]:
        """Per job: the side it is staged on (:meth:`stages`)."""
        return [self.stages(job, plan) for job in plan.jobs]

    def lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any = None,
                keep: bool = False, like: Prepared | None = None) -> Prepared:
        """A size class's staging: every staged job's chunks and regions in the rings, the
        fixed fields of every piece, and the kernel's preparation over the staging tables
        (module docstring). Nothing is copied until a group launches.

        Args:
            decided: per job, the side to stage (``None``: straight to the kernel), as
                :meth:`decide_lanes` (or ``"auto"``) decided; by default :meth:`sides`.
            like: another class's prepared object: its kernel preparation is offered to
                the kernel's (which shares what fits: staging tables are the class's own).
        """
        with self.lock:
            self.built += 1
            return self._lay_out(plan, groups, decided, keep, like)

    def _lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any, keep: bool,
                 like: Prepared | None) -> Prepared:
        jobs = plan.jobs
        if decided is None:
            sides = self.sides(plan)
        else:  # no rows, or host rows on the device (reading them would synchronize): not staged
            sides = [s if s is not None and job.num_rows and getattr(job, f"{s}_rows").device.type == "cpu"
                     else None for job, s in zip(jobs, decided)]
        stages = self._stage_jobs(plan, groups, sides)
        rings = []
        for direction, side in (("h2d", "src"), ("d2h", "dst")):
            mine = [(st, getattr(jobs[st.job], side)) for st in stages if st.ring == direction]
            if mine:
                rings.append(ring_layout(self._ring(plan, direction), mine, len(groups),
                                         self.window_growth))
        swaps = tuple((st.job, st.staging, torch.arange(st.staging.num_rows), st.ring == "h2d")
                      for st in stages)
        if swaps:  # the kernel's side of each staged job is its staging table
            kernel_jobs = list(jobs)
            for j, staging, local, h2d in swaps:
                job = jobs[j]
                kernel_jobs[j] = (PlannedJob(staging, job.dst, local, job.dst_rows, job.layers) if h2d
                                  else PlannedJob(job.src, staging, job.src_rows, local, job.layers))
            plan = plan.subset(kernel_jobs)
        # the kernel's preparation over the staging tables; ``like`` is another class's
        # prepared object of this backend, whose kernel step the kernel may share from
        inner = self.kernel.lay_out(plan, groups, None, keep, like)
        return Prepared(inner.kernel, tuple(rings), swaps, tuple(stages)).count_by(self.launch_count)

    def _stage_jobs(self, plan: CopyPlan, groups: LaunchGroups,
                    sides: Sequence[str | None]) -> list[StagedJob]:
        """Each staged job's chunks and its region in its direction's ring; a job beyond
        what is left of the ring is not staged (the kernel copies it directly)."""
        seen = layer_groups(groups, len(plan.jobs))
        used = {"h2d": 0, "d2h": 0}
        stages: list[StagedJob] = []
        for j, side in enumerate(sides):
            if side is None or not seen[j]:
                continue  # not staged, or no group names a layer of it
            direction = "h2d" if side == "src" else "d2h"
            st = stage_job(j, plan.jobs[j], side, seen[j], self._ring(plan, direction), used[direction])
            if st is not None:
                used[direction] = region_end(st)
                stages.append(st)
        return stages

    def _ring(self, plan: CopyPlan, direction: str) -> Ring:
        key = (str(plan.device), direction)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = Ring(plan.device, direction, self.max_staging_bytes, self.batch)
        return ring
