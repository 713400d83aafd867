"""The copy backend interface: something that executes a validated :class:`CopyPlan`,
whole or prepared once as several launches (`Launches`).

Every launch of every backend is counted in ONE place, :meth:`Launches.launch`: a plan
executed whole is one prepared launch group of all its (job, layer) pairs.

A backend that cannot convert int8 host rows itself (``converts`` False) runs a plan's
converting jobs (`transfer_kernels.quant.codec`) on its *quant backend*: the same launch
groups, one more launch per group where both kinds are present (`PartLaunches`). Each
concrete backend names its own quant backend (:meth:`CopyBackend.quant_backend`); this
module knows none of them.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import torch

from transfer_kernels.rows import CopyPlan, LaunchGroups


class CopyBackend(ABC):
    """Executes validated copy plans on the caller's current stream.

    Backends never synchronize the device on their own (``"torch"`` is the exception
    on D2H into pageable memory, documented there) and copy nothing when a plan is empty.

    Attributes:
        name: the public backend name (``"triton"``, ``"copy_engine"``, ``"torch"``...).
        launches: how many launches this instance issued: one per executed non-empty plan
            and one per non-empty launch group of a prepared plan (for ``"triton"`` exactly
            one kernel launch each), counted by :meth:`Launches.launch`. Converting jobs
            (int8 host rows) run on the backend's `quant_backend`, which counts its own.
            Instances are not thread-safe.
    """

    name: str = "abstract"
    # True for a backend that runs converting jobs (`codec`) itself; every other one hands
    # them to its quant backend.
    converts: bool = False

    def __init__(self) -> None:
        self.launches = 0

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

    def check(self, plan: CopyPlan) -> None:
        """Raise ``ValueError`` if this backend cannot run ``plan``; the default accepts all."""

    def check_split(self, plan: CopyPlan) -> None:
        """:meth:`check` of the plan's exact jobs and the quant backend's check of its
        converting ones (a backend that hands converting jobs on checks both kinds)."""
        if not plan.has_quant:
            self.check(plan)
            return
        exact, quant = split_jobs(plan)
        if exact:
            self.check(plan.subset(plan.jobs[j] for j in exact))
        self.quant_backend(plan.device).check(plan.subset(plan.jobs[j] for j in quant))

    def prepare(self, plan: CopyPlan, groups: LaunchGroups) -> Launches:
        """Prepare ``plan`` once as several launches (e.g. one per group of model layers of a load).

        Whatever a launch needs is built here, for every group at once (the triton backend
        stages all indices and descriptors in one copy), so that :meth:`Launches.launch`
        costs only the launch itself. Nothing is copied yet.

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
        if not self.converts and plan.has_quant:
            return self._prepare_split(plan, groups)
        self.check(plan)
        return GroupLaunches(self, plan, groups)

    def quant_backend(self, device: torch.device) -> CopyBackend:
        """The backend that runs this backend's converting jobs on ``device`` (built once).

        Raises:
            ValueError: this backend names none (it cannot run int8 host rows).
        """
        built = self.__dict__.setdefault("_quant", {})  # also for a subclass that skipped __init__
        if device.type not in built:
            built[device.type] = self._make_quant_backend(device)
        return built[device.type]

    def _make_quant_backend(self, device: torch.device) -> CopyBackend:
        """Build the quant backend (each backend that hands converting jobs on names its own)."""
        raise ValueError(f"backend {self.name!r} cannot convert int8 host rows (it names no quant "
                         f"backend); use torch, triton, copy_engine, dma or auto")

    def _prepare_split(self, plan: CopyPlan, groups: LaunchGroups) -> Launches:
        """:meth:`prepare` of a plan with converting jobs: each kind prepared by its backend
        on its jobs' part of every group (both checked first); a launch runs both parts."""
        exact, quant = split_jobs(plan)
        parts = []
        for b, idx in ((self, exact), (self.quant_backend(plan.device), quant)):
            if not idx:
                continue
            local = {j: i for i, j in enumerate(idx)}
            # tuples: hashable groups keep the kernel's layout cache hit from load to load
            sub_groups = tuple(tuple((local[j], layer) for j, layer in g if j in local) for g in groups)
            parts.append((b, plan.subset(plan.jobs[j] for j in idx), sub_groups))
        for b, p, _ in parts:
            b.check(p)
        return PartLaunches([b.prepare(p, g) for b, p, g in parts], len(groups))

    def _execute(self, plan: CopyPlan) -> None:
        """Enqueue the copies of a non-empty, checked plan (one launch).

        What the generic preparation (`GroupLaunches`) runs per group; a backend implements
        this, or :meth:`_execute_group`, or its own :meth:`prepare`.
        """
        raise NotImplementedError(f"backend {self.name!r} implements neither _execute, "
                                  f"_execute_group nor prepare")

    def _execute_group(self, plan: CopyPlan, group: Sequence[tuple[int, int]]) -> None:
        """Enqueue one non-empty launch group of a checked plan (one launch).

        The default runs the group's sub-plan through :meth:`_execute`; a backend that can
        copy ``(job, layer)`` pairs directly overrides it and skips building that plan.
        """
        self._execute(plan.group_plan(group))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(launches={self.launches})"


