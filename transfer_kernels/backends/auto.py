"""The ``"auto"`` backend: routes each job by a decision table, decided once per shape.

A job's path comes from :class:`transfer_kernels.auto_table.AutoTable` (the seed table
from the H100 measurements cited in :mod:`transfer_kernels.tuning`, or a measured one:
``bench/load_batch.py --calibrate`` writes it, ``HICACHE_AUTO_TABLE=PATH`` or
``AutoBackend(table=...)`` loads it). The traits it looks up are read from the job's two
tables and its row-count class only (``auto_table`` module docstring): no run analysis of
the rows. They are read once per route (`decide_lanes`: a controller's pool set and
direction, or the tables of a ``copy_rows`` call), and so is the decision when the table
does not bound job bytes (the seed does not); else each size class decides once, when it
is laid out. A load never decides.

Two conditions override the table on CUDA: a host side that is not pinned, or no
``triton`` to import, sends the job to ``copy_engine`` (the only path that can run it).

A converting job (int8 host rows, `transfer_kernels.quant.codec`) is decided in the same
terms and as often: on CUDA ``dma`` (int8 pages staged in the ring, converted by the
fused kernel from there) where the table would stage its traits, else the fused kernel
(``triton``); ``torch`` (`quant_torch`) on the CPU, and on CUDA where the kernel cannot run
it (no ``triton``, a host side not pinned).

``dma`` and ``triton`` jobs share the kernel's launches (the staged backend scatters and
copies the others in one launch per group); ``copy_engine`` and ``torch`` jobs share one
launch of their backend. When one inner backend takes every job (the usual load), its
prepared object is the route's, counted for ``auto`` too: no layer of ``auto`` per launch.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from transfer_kernels.backends import auto_table
from transfer_kernels.backends.auto_table import AutoTable, JobTraits
from transfer_kernels.backends.base import CopyBackend
from transfer_kernels.backends.copy_engine import CopyEngineBackend
from transfer_kernels.backends.launches import Prepared
from transfer_kernels.backends.parts import part_prepared
from transfer_kernels.backends.staged import StagedBackend
from transfer_kernels.backends.staging import host_side
from transfer_kernels.backends.torch_ref import TorchBackend
from transfer_kernels.backends.triton import TritonBackend
from transfer_kernels.cuda.abi import triton_importable
from transfer_kernels.rows import CopyPlan, LaunchGroups, PlannedJob

KERNEL = ("triton", "dma")  # choices served by the staged backend's kernel launches
Decision = tuple[str, "str | None"]  # (backend name, staged side for "dma")
# name -> (its jobs, their staged sides): which inner backend moves which jobs
Assignment = dict[str, tuple[tuple[int, ...], tuple["str | None", ...]]]


class AutoLanes(NamedTuple):
    """What ``auto`` decides from a route's tables (`AutoBackend.decide_lanes`)."""

    assignment: Assignment | None  # None: the table bounds job bytes (decided per size class)


class AutoBackend(CopyBackend):
    """``"auto"``: routes each job to the kernel (directly or staged), the copy engine or
    torch, by its table (module docstring).

    Attributes:
        table: the decision table.
        inner: the inner backends by name.
        analyses: decisions computed (one per job of a new route, or of a new size class
            under a table that bounds job bytes); for tests.
        launches: one per launch group of its loads (each inner backend also counts its own).
    """

    name = "auto"
    converts = True  # routes converting jobs itself (`decide`)

    def __init__(self, triton: TritonBackend | None = None,
                 copy_engine: CopyEngineBackend | None = None,
                 torch_ref: TorchBackend | None = None,
                 table: AutoTable | None = None) -> None:
        """Args:
            triton: the kernel backend (its ``max_programs`` bounds every kernel launch of
                this backend, the staged path's included).
            copy_engine / torch_ref: the other inner backends (fresh ones by default).
            table: the decision table; ``None``: ``$HICACHE_AUTO_TABLE`` if set, else
                :data:`transfer_kernels.backends.auto_table.SEED`.

        Raises:
            ValueError: ``$HICACHE_AUTO_TABLE`` names a bad file (the message names the
                file and the field).
        """
        super().__init__()
        triton = triton or TritonBackend()
        self.table = table if table is not None else auto_table.from_env()
        self.inner: dict[str, CopyBackend] = {
            "triton": triton,
            "copy_engine": copy_engine or CopyEngineBackend(),
            "torch": torch_ref or TorchBackend(),
            "dma": StagedBackend(triton),
        }
        self.analyses = 0

    def decide(self, job: PlannedJob, plan: CopyPlan) -> Decision:
        """The job's (backend, staged side) under this backend's table (module docstring)."""
        self.analyses += 1
        return decide(job, plan, self.table)

    def decide_lanes(self, lanes: CopyPlan) -> AutoLanes:
        """Every lane's inner backend and staged side, when the table does not bound job
        bytes (each inner backend checks its lanes now); else nothing yet."""
        if self.table.size_dependent:
            return AutoLanes(None)
        return AutoLanes(self._assign(lanes))

    def lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any = None,
                keep: bool = False, like: Prepared | None = None) -> Prepared:
        """Each inner backend's preparation of its jobs' part of the groups; the whole
        plan's when one backend takes every job (the usual load: ``like``, another class's
        prepared object, is then that backend's and handed to it)."""
        assigned = decided.assignment if decided is not None else None
        if assigned is None:
            assigned = self._assign(plan)
        if len(assigned) == 1:
            (name, (_, sides)), = assigned.items()
            prepared = self.inner[name].lay_out(plan, groups, sides if name == "dma" else None, keep, like)
            return prepared.count_by(self.launch_count)
        sub_groups = _split_groups(groups, assigned)
        parts = [(self.inner[n].lay_out(plan.subset(plan.jobs[j] for j in js), sub_groups[n],
                                        sides if n == "dma" else None, keep), js)
                 for n, (js, sides) in assigned.items()]
        return part_prepared(parts, len(groups)).count_by(self.launch_count)

    def _assign(self, plan: CopyPlan) -> Assignment:
        """Which inner backend takes which job (kernel choices share the staged backend's
        launches); each inner backend checks its jobs before anything is kept."""
        with self.lock:  # ``analyses`` counts exactly
            return self._assign_jobs(plan)

    def _assign_jobs(self, plan: CopyPlan) -> Assignment:
        routed: dict[str, tuple[list[int], list[str | None]]] = {}
        for j, job in enumerate(plan.jobs):
            name, side = self.decide(job, plan)
            js, sides = routed.setdefault("dma" if name in KERNEL else name, ([], []))
            js.append(j)
            sides.append(side)
        assigned = {n: (tuple(js), tuple(ss)) for n, (js, ss) in routed.items()}
        for n, (js, _) in assigned.items():  # all checked before any is used
            sub = plan if len(assigned) == 1 else plan.subset(plan.jobs[j] for j in js)
            self.inner[n].check_split(sub)
        return assigned


