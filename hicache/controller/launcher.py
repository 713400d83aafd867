"""`Launcher`: a batch planned, launched on its copy stream, and its event recorded.

Backups (D2H) are one all-layer launch; loads (H2D) are prepared once and launched in
groups of consecutive model layers (`hicache.controller.groups`), each group followed by
its layers' done-event. A launch that raises fails the batch here: every layer event of
a load is signalled (no waiter hangs), the caller's stream is ordered after the copy
stream, and the batch's event is recorded; its slots are the controller's to give back.

On CUDA the launch runs on the direction's high-priority copy stream, entered through
`OnStream` (built once per stream); on the CPU it runs synchronously, with the same
runtime calls (a record of no event), so a load's call budget is the same on every device.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Mapping

import torch

from hicache.config import HiCacheConfig
from hicache.controller.batch import Batch
from hicache.controller.groups import LoadGrouper, LoadGroups
from hicache.controller.layer_sync import LayerDoneCounter, OnStream
from hicache.controller.planner import BatchPlanner
from transfer_kernels import AutoBackend, CopyBackend, CopyPlan, TritonBackend, get_backend, runtime


class Launcher:
    """Part: runs batches (see the module docstring).

    Args:
        backend: the copy backend (`use` swaps it between batches).
        planners: per direction, the batch planner.
        load_groups: the loads' launch groups.
        layer_done: the load events (the launcher records them).
        streams: per direction, its copy stream (``None`` on the CPU).
    Not thread-safe: driven by the controller.
    """

    def __init__(self, backend: CopyBackend, planners: Mapping[str, BatchPlanner], load_groups: LoadGrouper,
                 layer_done: LayerDoneCounter, streams: Mapping[str, Any]) -> None:
        self.backend = backend
        self._planners, self._groups, self._layer_done = planners, load_groups, layer_done
        self._streams = dict(streams)
        self._cuda = any(s is not None for s in self._streams.values())
        self._on_stream = {d: OnStream(s) for d, s in self._streams.items()}  # built once
        self._spare_events: list = []  # events of acked batches: recorded again

    def use(self, backend: CopyBackend) -> None:
        """Launch later batches through ``backend`` (tests and benchmarks swap it)."""
        self.backend = backend

    def start(self, batch: Batch) -> None:
        """Launch ``batch`` on its copy stream and record its event; a raising launch
        fails it (`fail`). Never raises for the batch's own launch."""
        if self._cuda:
            on_stream = self._on_stream[batch.direction]
            with on_stream:
                self._run(batch, on_stream.outer)
        else:
            self._run(batch, None)

    def _run(self, batch: Batch, outer: Any) -> None:
        try:
            # rows derived from slots validated at write()/load(): no second round of checks
            plan, pools, rows = self._planners[batch.direction].plan(batch.ops)
            if batch.direction == "d2h":
                launch_backup(plan, self.backend)
            else:
                # on the CPU too: the same runtime calls (a record of no event), one per group
                launch_load(plan, self._groups.groups(pools, rows), self.backend,
                            partial(self._layer_done.record_span, index=batch.consumer))
            self._record(batch)
        except Exception as exc:  # any launch failure fails the whole batch
            self.fail(batch, exc, outer)

    def fail(self, batch: Batch, exc: BaseException, outer: Any = None) -> None:
        """Fail ``batch`` (launched or not): its load events all signalled, ``outer`` (the
        caller's compute stream on CUDA, or ``None``) ordered after its copy stream, its
        event recorded (a later ``poll`` sees it end after what was enqueued)."""
        batch.fail(exc)
        if batch.direction == "h2d":
            # Every layer event fires after what was enqueued: no waiter hangs or reads early.
            self._layer_done.record_all(batch.consumer)
        if outer is not None:
            # Whatever the compute stream runs next (with these slots) runs after that too.
            outer.wait_stream(self._streams[batch.direction])
        self._record(batch)

    def _record(self, batch: Batch) -> None:
        """One record of the batch's event on its stream (through ``runtime.record``, a
        record of no event on the CPU): an event of an acked batch is reused."""
        if not self._cuda:
            runtime.record(None, None)
            return
        batch.event = self._spare_events.pop() if self._spare_events else torch.cuda.Event()
        runtime.record(batch.event, self._streams[batch.direction])

    def recycle(self, batch: Batch) -> None:
        """``batch`` was acked: its event (completed) serves a later batch."""
        if batch.event is not None:
            self._spare_events.append(batch.event)
            batch.event = None


def launch_backup(plan: CopyPlan, backend: CopyBackend) -> None:
    """All layers of every pool in one launch."""
    if plan.jobs:
        backend.execute(plan)


def launch_load(plan: CopyPlan, groups: LoadGroups, backend: CopyBackend,
                on_group: Callable[[int, int], None] | None) -> None:
    """One launch per group of consecutive model layers, then ``on_group(first, end)``
    for the group's model layers ``[first, end)``.

    The batch is prepared once (the triton backend stages every group's layout and
    indices in one copy); each launch reads its part of it, O(1) Python per group.
    """
    launch, bounds = backend.prepare(plan, groups.groups).launch, groups.layers
    if on_group is None:
        for g in range(len(bounds) - 1):
            launch(g)
        return
    for g, first, end in zip(range(len(bounds) - 1), bounds, bounds[1:]):
        launch(g)
        on_group(first, end)


def make_backend(config: HiCacheConfig) -> CopyBackend:
    """The copy backend ``config.io_backend`` names; every triton kernel (alone or in
    ``auto``) bounded by ``max_copy_programs`` (``None``: the tuned value)."""
    if config.io_backend == "triton":
        return TritonBackend(max_programs=config.max_copy_programs)
    if config.io_backend == "auto":
        return AutoBackend(triton=TritonBackend(max_programs=config.max_copy_programs))
    return get_backend(config.io_backend, fresh=True)


def copy_streams(device: torch.device) -> dict[str, Any]:
    """Per direction, a side stream at the device's highest priority (numerically lowest;
    torch maps a value beyond the range to the nearest end); ``None`` on the CPU.

    High priority: a copy's blocks are scheduled ahead of the forward pass's, so a layer's
    event is not held back by a busy GPU (the forward then waits on it).
    """
    if device.type != "cuda":
        return {"d2h": None, "h2d": None}
    ends = torch.cuda.Stream.priority_range() if hasattr(torch.cuda.Stream, "priority_range") else (-64,)
    return {d: torch.cuda.Stream(device, priority=min(ends)) for d in ("d2h", "h2d")}
