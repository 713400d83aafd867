"""The copy backend interface: something that moves the rows of validated plans.

Every backend moves a load in two steps (`route`): what the tables alone decide, once per
lane set (:meth:`CopyBackend.decide_lanes`, checks included), and what a size class needs,
once per class (:meth:`CopyBackend.lay_out` builds a `Prepared`); a load then only binds
its rows. The checked entry points (:meth:`CopyBackend.prepare`, :meth:`execute`,
``copy_rows``) find the route of their tables in the backend's route cache (identity
checked once per call) and go through the same prepared objects as hicache's controller.

A backend that cannot convert int8 host rows itself (``converts`` False) runs a plan's
converting jobs (`transfer_kernels.quant.codec`) on its *quant backend*: the same launch
groups, one more launch per group where both kinds are present (`parts`). Each
concrete backend names its own quant backend (:meth:`CopyBackend.quant_backend`); this
module knows none of them.
"""
from __future__ import annotations

import threading
from abc import ABC
from collections import OrderedDict
from typing import Any, Sequence

import torch

from transfer_kernels.backends.launches import Kernel, LaunchCount, Launches, Prepared
from transfer_kernels.backends.parts import part_prepared
from transfer_kernels.backends.route import Route
from transfer_kernels.rows import CopyPlan, Lane, LaunchGroups, PlannedJob

ROUTE_CACHE_SIZE = 64  # routes a backend keeps for its checked entry points (lane sets)


