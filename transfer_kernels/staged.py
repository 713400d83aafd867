"""The ``"dma"`` backend: whole pages by DMA through a device staging buffer, then a
device-side scatter (H2D) — or a gather, then whole pages by DMA (D2H).

A ``page_first`` host table holds all layers of a row back to back (``RowTable.page_span``):
DeepSeek-V4's rows span 54 KB-4.6 MB that way, where one layer's row is 1.7-75 KB. A
*staged* job moves those spans, a run of consecutive host rows per piece, in ONE batched
``cudaMemcpyBatchAsync`` (no SM involved), between the host and a device staging table of
the same ``page_first`` geometry; the kernel backend then copies staging rows ``0..n-1``
to or from the device pool's rows (HBM to HBM)::

    H2D   host rows r0 r1 ..  --DMA, one call-->  staging [n, L, RB]  --kernel-->  device rows
    D2H   device rows  --kernel (gather)-->  staging [n, L, RB]  --DMA, one call-->  host rows

Every other job of the plan goes straight through the kernel backend in the same launches
(one launch per group carries both the scatter and the direct copies). On a CPU plan the
same path runs with numpy copies for the DMA.

Staging buffers are kept per (host table, direction, stream) and grow to the largest batch
(at most ``max_staging_bytes`` in all; a job that would exceed it is not staged). All uses
of one buffer are on one stream, so a batch's DMA into it is ordered after the previous
batch's scatter out of it, without any host synchronization.
"""
from __future__ import annotations

import weakref
from typing import NamedTuple, Sequence

import numpy as np
import torch

from transfer_kernels import tuning
from transfer_kernels.base import CopyBackend, PreparedPlan
from transfer_kernels.copy_engine import _cut_at_chunks
from transfer_kernels.plan import CopyPlan, LaunchGroups, PlannedJob
from transfer_kernels.quant import prepare_split
from transfer_kernels.rows import runs
from transfer_kernels.table import RowTable


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
    """Mean bytes of one DMA piece of ``job`` staged on ``side``: span x mean run length."""
    rows = (job.src_rows if side == "src" else job.dst_rows).numpy()
    num_runs = 1 + int(np.count_nonzero(np.diff(rows) != 1)) if rows.size else 1
    return getattr(job, side).page_span()[1] * rows.size // num_runs


class _Stage(NamedTuple):
    """One staged job: its side, pieces (host offset, staging offset, bytes) and table."""

    side: str
    pieces: np.ndarray  # [3, n] int64
    host_base: int  # address of the host table's row 0
    host: np.ndarray | None  # CPU plan: the host span view as flat bytes (numpy)
    staging: RowTable
    flat: torch.Tensor  # the staging buffer, flat


