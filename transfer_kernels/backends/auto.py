"""The ``"auto"`` backend: routes each job by a decision table, decided once per shape.

A job's path comes from :class:`transfer_kernels.auto_table.AutoTable` (the seed table
from the H100 measurements cited in :mod:`transfer_kernels.tuning`, or a measured one:
``bench/load_batch.py --calibrate`` writes it, ``HICACHE_AUTO_TABLE=PATH`` or
``AutoBackend(table=...)`` loads it). The traits it looks up are read from the job's two
tables and its row-count class only (``auto_table`` module docstring): no run analysis of
the rows. The decision is cached per (source table, destination table, layer count, row
class): a batch of a shape seen before costs a dictionary look-up per job.

Two conditions override the table on CUDA: a host side that is not pinned, or no
``triton`` to import, sends the job to ``copy_engine`` (the only path that can run it).

A converting job (int8 host rows, `transfer_kernels.quant.codec`) is decided in the same terms
and cached the same way: on CUDA ``dma`` (int8 pages staged in the ring, converted by the
fused kernel from there) where the table would stage its traits, else the fused kernel
(``triton``); ``torch`` (`quant_torch`) on the CPU, and on CUDA where the kernel cannot run
it (no ``triton``, a host side not pinned).

``dma`` and ``triton`` jobs share the kernel's launches (the staged backend scatters and
copies the others in one launch per group); ``copy_engine`` and ``torch`` jobs share one
launch of their backend.
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

from transfer_kernels.backends import auto_table
from transfer_kernels.backends.auto_table import AutoTable, JobTraits
from transfer_kernels.backends.base import CopyBackend, Launches, PartLaunches
from transfer_kernels.backends.cache import Lru, same_tables, table_refs
from transfer_kernels.backends.copy_engine import CopyEngineBackend
from transfer_kernels.backends.staged import StagedBackend
from transfer_kernels.backends.staging import host_side
from transfer_kernels.backends.torch_ref import TorchBackend
from transfer_kernels.backends.triton import TritonBackend
from transfer_kernels.cuda.abi import triton_importable
from transfer_kernels.rows import CopyPlan, LaunchGroups, PlannedJob

KERNEL = ("triton", "dma")  # choices served by the staged backend's kernel launches
Decision = tuple[str, "str | None"]  # (backend name, staged side for "dma")


class Assignment(NamedTuple):
    """Which inner backend runs which jobs of a plan shape (``AutoBackend._assign``)."""

    refs: tuple  # per job: weak references to (src, dst), verifying a hit
    routed: dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]  # name -> (jobs, sides)
    whole: bool  # one backend takes every job: it gets the plan and groups unchanged


class AutoBackend(CopyBackend):
    """``"auto"``: routes each job to the kernel (directly or staged), the copy engine or
    torch, by its table (module docstring).

    Attributes:
        table: the decision table.
        analyses: decisions computed (not served from the cache); for tests.
        launches: the launches of the inner backends it used (each inner backend also
            counts its own).
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
                :data:`transfer_kernels.auto_table.SEED`.

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
        self._assignments = Lru(64)
        # src table -> {(id(dst), layers, row class): (name, side, dst ref)}; weak on src so
        # a dropped pool takes its decisions along.
        self._decisions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def decide(self, job: PlannedJob, plan: CopyPlan) -> Decision:
        """The job's (backend, staged side), computed once per (tables, layers, row class)
        (module docstring)."""
        per_src = self._decisions.get(job.src)
        if per_src is None:
            per_src = self._decisions.setdefault(job.src, {})
        key = (id(job.dst), len(job.layers), job.num_rows.bit_length())
        hit = per_src.get(key)
        if hit is not None and hit[2]() is job.dst:  # not a new table at a reused id
            return hit[0], hit[1]
        name, side = decide(job, plan, self.table)
        self.analyses += 1
        per_src[key] = (name, side, weakref.ref(job.dst))
        return name, side

    def _assign(self, plan: CopyPlan) -> Assignment:
        """The plan's :class:`Assignment`, cached per (device, per job: both tables, layer
        count, row class); a new one is checked by every backend it uses before it is
        cached (the checks read the tables only)."""
        jobs = plan.jobs
        key = (plan.device, tuple([(id(j.src), id(j.dst), len(j.layers),
                                    j.src_rows.numel().bit_length()) for j in jobs]))
        found = self._assignments.get(key)
        if found is not None and same_tables(jobs, found.refs):
            return found
        routed: dict[str, tuple[list[int], list[str | None]]] = {}
        for j, job in enumerate(jobs):
            if job.num_rows and job.layers:
                name, side = self.decide(job, plan)
                if name in KERNEL:
                    name = "dma"
                js, sides = routed.setdefault(name, ([], []))
                js.append(j)
                sides.append(side)
        frozen = {n: (tuple(js), tuple(ss)) for n, (js, ss) in routed.items()}
        found = Assignment(table_refs(jobs), frozen,
                           len(routed) == 1 and len(next(iter(routed.values()))[0]) == len(jobs))
        for n, sub in self._subplans(plan, found).items():  # all checked before any runs
            self.inner[n].check(sub)
        self._assignments.put(key, found)
        return found

    def _subplans(self, plan: CopyPlan, assigned: Assignment) -> dict[str, CopyPlan]:
        if assigned.whole:
            return {n: plan for n in assigned.routed}
        return {n: plan.subset(plan.jobs[j] for j in js) for n, (js, _) in assigned.routed.items()}

    def prepare(self, plan: CopyPlan, groups: LaunchGroups) -> Launches:
        """Assign every job (a seen shape: one cached look-up), then prepare each inner
        backend on its jobs' groups.

        When one backend takes every job (the usual load), it gets the plan and the
        caller's groups unchanged: hashable groups keep the layout caches hit.
        """
        assigned = self._assign(plan)
        if assigned.whole:  # the usual load: one backend, no sub-plans
            (name, (_, sides)), = assigned.routed.items()
            return AutoLaunches(self, [self._prepare_on(name, plan, groups, sides)], len(groups))
        subplans = self._subplans(plan, assigned)
        sub_groups = _split_groups(groups, assigned.routed)
        return AutoLaunches(self, [self._prepare_on(n, subplans[n], sub_groups[n], sides)
                                   for n, (_, sides) in assigned.routed.items()], len(groups))

    def _prepare_on(self, name: str, plan: CopyPlan, groups: LaunchGroups,
                    sides: tuple[str | None, ...]) -> Launches:
        """Inner backend ``name``'s prepared launches (the dma path takes the staged sides)."""
        if name == "dma":
            return self.inner[name].prepare(plan, groups, sides)
        return self.inner[name].prepare(plan, groups)


class AutoLaunches(PartLaunches):
    """Each launch group runs the matching group of every inner backend used; one
    ``auto`` launch counted per group (by `Launches.launch`)."""

    def __init__(self, auto: AutoBackend, inner: list[Launches], num_groups: int) -> None:
        super().__init__(inner, num_groups)
        self.backend = auto


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
    side = host_side(job, plan) if len(job.layers) == src.num_layers else None
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
