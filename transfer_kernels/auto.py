"""The ``"auto"`` backend: picks a path per job from its piece sizes and run count.

Rule (thresholds in :mod:`transfer_kernels.tuning`)::

    plan on CUDA, triton importable, host sides pinned:
        page_first host side, all layers, page piece >= DMA_MIN_PIECE_BYTES  -> dma
        piece_bytes >= COPY_ENGINE_MIN_PIECE_BYTES                           -> copy_engine
        otherwise                                                            -> triton
    plan on CUDA otherwise                                                   -> copy_engine
    plan on CPU:
        piece_bytes >= CPU_COPY_ENGINE_MIN_PIECE_BYTES -> copy_engine
        otherwise                                    -> torch

``page piece`` is what one DMA piece of the staged path moves: all layers of a run of
consecutive host rows (``staged.page_piece_bytes``). ``piece_bytes`` is the mean piece one
copy of the copy engine would move, over the job's buffers: row bytes times the mean run
length (on CUDA only where both sides are dense; a strided run is copied row by row
there). A mean, not a minimum, so a tiny scale buffer does not drag a pool's large data
buffer off the copy engine. The ``dma`` and ``triton`` jobs share the kernel's launches
(the staged backend scatters and copies the others in one launch per group); the
``copy_engine`` jobs share one launch of it.
"""
from __future__ import annotations

import importlib.util

import torch

from transfer_kernels import tuning
from transfer_kernels.base import CopyBackend, PreparedPlan
from transfer_kernels.copy_engine import CopyEngineBackend
from transfer_kernels.plan import CopyPlan, LaunchGroups, PlannedJob
from transfer_kernels.quant import execute_split, prepare_split
from transfer_kernels.staged import StagedBackend, host_side, page_piece_bytes
from transfer_kernels.torch_ref import TorchBackend
from transfer_kernels.triton_backend import TritonBackend

KERNEL = ("triton", "dma")  # choices served by the staged backend's kernel launches


class AutoBackend(CopyBackend):
    """``"auto"``: routes each job to the kernel (directly or staged), the copy engine or
    torch.

    ``launches`` counts the launches of the inner backends it used (each inner backend
    also counts its own).
    """

    name = "auto"

    def __init__(self, triton: TritonBackend | None = None,
                 copy_engine: CopyEngineBackend | None = None,
                 torch_ref: TorchBackend | None = None) -> None:
        """Args:
            triton: the kernel backend (its ``max_programs`` bounds every kernel launch of
                this backend, the staged path's included).
        """
        super().__init__()
        triton = triton or TritonBackend()
        self.inner: dict[str, CopyBackend] = {
            "triton": triton,
            "copy_engine": copy_engine or CopyEngineBackend(),
            "torch": torch_ref or TorchBackend(),
            "dma": StagedBackend(triton, min_piece_bytes=tuning.DMA_MIN_PIECE_BYTES),
        }

    def _route(self, plan: CopyPlan) -> dict[str, tuple[list[int], list[str | None]]]:
        """Backend name -> (job indices, staged side per job: only for ``"dma"``)."""
        routed: dict[str, tuple[list[int], list[str | None]]] = {}
        for j, job in enumerate(plan.jobs):
            if job.num_rows and job.layers:
                name = choose(job, plan)
                side = None
                if name in KERNEL:
                    side = host_side(job, plan) if name == "dma" else None
                    name = "dma"
                jobs, sides = routed.setdefault(name, ([], []))
                jobs.append(j)
                sides.append(side)
        return routed

    def execute(self, plan: CopyPlan) -> None:
        """Route, then run each inner backend once on its jobs (see :class:`CopyBackend`)."""
        if plan.is_empty:
            return
        if plan.has_quant:  # converting jobs: to the quant backend (transfer_kernels.quant)
            execute_split(self, plan)
            return
        routed = self._route(plan)
        subplans = {n: plan.subset(plan.jobs[j] for j in js) for n, (js, _) in routed.items()}
        for n, sub in subplans.items():  # check all before copying anything
            self.inner[n].check(sub)
        for n, sub in subplans.items():
            if n == "dma":
                self.inner[n].launches += 1
                self.inner[n]._execute(sub, routed[n][1])
            else:
                self.inner[n].execute(sub)
            self.launches += 1

    def prepare(self, plan: CopyPlan, groups: LaunchGroups) -> PreparedPlan:
        """Route every job once, then prepare each inner backend on its jobs' groups."""
        if plan.has_quant:
            return prepare_split(self, plan, groups)
        routed = self._route(plan)
        local = {j: (n, i) for n, (js, _) in routed.items() for i, j in enumerate(js)}
        sub_groups: dict[str, list[list[tuple[int, int]]]] = {n: [] for n in routed}
        for group in groups:
            for parts in sub_groups.values():
                parts.append([])
            for j, layer in group:
                if j in local:
                    name, i = local[j]
                    sub_groups[name][-1].append((i, layer))
        subplans = {n: plan.subset(plan.jobs[j] for j in js) for n, (js, _) in routed.items()}
        for n, sub in subplans.items():  # check all before preparing anything
            self.inner[n].check(sub)
        prepared = [self.inner[n].prepare(subplans[n], sub_groups[n], routed[n][1]) if n == "dma"
                    else self.inner[n].prepare(subplans[n], sub_groups[n]) for n in routed]
        return AutoLaunches(self, prepared, len(groups))

    def _make_quant_backend(self, device: torch.device) -> CopyBackend:
        """Converting jobs: on CUDA the dma path's (int8 pages staged where this backend would
        stage a job, ``tuning.DMA_MIN_PIECE_BYTES``; the fused kernel reads the others), torch
        on CPU."""
        if device.type == "cuda" and triton_available():
            return self.inner["dma"].quant_backend(device)
        return self.inner["torch"].quant_backend(device)

    def _execute(self, plan: CopyPlan) -> None:  # pragma: no cover - execute overrides
        raise NotImplementedError


