"""The copy backend interface: something that executes a validated :class:`CopyPlan`."""
from __future__ import annotations

from abc import ABC, abstractmethod

from typing import Sequence

import torch

from transfer_kernels.plan import CopyPlan, LaunchGroups


class CopyBackend(ABC):
    """Executes validated copy plans on the caller's current stream.

    Backends never synchronize the device on their own (``"torch"`` is the exception
    on D2H into pageable memory, documented there) and copy nothing when a plan is empty.

    Attributes:
        name: the public backend name (``"triton"``, ``"copy_engine"``, ``"torch"``...).
        launches: how many launches this instance issued: one per executed non-empty plan
            (for ``"triton"`` exactly one kernel launch). Converting jobs (int8 host rows,
            `transfer_kernels.codec`) run on the backend's `quant_backend`, which counts its
            own launches. Mutated by :meth:`execute`;
            instances are not thread-safe.
    """

    name: str = "abstract"
    # True for a backend that runs converting jobs (`codec`) itself; every other one hands
    # them to its quant backend (`transfer_kernels.quant`).
    converts: bool = False

    def __init__(self) -> None:
        self.launches = 0

    def execute(self, plan: CopyPlan) -> None:
        """Copy every job of ``plan``; returns once the work is enqueued.

        Args:
            plan: a plan from :func:`transfer_kernels.plan.make_plan`.

        Raises:
            ValueError: the plan cannot run on this backend (e.g. unpinned host memory
                for ``"triton"`` on CUDA); raised before anything is copied.
        """
        if plan.is_empty:
            return
        if not self.converts and plan.has_quant:
            from transfer_kernels.quant import execute_split
            execute_split(self, plan)
            return
        self.check(plan)
        self.launches += 1
        self._execute(plan)

    def check(self, plan: CopyPlan) -> None:
        """Raise ``ValueError`` if this backend cannot run ``plan``; the default accepts all."""

    def prepare(self, plan: CopyPlan, groups: LaunchGroups) -> PreparedPlan:
        """Prepare ``plan`` once as several launches (e.g. one per group of model layers of a load).

        Whatever a launch needs is built here, for every group at once (the triton backend
        stages all indices and descriptors in one copy), so that :meth:`PreparedPlan.launch`
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
            from transfer_kernels.quant import prepare_split
            return prepare_split(self, plan, groups)
        self.check(plan)
        return GroupLaunches(self, plan, groups)

    def quant_backend(self, device: torch.device) -> CopyBackend:
        """The backend that runs this backend's converting jobs on ``device`` (built once).

        The default: the fused Triton kernel on CUDA when triton is importable, else the
        pure-torch reference (a backend that cannot convert, the copy engine, routes here).
        """
        built = self.__dict__.setdefault("_quant", {})  # also for a subclass that skipped __init__
        if device.type not in built:
            built[device.type] = self._make_quant_backend(device)
        return built[device.type]

    def _make_quant_backend(self, device: torch.device) -> CopyBackend:
        """Build the quant backend (subclasses pick theirs; see `quant_backend`)."""
        from transfer_kernels.quant_torch import TorchQuantBackend
        if device.type == "cuda":
            from transfer_kernels.quant_kernel import TritonQuantBackend, triton_importable
            if triton_importable():
                return TritonQuantBackend()
        return TorchQuantBackend()

    @abstractmethod
    def _execute(self, plan: CopyPlan) -> None:
        """Enqueue the copies of a non-empty, checked plan (one launch)."""

    def _execute_group(self, plan: CopyPlan, group: Sequence[tuple[int, int]]) -> None:
        """Enqueue one non-empty launch group of a checked plan (one launch).

        The default runs the group's sub-plan through :meth:`_execute`; a backend that can
        copy ``(job, layer)`` pairs directly overrides it and skips building that plan.
        """
        self._execute(plan.group_plan(group))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(launches={self.launches})"


class PreparedPlan(ABC):
    """Launch groups of one plan, prepared by :meth:`CopyBackend.prepare`.

    Keeps whatever the launches read (staged indices, descriptors) alive. Not thread-safe.
    """

    @property
    @abstractmethod
    def num_groups(self) -> int:
        """How many launch groups there are."""

    @abstractmethod
    def launch(self, group: int) -> None:
        """Enqueue group ``group`` on the current stream (a no-op for an empty group)."""


class GroupLaunches(PreparedPlan):
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

    def launch(self, group: int) -> None:
        pairs = self.groups[group]
        if pairs:
            self.backend.launches += 1
            self.backend._execute_group(self.plan, pairs)


class PartLaunches(PreparedPlan):
    """Several prepared plans of one set of launch groups: group ``g`` launches group ``g``
    of every part, in order (the quantized split, ``auto``'s inner backends)."""

    def __init__(self, parts: list[PreparedPlan], num_groups: int) -> None:
        self.parts, self._num_groups = parts, num_groups

    @property
    def num_groups(self) -> int:
        return self._num_groups

    def launch(self, group: int) -> None:
        for part in self.parts:
            part.launch(group)
