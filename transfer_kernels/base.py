"""The copy backend interface: something that executes a validated :class:`CopyPlan`."""
from __future__ import annotations

from abc import ABC, abstractmethod

from transfer_kernels.plan import CopyPlan


class CopyBackend(ABC):
    """Executes validated copy plans on the caller's current stream.

    Backends never synchronize the device on their own (``"torch"`` is the exception
    on D2H into pageable memory, documented there) and copy nothing when a plan is empty.

    Attributes:
        name: the public backend name (``"triton"``, ``"copy_engine"``, ``"torch"``...).
        launches: how many launches this instance issued: one per executed non-empty plan
            (for ``"triton"`` exactly one kernel launch). Mutated by :meth:`execute`;
            instances are not thread-safe.
    """

    name: str = "abstract"

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
        self.check(plan)
        self.launches += 1
        self._execute(plan)

    def check(self, plan: CopyPlan) -> None:
        """Raise ``ValueError`` if this backend cannot run ``plan``; the default accepts all."""

    @abstractmethod
    def _execute(self, plan: CopyPlan) -> None:
        """Enqueue the copies of a non-empty, checked plan (one launch)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(launches={self.launches})"