def all_pairs(plan: CopyPlan) -> tuple[tuple[int, int], ...]:
    """Every (job, layer) pair of ``plan``'s jobs that move rows: one launch group."""
    return tuple((j, layer) for j, job in enumerate(plan.jobs) if job.num_rows for layer in job.layers)


def split_jobs(plan: CopyPlan) -> tuple[list[int], list[int]]:
    """Indices of the plan's exact jobs and of its converting jobs."""
    exact, quant = [], []
    for j, job in enumerate(plan.jobs):
        (quant if job.mode else exact).append(j)
    return exact, quant


class Launches(ABC):
    """Launch groups of one plan, prepared by :meth:`CopyBackend.prepare`.

    Keeps whatever the launches read (staged indices, descriptors) alive. Not thread-safe.

    Attributes:
        backend: the backend whose ``launches`` counter each launch increments (``None``:
            the launches of parts, each counted by its own backend).
    """

    backend: CopyBackend | None = None

    @property
    @abstractmethod
    def num_groups(self) -> int:
        """How many launch groups there are."""

    def launch(self, group: int) -> None:
        """Enqueue group ``group`` on the current stream (a no-op for an empty group);
        the one place where any backend's launches are counted."""
        if self.counts(group):
            if self.backend is not None:
                self.backend.launches += 1
            self._launch(group)

    def counts(self, group: int) -> bool:
        """True when group ``group`` launches anything (the default: every group)."""
        return True

    @abstractmethod
    def _launch(self, group: int) -> None:
        """Enqueue group ``group`` (called once it counts)."""


class GroupLaunches(Launches):
    """The generic preparation: the plan and its groups; each launch hands one group to
    the backend's ``_execute_group`` (O(pairs of the group), nothing built per launch)."""

    def __init__(self, backend: CopyBackend, plan: CopyPlan, groups: LaunchGroups) -> None:
        self.backend, self.plan = backend, plan
        empty = {j for j, job in enumerate(plan.jobs) if not (job.num_rows and job.layers)}
        # Jobs that move nothing are dropped from the groups once, here (rare: a caller's
        # empty rows); a group left empty launches nothing.
        self.groups = groups if not empty else [[(j, layer) for j, layer in g if j not in empty]
                                                for g in groups]

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def counts(self, group: int) -> bool:
        return bool(self.groups[group])

    def _launch(self, group: int) -> None:
        self.backend._execute_group(self.plan, self.groups[group])


class PartLaunches(Launches):
    """Several prepared plans of one set of launch groups: group ``g`` launches group ``g``
    of every part, in order (the converting split, ``auto``'s inner backends); each part
    counts its own launches."""

    def __init__(self, parts: list[Launches], num_groups: int) -> None:
        self.parts, self._num_groups = parts, num_groups

    @property
    def num_groups(self) -> int:
        return self._num_groups

    def _launch(self, group: int) -> None:
        for part in self.parts:
            part.launch(group)
