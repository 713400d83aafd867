"""Fault injection: a backend that fails on a chosen launch, for the controller's tests."""
from __future__ import annotations

from typing import Any, Sequence

from transfer_kernels.api import get_backend
from transfer_kernels.backends.base import CopyBackend
from transfer_kernels.backends.launches import Launches, Prepared
from transfer_kernels.cuda import runtime
from transfer_kernels.rows import CopyPlan, LaunchGroups


class FaultyBackend(CopyBackend):
    """Delegates to ``inner`` but raises on launch number ``fail_on_launch`` (1-based).

    The failing launch raises ``RuntimeError("injected fault on launch k")`` before
    anything is copied; earlier and later launches copy normally. ``launches`` counts
    every attempted launch, the failed one included.
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
        self.inner = get_backend(inner, fresh=True) if isinstance(inner, str) else inner
        self.fail_on_launch = fail_on_launch
        self.name = f"faulty({self.inner.name})"

    def check(self, plan: CopyPlan) -> None:
        """The inner backend's check."""
        self.inner.check(plan)

    def decide_lanes(self, lanes: CopyPlan) -> Any:
        """The inner backend's decisions (and checks)."""
        return self.inner.decide_lanes(lanes)

    def lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any = None,
                keep: bool = False, like: Prepared | None = None) -> Prepared:
        """The inner backend's own preparation (the production launches), one of whose
        launches fails."""
        inner = like.inner if isinstance(like, FaultyPrepared) else None
        return FaultyPrepared(self, self.inner.lay_out(plan, groups, decided, keep, inner))


class FaultyPrepared(Prepared):
    """Another backend's prepared object whose loads' launches may fail."""

    def __init__(self, backend: FaultyBackend, inner: Prepared) -> None:
        self.backend, self.inner, self.counters = backend, inner, (backend,)

    @property
    def num_groups(self) -> int:
        return self.inner.num_groups

    def start(self, lanes, src_rows, dst_rows) -> FaultyLaunches:
        return FaultyLaunches(self.backend, self.inner.start(lanes, src_rows, dst_rows))


class FaultyLaunches(Launches):
    """Another backend's launches of one load; the backend's ``fail_on_launch``-th launch
    (counting every launch call of its loads) raises before enqueuing anything."""

    def __init__(self, backend: FaultyBackend, inner: Launches) -> None:
        self.backend, self.inner, self.counters = backend, inner, (backend,)

    @property
    def num_groups(self) -> int:
        return self.inner.num_groups

    def _launch(self, group: int) -> None:
        if self.backend.launches == self.backend.fail_on_launch:
            raise RuntimeError(f"injected fault on launch {self.backend.launches}")
        self.inner.launch(group)


class NullBackend(CopyBackend):
    """Validates and counts launches but moves no bytes (bookkeeping benchmarks and tests):
    a load of it is the caller's own work plus one event record per group."""

    name = "null"
    converts = True  # moves nothing, converting jobs included

    def lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any = None,
                keep: bool = False, like: Prepared | None = None) -> Prepared:
        """The groups that would launch (a job with rows in them); nothing else to build."""
        return NullPrepared(self, tuple(any(plan.jobs[j].num_rows for j, _ in g) for g in groups))

    def _execute(self, plan: CopyPlan) -> None:
        """Nothing to copy: the plan was already validated by ``make_plan``."""


class NullPrepared(Prepared):
    """A size class of the null backend: which groups would launch."""

    def __init__(self, backend: NullBackend, live: tuple[bool, ...]) -> None:
        self.live, self.counters = live, (backend,)

    @property
    def num_groups(self) -> int:
        return len(self.live)

    def start(self, lanes, src_rows, dst_rows) -> NullLaunches:
        return NullLaunches(self.live, self.counters)


class NullLaunches(Launches):
    """A load that moves nothing: each live group counted as a launch."""

    def __init__(self, live: tuple[bool, ...], counters: tuple) -> None:
        self.live, self.counters = live, counters

    @property
    def num_groups(self) -> int:
        return len(self.live)

    def counts(self, group: int) -> bool:
        return self.live[group]

    def run(self, events: Sequence[Any], stream: Any) -> None:
        """Every live group counted, each group's event recorded (``runtime.record``)."""
        live = sum(self.live)
        for backend in self.counters:
            backend.launches += live
        record = runtime.record
        for event in events:
            record(event, stream)

    def _launch(self, group: int) -> None:
        """Nothing to launch."""