class StagedBackend(CopyBackend):
    """``"dma"``: stages whole pages of ``page_first`` host pools (module docstring).

    Attributes:
        copies / pieces: DMA calls issued and pieces they moved.
    """

    name = "dma"

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
            max_staging_bytes: device bytes all staging buffers may take together.
            batch: use ``cudaMemcpyBatchAsync``; ``None`` means when the runtime has it.
        """
        super().__init__()
        if kernel is None:
            from transfer_kernels.triton_backend import TritonBackend
            kernel = TritonBackend()
        self.kernel, self.min_piece_bytes = kernel, min_piece_bytes
        self.max_staging_bytes, self.batch = max_staging_bytes, batch
        self.copies = self.pieces = 0
        self._buffers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._held = 0  # staging bytes allocated

    def check(self, plan: CopyPlan) -> None:
        """The kernel backend's check (the unstaged jobs and the scatter go through it)."""
        self.kernel.check(plan)

    def stages(self, job: PlannedJob, plan: CopyPlan) -> str | None:
        """The side ``job`` is staged on, or ``None`` when it goes straight to the kernel."""
        if not job.num_rows or not job.layers or len(job.layers) != job.src.num_layers:
            return None
        side = host_side(job, plan)
        if side is None or page_piece_bytes(job, side) < self.min_piece_bytes:
            return None
        return side

    def sides(self, plan: CopyPlan) -> list[str | None]:
        """Per job: the side it is staged on (:meth:`stages`)."""
        return [self.stages(job, plan) for job in plan.jobs]

    def _execute(self, plan: CopyPlan, sides: Sequence[str | None] | None = None) -> None:
        kernel_plan, stages = self._split(plan, sides)
        h2d = [s for s in stages if s.side == "src"]
        if h2d:
            self._dma(h2d, plan.device, to_host=False)
        self.kernel.execute(kernel_plan)
        d2h = [s for s in stages if s.side == "dst"]
        if d2h:
            self._dma(d2h, plan.device, to_host=True)

    def prepare(self, plan: CopyPlan, groups: LaunchGroups,
                sides: Sequence[str | None] | None = None) -> PreparedPlan:
        """Stage nothing yet: the first launch issues the H2D DMA before its scatter; the
        last launch issues the D2H DMA after the gathers.

        Args:
            sides: per job, the side to stage (``None``: straight to the kernel); by
                default :meth:`sides` (``"auto"`` passes the choice it made).
        """
        if plan.has_quant:  # converting jobs: staged int8 pages (transfer_kernels.quant_staged)
            return prepare_split(self, plan, groups)
        self.check(plan)
        kernel_plan, stages = self._split(plan, sides)
        return StagedLaunches(self, self.kernel.prepare(kernel_plan, groups), stages,
                              plan.device, len(groups))

    def _make_quant_backend(self, device: torch.device) -> CopyBackend:
        """int8 host pages staged by DMA, converted by the kernel (`quant_staged`)."""
        from transfer_kernels.quant_staged import StagedQuantBackend
        return StagedQuantBackend(self, device)

    def _split(self, plan: CopyPlan, sides: Sequence[str | None] | None
               ) -> tuple[CopyPlan, list[_Stage]]:
        """The kernel's plan (staged jobs become scatters or gathers on their staging
        table, in place) and the staged jobs' DMA pieces."""
        jobs, stages, budget = list(plan.jobs), [], self.max_staging_bytes
        for j, (job, side) in enumerate(zip(plan.jobs, sides or self.sides(plan))):
            if side is None:
                continue
            stage = self._stage(job, side, plan.device, budget)
            if stage is None:
                continue
            budget -= job.num_rows * getattr(job, side).page_span()[1]
            stages.append(stage)
            local = _arange(job.num_rows)
            jobs[j] = (PlannedJob(job.src, stage.staging, job.src_rows, local, job.layers)
                       if side == "dst" else
                       PlannedJob(stage.staging, job.dst, local, job.dst_rows, job.layers))
        return plan.subset(jobs), stages

    def _stage(self, job: PlannedJob, side: str, device: torch.device, budget: int) -> _Stage | None:
        """The job's staging table (grown if needed) and DMA pieces; ``None`` over budget."""
        host = getattr(job, side)
        rows_view, span = host.page_span()
        if job.num_rows * span > budget:
            return None
        buffers = self._buffers.setdefault(host, {})
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (side, stream)
        staging, flat = buffers.get(key, (None, None))
        if staging is None or staging.num_rows < job.num_rows:
            grow = max(job.num_rows, 2 * (staging.num_rows if staging else 0))
            extra = grow * span - (flat.numel() if flat is not None else 0)
            if self._held + extra > self.max_staging_bytes:
                return None
            staging, flat = _staging_table(host, grow, device)
            self._held += extra
            buffers[key] = (staging, flat)
        host_rows = job.src_rows if side == "src" else job.dst_rows
        r = runs(host_rows, _arange(job.num_rows))
        s0, d0, k = (np.asarray(x, dtype=np.int64) for x in r)
        # no piece across a pinned registration chunk (rows never straddle one)
        s0, d0, k = _cut_at_chunks(host, staging, 0, 0, s0, d0, k)
        pieces = np.stack([s0 * span, d0 * span, k * span])
        host_np = rows_view.numpy().reshape(-1) if device.type == "cpu" else None
        return _Stage(side, pieces, int(host.ptrs[0, 0]), host_np, staging, flat)

    def _dma(self, stages: Sequence[_Stage], device: torch.device, to_host: bool) -> None:
        """One DMA call for every piece of ``stages`` (numpy copies on a CPU plan)."""
        if device.type == "cpu":
            for st in stages:
                stage_np = st.flat.numpy()
                for h, s, n in st.pieces.T.tolist():
                    if to_host:
                        st.host[h:h + n] = stage_np[s:s + n]
                    else:
                        stage_np[s:s + n] = st.host[h:h + n]
                self.pieces += st.pieces.shape[1]
            self.copies += 1
            return
        from transfer_kernels import cudart

        host = np.concatenate([st.pieces[0] + st.host_base for st in stages])
        staged = np.concatenate([st.pieces[1] + st.flat.data_ptr() for st in stages])
        size = np.concatenate([st.pieces[2] for st in stages])
        dst, src = (host, staged) if to_host else (staged, host)
        stream = torch.cuda.current_stream(device).cuda_stream
        self.pieces += size.size
        if stream != 0 and (cudart.batch_available() if self.batch is None else self.batch):
            cudart.memcpy_batch_async(dst, src, size, stream)
            self.copies += 1
        else:  # the batched call refuses the legacy default stream (handle 0)
            for d, s, n in zip(dst.tolist(), src.tolist(), size.tolist()):
                cudart.memcpy_async(d, s, n, stream)
            self.copies += size.size


