"""The ``"auto"`` backend: picks a backend per job from its piece size and run count.

Rule (thresholds in :mod:`transfer_kernels.tuning`)::

    plan on CUDA, triton importable, host sides pinned:
        piece_bytes >= COPY_ENGINE_MIN_PIECE_BYTES   -> copy_engine
        otherwise                                    -> triton
    plan on CUDA otherwise                           -> copy_engine
    plan on CPU:
        piece_bytes >= CPU_COPY_ENGINE_MIN_PIECE_BYTES -> copy_engine
        otherwise                                    -> torch

``piece_bytes`` is the mean piece one copy of the copy engine would move, over the
job's buffers: row bytes times the mean run length (on CUDA only where both sides are
dense; a strided run is copied row by row there). A mean, not a minimum, so a tiny
scale buffer does not drag a pool's large data buffer off the copy engine. Jobs sent to
one backend share one launch of it.
"""
from __future__ import annotations

import importlib.util

from transfer_kernels import tuning
from transfer_kernels.base import CopyBackend, PreparedPlan
from transfer_kernels.copy_engine import CopyEngineBackend
from transfer_kernels.plan import CopyPlan, LaunchGroups, PlannedJob
from transfer_kernels.torch_ref import TorchBackend
from transfer_kernels.triton_backend import TritonBackend


class AutoBackend(CopyBackend):
    """``"auto"``: routes each job to ``triton``, ``copy_engine`` or ``torch``.

    ``launches`` counts the launches of the inner backends it used (each inner backend
    also counts its own).
    """

    name = "auto"

    def __init__(self, triton: TritonBackend | None = None,
                 copy_engine: CopyEngineBackend | None = None,
                 torch_ref: TorchBackend | None = None) -> None:
        super().__init__()
        self.inner: dict[str, CopyBackend] = {
            "triton": triton or TritonBackend(),
            "copy_engine": copy_engine or CopyEngineBackend(),
            "torch": torch_ref or TorchBackend(),
        }

    def execute(self, plan: CopyPlan) -> None:
        """Route, then run each inner backend once on its jobs (see :class:`CopyBackend`)."""
        if plan.is_empty:
            return
        routed: dict[str, list[PlannedJob]] = {}
        for job in plan.jobs:
            if job.num_rows and job.layers:
                routed.setdefault(choose(job, plan), []).append(job)
        subplans = [(self.inner[name], plan.subset(jobs)) for name, jobs in routed.items()]
        for backend, sub in subplans:  # check all before copying anything
            backend.check(sub)
        for backend, sub in subplans:
            backend.execute(sub)
            self.launches += 1

    def prepare(self, plan: CopyPlan, groups: LaunchGroups) -> PreparedPlan:
        """Route every job once, then prepare each inner backend on its jobs' groups."""
        route, names = {}, {}
        for j, job in enumerate(plan.jobs):
            if job.num_rows and job.layers:
                name = choose(job, plan)
                route[j] = (name, len(names.setdefault(name, [])))
                names[name].append(j)
        sub_groups: dict[str, list[list[tuple[int, int]]]] = {n: [] for n in names}
        for group in groups:
            for parts in sub_groups.values():
                parts.append([])
            for j, layer in group:
                if j in route:
                    name, local = route[j]
                    sub_groups[name][-1].append((local, layer))
        subplans = {n: plan.subset(plan.jobs[j] for j in js) for n, js in names.items()}
        for n, sub in subplans.items():  # check all before preparing anything
            self.inner[n].check(sub)
        return AutoLaunches(self, [self.inner[n].prepare(subplans[n], sub_groups[n])
                                   for n in names], len(groups))

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
    """The backend name :class:`AutoBackend` uses for ``job`` (module docstring rule)."""
    on_cpu = job.src_rows.device.type == "cpu" and job.dst_rows.device.type == "cpu"
    # Device indices are not read back (that would sync): assume every row is its own run.
    num_runs = max(1, len(job.runs().lengths) if on_cpu else job.num_rows)
    if plan.device.type == "cpu":
        piece = piece_bytes(job, num_runs, dense_only=False)
        return "copy_engine" if piece >= tuning.CPU_COPY_ENGINE_MIN_PIECE_BYTES else "torch"
    host_ok = all(t.device.type != "cpu" or t.is_pinned for t in (job.src, job.dst))
    if not (host_ok and triton_available()):
        return "copy_engine"
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