class CopyBackend(ABC):
    """Moves the rows of validated copy plans on the caller's current stream.

    Backends never synchronize the device on their own (``"torch"`` is the exception
    on D2H into pageable memory, documented there) and copy nothing when a plan is empty.

    Every public method and the objects it returns (prepared loads excepted: a load is
    its caller's) are safe from any number of threads: the route cache and what is built
    once are built under the backend's ``lock``, launches are counted atomically, and a
    staged load holds its staging ring from its first launch to its last
    (`transfer_kernels.backends.launches`).

    Attributes:
        name: the public backend name (``"triton"``, ``"copy_engine"``, ``"torch"``...).
        launches: how many launches this instance issued: one per executed non-empty plan
            and one per non-empty launch group of a prepared load (for ``"triton"`` exactly
            one kernel launch each), counted by `Launches` once they ran. Converting jobs
            (int8 host rows) run on the backend's `quant_backend`, which counts its own.
    """

    name: str = "abstract"
    # True for a backend that runs converting jobs (`codec`) itself; every other one hands
    # them to its quant backend.
    converts: bool = False

    def __init__(self) -> None:
        self._launches = LaunchCount()
        self._lock = threading.RLock()

    @property
    def launches(self) -> int:
        """Launches issued (see the class docstring)."""
        return self.launch_count.value

    @property
    def launch_count(self) -> LaunchCount:
        """The counter `Launches` adds this backend's launches to."""
        return self.__dict__.setdefault("_launches", LaunchCount())  # a subclass may skip __init__

    @property
    def lock(self) -> threading.RLock:
        """Held while this backend builds what it keeps (routes, layouts, rings): never
        during a warm load."""
        return self.__dict__.setdefault("_lock", threading.RLock())

    def execute(self, plan: CopyPlan) -> None:
        """Copy every job of ``plan``; returns once the work is enqueued.

        Args:
            plan: a plan from :func:`transfer_kernels.rows.plan.make_plan`.

        Raises:
            ValueError: the plan cannot run on this backend (e.g. unpinned host memory
                for ``"triton"`` on CUDA); raised before anything is copied.
        """
        if plan.is_empty:
            return
        self.prepare(plan, (all_pairs(plan),)).launch(0)

    def prepare(self, plan: CopyPlan, groups: LaunchGroups) -> Launches:
        """Prepare ``plan`` as several launches (e.g. one per group of model layers of a
        load), through the route of its tables and the prepared object of its size class.

        Nothing is copied yet; the first plan of a lane set decides and checks, the first
        of a size class lays out every group at once (the triton backend: one layout and
        one index upload per load).

        Args:
            plan: a validated plan.
            groups: per launch, the ``(job index, table-local layer)`` pairs it copies;
                each layer must be one of that job's layers (internal callers build them
                from the plan; they are not re-checked).

        Returns:
            The prepared launches; ``launch(g)`` enqueues group ``g``.

        Raises:
            ValueError: the plan cannot run on this backend (see :meth:`check`).
        """
        try:
            hash(groups)
        except TypeError:  # lists (tests, a caller's own groups): a tuple of them keys the same
            groups = tuple(map(tuple, groups))
        jobs = plan.jobs
        key = (groups, tuple([(j.num_rows, j.src_rows.is_cuda, j.dst_rows.is_cuda) for j in jobs]))
        route = self.route_of(plan)
        prepared = route.prepared.get(key) or route.prepare(key, plan, groups)
        return prepared.start(jobs, [j.src_rows for j in jobs], [j.dst_rows for j in jobs])

    def route(self, lanes: Sequence[Lane], device: torch.device, hold: bool = True) -> Route:
        """A route of ``lanes`` on this backend (decided and checked now, `Route`).

        Raises:
            ValueError: this backend cannot move these tables.
        """
        return Route(self, lanes, device, hold)

    @property
    def route_cache(self) -> OrderedDict:
        """The routes of this backend's checked entry points by `route_key` (for tests and
        inspection; written under ``lock`` only)."""
        return self.__dict__.setdefault("_route_cache", OrderedDict())

    def route_of(self, plan: CopyPlan) -> Route:
        """The route of ``plan``'s tables and layers, kept in this backend's route cache
        (weakly: no pool kept alive; a new table at a reused id is a miss)."""
        routes = self.route_cache
        key = route_key(plan)
        got = routes.get(key)
        if got is not None and got.holds(plan.jobs):
            return got
        with self.lock:  # one thread decides a new route; the others find it
            got = routes.get(key)
            if got is None or not got.holds(plan.jobs):
                got = routes[key] = Route(self, plan.jobs, plan.device, hold=False)
                if len(routes) > ROUTE_CACHE_SIZE:
                    routes.popitem(last=False)
        return got

    def decide_lanes(self, lanes: CopyPlan) -> Any:
        """What this backend decides from the lanes' tables alone (``lanes``: a plan of the
        lanes, without rows), once per route; the default checks and decides nothing.

        Raises:
            ValueError: the backend cannot move these tables (:meth:`check_split`).
        """
        self.check_split(lanes)
        return None

    def lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any = None,
                keep: bool = False, like: Prepared | None = None) -> Prepared:
        """The prepared object of ``plan``'s size class (its row counts; ``plan`` is its
        first load), for ``groups``; built once per class by the route. The tables were
        checked when the route decided (``decided``: what :meth:`decide_lanes` returned;
        ``None``: decide from ``plan`` where needed). ``keep``: the route's loads all run on
        one stream (a controller's: one per direction), so the prepared object may keep
        its device buffers from load to load (indices written in place: one upload of the
        rows, the launchers bound once); else each load gets fresh ones. ``like``: another
        size class's prepared object of the same route (`Route.prepare`), whose size-free
        parts the new one may share where they fit (the triton layout's static part);
        ``None``, or a backend that shares nothing, builds everything.

        The default is the generic preparation: each launch hands its group's (job, layer)
        pairs to :meth:`_execute_group` (`GroupKernel`).
        """
        if not self.converts and plan.has_quant:
            return self._lay_out_split(plan, groups, keep)
        return Prepared(GroupKernel(self, plan, groups))

    def check(self, plan: CopyPlan) -> None:
        """Raise ``ValueError`` if this backend cannot run ``plan``; the default accepts all."""

    def check_split(self, plan: CopyPlan) -> None:
        """:meth:`check` of the plan's exact jobs and the quant backend's check of its
        converting ones (a backend that hands converting jobs on checks both kinds)."""
        if self.converts or not plan.has_quant:
            self.check(plan)
            return
        exact, quant = split_jobs(plan)
        if exact:
            self.check(plan.subset(plan.jobs[j] for j in exact))
        self.quant_backend(plan.device).check(plan.subset(plan.jobs[j] for j in quant))

    def quant_backend(self, device: torch.device) -> CopyBackend:
        """The backend that runs this backend's converting jobs on ``device`` (built once).

        Raises:
            ValueError: this backend names none (it cannot run int8 host rows).
        """
        built = self.__dict__.setdefault("_quant", {})  # also for a subclass that skipped __init__
        if device.type not in built:
            with self.lock:
                if device.type not in built:
                    built[device.type] = self._make_quant_backend(device)
        return built[device.type]

    def _make_quant_backend(self, device: torch.device) -> CopyBackend:
        """Build the quant backend (each backend that hands converting jobs on names its own)."""
        raise ValueError(f"backend {self.name!r} cannot convert int8 host rows (it names no quant "
                         f"backend); use torch, triton, copy_engine, dma or auto")

    def _lay_out_split(self, plan: CopyPlan, groups: LaunchGroups, keep: bool = False) -> Prepared:
        """:meth:`lay_out` of a plan with converting jobs: each kind laid out by its backend
        on its jobs' part of every group; a launch runs both parts."""
        exact, quant = split_jobs(plan)
        parts = []
        for b, idx in ((self, exact), (self.quant_backend(plan.device), quant)):
            if not idx:
                continue
            local = {j: i for i, j in enumerate(idx)}
            sub_groups = tuple(tuple((local[j], layer) for j, layer in g if j in local) for g in groups)
            parts.append((b.lay_out(plan.subset(plan.jobs[j] for j in idx), sub_groups, None, keep),
                          tuple(idx)))
        return part_prepared(parts, len(groups))

    def _execute(self, plan: CopyPlan) -> None:
        """Enqueue the copies of a non-empty, checked plan (one launch).

        What the generic preparation runs per group; a backend implements this, or
        :meth:`_execute_group`, or its own :meth:`lay_out`.
        """
        raise NotImplementedError(f"backend {self.name!r} implements neither _execute, "
                                  f"_execute_group nor lay_out")

    def _execute_group(self, plan: CopyPlan, group: Sequence[tuple[int, int]]) -> None:
        """Enqueue one non-empty launch group of a checked plan (one launch).

        The default runs the group's sub-plan through :meth:`_execute`; a backend that can
        copy ``(job, layer)`` pairs directly overrides it and skips building that plan.
        """
        self._execute(plan.group_plan(group))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(launches={self.launches})"