class AutoLaunches(PreparedPlan):
    """Each launch group runs the matching group of every inner backend used."""

    def __init__(self, auto: AutoBackend, inner: list[PreparedPlan], num_groups: int) -> None:
        self.auto, self.inner, self._num_groups = auto, inner, num_groups

    @property
    def num_groups(self) -> int:
        return self._num_groups

    def launch(self, group: int) -> None:
        for prepared in self.inner:
            prepared.launch(group)
        self.auto.launches += 1


def triton_available() -> bool:
    """True when the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def choose(job: PlannedJob, plan: CopyPlan) -> str:
    """The path :class:`AutoBackend` uses for ``job`` (module docstring rule)."""
    on_cpu = job.src_rows.device.type == "cpu" and job.dst_rows.device.type == "cpu"
    # Device indices are not read back (that would sync): assume every row is its own run.
    num_runs = max(1, len(job.runs().lengths) if on_cpu else job.num_rows)
    if plan.device.type == "cpu":
        piece = piece_bytes(job, num_runs, dense_only=False)
        return "copy_engine" if piece >= tuning.CPU_COPY_ENGINE_MIN_PIECE_BYTES else "torch"
    host_ok = all(t.device.type != "cpu" or t.is_pinned for t in (job.src, job.dst))
    if not (host_ok and triton_available()):
        return "copy_engine"
    if on_cpu and len(job.layers) == job.src.num_layers:
        side = host_side(job, plan)
        if side is not None and page_piece_bytes(job, side) >= tuning.DMA_MIN_PIECE_BYTES:
            return "dma"
    piece = piece_bytes(job, num_runs, dense_only=True)
    return "copy_engine" if piece >= tuning.COPY_ENGINE_MIN_PIECE_BYTES else "triton"


def piece_bytes(job: PlannedJob, num_runs: int, dense_only: bool) -> int:
    """Mean bytes per copy-engine copy of ``job`` over its buffers.

    Args:
        job: the job.
        num_runs: its number of runs (>= 1).
        dense_only: count whole runs only where both sides' rows are back to back.
    """
    pieces = []
    for b, nbytes in enumerate(job.src.row_bytes):
        dense = all(t.row_strides[b] == nbytes for t in (job.src, job.dst))
        whole_runs = dense or not dense_only
        pieces.append(nbytes * job.num_rows // num_runs if whole_runs else nbytes)
    return sum(pieces) // len(pieces)