class StagedLaunches(PreparedPlan):
    """The kernel's prepared launches with the DMA before the first (H2D) and after the
    last (D2H): launch every group once, in any order."""

    def __init__(self, backend: StagedBackend, inner: PreparedPlan, stages: list[_Stage],
                 device: torch.device, num_groups: int) -> None:
        self.backend, self.inner, self.device = backend, inner, device
        self.h2d = [s for s in stages if s.side == "src"]
        self.d2h = [s for s in stages if s.side == "dst"]
        self._left = num_groups

    @property
    def num_groups(self) -> int:
        return self.inner.num_groups

    def launch(self, group: int) -> None:
        if self.h2d:
            stages, self.h2d = self.h2d, []
            self.backend._dma(stages, self.device, to_host=False)
        self.inner.launch(group)
        self._left -= 1
        if self._left == 0 and self.d2h:
            self.backend._dma(self.d2h, self.device, to_host=True)
        self.backend.launches += 1


def _staging_table(host: RowTable, num_rows: int, device: torch.device
                   ) -> tuple[RowTable, torch.Tensor]:
    """A device table of ``host``'s page_first geometry over a new ``[num_rows, span]``
    buffer (allocated on the current stream), and the buffer."""
    span = host.page_span()[1]
    flat = torch.empty(num_rows * span, dtype=torch.uint8, device=device)
    rows = flat.view(num_rows, host.num_layers, sum(host.row_bytes))
    offsets = np.cumsum((0,) + host.row_bytes[:-1]).tolist()
    views = [[rows[:, layer, o:o + n] for o, n in zip(offsets, host.row_bytes)]
             for layer in range(host.num_layers)]
    return RowTable.from_views(views, f"{host.name}.staging"), flat


_ARANGE = torch.arange(0)


def _arange(n: int) -> torch.Tensor:
    """Rows ``0..n-1`` as an int64 CPU tensor (a view of one cached range)."""
    global _ARANGE
    if _ARANGE.numel() < n:
        _ARANGE = torch.arange(max(n, 2 * _ARANGE.numel()), dtype=torch.int64)
    return _ARANGE[:n]