def route_key(plan: CopyPlan) -> tuple:
    """The key of ``plan``'s route in a backend's route cache: device and, per job, the ids
    of its tables and its layers (a hit is verified: `Route.holds`)."""
    return plan.device, tuple([(id(j.src), id(j.dst), j.layers) for j in plan.jobs])


def all_pairs(plan: CopyPlan) -> tuple[tuple[int, int], ...]:
    """Every (job, layer) pair of ``plan``'s jobs that move rows: one launch group."""
    return tuple((j, layer) for j, job in enumerate(plan.jobs) if job.num_rows for layer in job.layers)


def split_jobs(plan: CopyPlan) -> tuple[list[int], list[int]]:
    """Indices of the plan's exact jobs and of its converting jobs."""
    exact, quant = [], []
    for j, job in enumerate(plan.jobs):
        (quant if job.mode else exact).append(j)
    return exact, quant


class GroupKernel(Kernel):
    """The generic preparation's kernel step: a size class's groups, without the jobs that
    move nothing (a caller's empty rows); a load's launcher hands one group each to the
    backend's ``_execute_group`` (O(pairs of the group), nothing built per launch)."""

    def __init__(self, backend: CopyBackend, plan: CopyPlan, groups: LaunchGroups) -> None:
        self.backend, self.device = backend, plan.device
        empty = {j for j, job in enumerate(plan.jobs) if not (job.num_rows and job.layers)}
        self.groups = tuple(map(tuple, groups)) if not empty else tuple(
            tuple((j, layer) for j, layer in g if j not in empty) for g in groups)
        self.live = tuple(bool(g) for g in self.groups)
        self.counts = ((backend.launch_count, self.live),)

    def bind(self, lanes, src_rows, dst_rows) -> GroupLauncher:
        plan = CopyPlan(tuple(PlannedJob(lane.src, lane.dst, s, d, lane.layers)
                              for lane, s, d in zip(lanes, src_rows, dst_rows)), self.device)
        return GroupLauncher(self.backend, plan, self.groups)


class GroupLauncher:
    """One load of a `GroupKernel`: its plan and the prepared groups."""

    def __init__(self, backend: CopyBackend, plan: CopyPlan, groups: tuple) -> None:
        self.backend, self.plan, self.groups = backend, plan, groups

    def launch(self, group: int) -> None:
        self.backend._execute_group(self.plan, self.groups[group])
