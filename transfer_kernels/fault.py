"""Fault injection: a backend that fails on a chosen launch, for the controller's tests."""
from __future__ import annotations

from typing import Any, NamedTuple

from transfer_kernels.api import get_backend
from transfer_kernels.backends.base import CopyBackend
from transfer_kernels.backends.launches import Kernel, Prepared
from transfer_kernels.rows import CopyPlan, LaunchGroups


class FaultyBackend(CopyBackend):
    """Delegates to ``inner`` but raises on launch number ``fail_on_launch`` (1-based).

    The failing launch raises ``RuntimeError("injected fault on launch k")`` before
    anything is copied; earlier and later launches copy normally. ``attempts`` counts
    every launch tried, the failed one included (its clock, safe from any number of
    threads); ``launches`` those that ran.
    """

    converts = True  # whole plans go to the inner backend, which splits converting jobs off

    def __init__(self, inner: str | CopyBackend, fail_on_launch: int) -> None:
        """Args:
            inner: a backend name (``"torch"``, ``"triton"``...) or instance to delegate to.
            fail_on_launch: which launch fails, >= 1.

        Raises:
            ValueError: ``fail_on_launch`` < 1 or ``inner`` is an unknown name.
        """
        super().__init__()
        if fail_on_launch < 1:
            raise ValueError(f"fail_on_launch: must be >= 1, got {fail_on_launch}")
        self.inner = get_backend(inner)
        self.fail_on_launch = fail_on_launch
        self.name = f"faulty({self.inner.name})"
        self.attempts = 0

    def attempt(self) -> None:
        """Count one launch tried; raise if it is the one that fails."""
        with self.lock:
            self.attempts += 1
            k = self.attempts
        if k == self.fail_on_launch:
            raise RuntimeError(f"injected fault on launch {k}")

    def check(self, plan: CopyPlan) -> None:
        """The inner backend's check."""
        self.inner.check(plan)

    def decide_lanes(self, lanes: CopyPlan) -> Any:
        """The inner backend's decisions (and checks)."""
        return self.inner.decide_lanes(lanes)

    def lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any = None,
                keep: bool = False, like: Prepared | None = None) -> Prepared:
        """The inner backend's own preparation (the production steps), one of whose
        launches fails."""
        if like is not None and isinstance(like.kernel, FaultyKernel):  # the inner step is offered
            like = Prepared(like.kernel.inner, like.rings, like.swaps, like.stages)
        inner = self.inner.lay_out(plan, groups, decided, keep, like)
        return Prepared(FaultyKernel(self, inner.kernel), inner.rings, inner.swaps, inner.stages,
                        inner.counts).count_by(self.launch_count)


class FaultyKernel(Kernel):
    """Another backend's kernel step whose launches may fail (`FaultyBackend.attempt`)."""

    def __init__(self, backend: FaultyBackend, inner: Kernel) -> None:
        self.backend, self.inner = backend, inner
        self.live, self.counts = inner.live, inner.counts

    def bind(self, lanes, src_rows, dst_rows) -> Any:
        launcher = self.inner.bind(lanes, src_rows, dst_rows)
        return None if launcher is None else FaultyLauncher(self.backend, launcher)


class FaultyLauncher(NamedTuple):
    """A load's launcher that asks its backend before each launch."""

    backend: FaultyBackend
    inner: Any

    def launch(self, group: int) -> None:
        self.backend.attempt()
        self.inner.launch(group)


class NullBackend(CopyBackend):
    """Validates and counts launches but moves no bytes (bookkeeping benchmarks and tests):
    a load of it is the caller's own work plus one event record per group."""

    name = "null"
    converts = True  # moves nothing, converting jobs included

    def lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any = None,
                keep: bool = False, like: Prepared | None = None) -> Prepared:
        """The groups that would launch (a job with rows in them); nothing else to build."""
        return Prepared(NullKernel(self, tuple(any(plan.jobs[j].num_rows for j, _ in g) for g in groups)))

    def _execute(self, plan: CopyPlan) -> None:
        """Nothing to copy: the plan was already validated by ``make_plan``."""


class NullKernel(Kernel):
    """A size class of the null backend: which groups would launch (each counted)."""

    def __init__(self, backend: NullBackend, live: tuple[bool, ...]) -> None:
        self.live, self.counts = live, ((backend.launch_count, live),)

    def bind(self, lanes, src_rows, dst_rows) -> Any:
        return NOTHING


class _Nothing:
    """The null backend's launcher: a launch moves nothing."""

    def launch(self, group: int) -> None:
        """Nothing to launch."""


NOTHING = _Nothing()