def _split_groups(groups: LaunchGroups, routed: dict[str, tuple[tuple[int, ...], tuple]]
                  ) -> dict[str, tuple[tuple[tuple[int, int], ...], ...]]:
    """Each backend's launch groups, in its sub-plan's job indices (tuples: hashable)."""
    local = {j: (n, i) for n, (js, _) in routed.items() for i, j in enumerate(js)}
    out: dict[str, list[tuple[tuple[int, int], ...]]] = {n: [] for n in routed}
    for group in groups:
        parts: dict[str, list[tuple[int, int]]] = {n: [] for n in routed}
        for j, layer in group:
            if j in local:
                name, i = local[j]
                parts[name].append((i, layer))
        for n, pairs in parts.items():
            out[n].append(tuple(pairs))
    return {n: tuple(gs) for n, gs in out.items()}


def traits(job: PlannedJob, plan: CopyPlan) -> JobTraits:
    """The job's :class:`~transfer_kernels.backends.auto_table.JobTraits`: read from its
    tables and row count, never from its rows."""
    src, dst = job.src, job.dst
    on_host = src.device.type == "cpu", dst.device.type == "cpu"
    direction = "same" if on_host[0] == on_host[1] else "h2d" if on_host[0] else "d2h"
    side = host_side(job, plan.device) if len(job.layers) == src.num_layers else None
    row_bytes = sum(src.row_bytes)
    job_bytes = (1 << (max(1, job.num_rows).bit_length() - 1)) * row_bytes * len(job.layers)
    piece = row_bytes // src.num_buffers
    if side is not None:
        span = getattr(job, side).page_span()[1]
        return JobTraits(plan.device.type, direction, "stage", piece, span, job_bytes, side)
    # each table against its own rows (a converting job's two sides differ in buffers)
    dense = all(t.row_strides[b] == n for t in (src, dst) for b, n in enumerate(t.row_bytes))
    return JobTraits(plan.device.type, direction, "dense" if dense else "strided", piece, 0, job_bytes)


def decide(job: PlannedJob, plan: CopyPlan, table: AutoTable = auto_table.SEED) -> Decision:
    """The (backend, staged side) of ``job`` under ``table``, uncached (module docstring)."""
    s = traits(job, plan)
    if s.device == "cuda":
        host_ok = all(t.device.type != "cpu" or t.is_pinned for t in (job.src, job.dst))
        if not (host_ok and triton_importable()):
            return ("torch" if job.mode else "copy_engine"), None
    name = table.choose(s)
    if job.mode:
        return converting(name, s)
    if name == "dma" and s.side is None:
        return "triton", None
    return name, s.side if name == "dma" else None


def converting(name: str, s: JobTraits) -> Decision:
    """A converting job's (backend, staged side) from the table's choice ``name`` for its
    traits ``s``: on CUDA ``dma`` where the table stages such a job, else the fused kernel;
    ``torch`` on the CPU."""
    if s.device != "cuda":
        return "torch", None
    return ("dma", s.side) if name == "dma" and s.side is not None else ("triton", None)


def choose(job: PlannedJob, plan: CopyPlan, table: AutoTable = auto_table.SEED) -> str:
    """The backend name :func:`decide` gives ``job``."""
    return decide(job, plan, table)[0]
