"""``"dma"`` for converting jobs: whole int8 host pages by DMA through a device staging table,
dequantized from it by the fused kernel (H2D); or quantized into it, then DMA'd (D2H)::

    H2D  int8 host rows --DMA, one call--> staging [n, L, RB] (int8 + scales) --dequantize--> device
    D2H  device rows --quantize--> staging [n, L, RB] --DMA, one call--> int8 host rows

The staging table has the host table's ``page_first`` geometry and codec; the DMA and its
buffers are the staged backend's own (`staged.StagedBackend`); the kernel is its kernel
backend's quant backend. A job that cannot be staged (not ``page_first``, not all layers,
over the staging budget) goes straight to that kernel (UVA reads of the host rows).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from transfer_kernels.base import CopyBackend, PreparedPlan
from transfer_kernels.plan import CopyPlan, LaunchGroups, PlannedJob
from transfer_kernels.staged import StagedBackend, StagedLaunches, _arange, host_side, page_piece_bytes


class StagedQuantBackend(CopyBackend):
    """Converting jobs of a `StagedBackend` (module docstring); counts its launches on it."""

    name = "dma_quant"
    converts = True

    def __init__(self, staged: StagedBackend, device: torch.device) -> None:
        super().__init__()
        self.staged = staged
        self.kernel = staged.kernel.quant_backend(device)

    def check(self, plan: CopyPlan) -> None:
        """The kernel's check (jobs left unstaged read the host through it)."""
        self.kernel.check(plan)

    def _execute(self, plan: CopyPlan) -> None:
        kernel_plan, stages = self._split(plan)
        h2d = [s for s in stages if s.side == "src"]
        if h2d:
            self.staged._dma(h2d, plan.device, to_host=False)
        self.kernel.execute(kernel_plan)
        d2h = [s for s in stages if s.side == "dst"]
        if d2h:
            self.staged._dma(d2h, plan.device, to_host=True)

    def prepare(self, plan: CopyPlan, groups: LaunchGroups) -> PreparedPlan:
        """The H2D DMA before the first launch, the D2H DMA after the last (`StagedLaunches`)."""
        self.check(plan)
        kernel_plan, stages = self._split(plan)
        return StagedLaunches(self.staged, self.kernel.prepare(kernel_plan, groups), stages,
                              plan.device, len(groups))

    def _split(self, plan: CopyPlan) -> tuple[CopyPlan, list]:
        """The kernel's plan (staged jobs convert from or into their coded staging table) and
        the staged jobs' DMA pieces."""
        jobs: list[PlannedJob] = list(plan.jobs)
        stages, budget = [], self.staged.max_staging_bytes
        for j, side in enumerate(self._sides(plan)):
            if side is None:
                continue
            job = plan.jobs[j]
            stage = self.staged._stage(job, side, plan.device, budget)
            if stage is None:
                continue
            host = getattr(job, side)
            budget -= job.num_rows * host.page_span()[1]
            stages.append(stage)
            staging = dataclasses.replace(stage.staging, codec=host.codec, _cache={})
            local = _arange(job.num_rows)
            jobs[j] = (PlannedJob(job.src, staging, job.src_rows, local, job.layers) if side == "dst"
                       else PlannedJob(staging, job.dst, local, job.dst_rows, job.layers))
        return plan.subset(jobs), stages

    def _sides(self, plan: CopyPlan) -> Sequence[str | None]:
        """Per job, its host side when it can be staged (the staged backend's rule)."""
        out = []
        for job in plan.jobs:
            whole = job.num_rows and job.layers and len(job.layers) == job.src.num_layers
            side = host_side(job, plan) if whole else None
            if side is not None and (getattr(job, side).codec is None
                                     or page_piece_bytes(job, side) < self.staged.min_piece_bytes):
                side = None
            out.append(side)
        return out
