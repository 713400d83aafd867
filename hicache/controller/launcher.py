"""`Launcher`: a batch launched on its copy stream (its rows from the planner, its size
class found), and its event recorded; the backend, the copy streams and the events.

The route of every (direction, pool set) on the controller's backend is decided when the
controller is built (`transfer_kernels.backends.route.Route`: how each job moves, its
host side and page span, checked once; another backend swapped in gets its routes on
first use). A warm batch is then short by design::

    rows       its pool set and each job's rows (`BatchPlanner.rows`, unchecked)
    look-up    its size class's prepared object: ONE cache, its route's (``route.prepared``)
    start      the rows written where the launches read them, one upload
    run        per launch group: its DMA slice, one launch, its layers' event (a load)

The first batch of a size class lays it out (``route.prepare``: launch groups of
consecutive model layers for a load, `hicache.controller.groups`; the backend's layouts).
Backups (D2H) are one all-layer launch. A launch that raises fails the batch here: every
layer event of a load is signalled (no waiter hangs), the caller's stream is ordered
after the copy stream, and the batch's event is recorded; its slots are the controller's
to give back.

On CUDA the launch runs on the direction's high-priority copy stream, entered through
`OnStream` (built once per stream); on the CPU it runs synchronously, with the same
runtime calls (a record of no event), so a load's call budget is the same on every device.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from hicache.config import HiCacheConfig
from hicache.controller.batch import Batch
from hicache.controller.groups import LoadGrouper
from hicache.controller.layer_sync import LayerDoneCounter, OnStream
from hicache.controller.planner import BatchPlanner, PoolSet, Rows
from transfer_kernels import AutoBackend, CopyBackend, StagedBackend, TritonBackend, get_backend, runtime
from transfer_kernels.backends.route import Route


class Launcher:
    """Part: runs batches (see the module docstring).

    Args:
        backend: the copy backend (`use` swaps it between batches).
        planners: per direction, its pool sets.
        load_groups: the loads' launch groups.
        layer_done: the load events (the launcher records them).
        streams: per direction, its copy stream (``None`` on the CPU).
    Not thread-safe: driven by the controller.
    """

    def __init__(self, backend: CopyBackend, planners: Mapping[str, BatchPlanner], load_groups: LoadGrouper,
                 layer_done: LayerDoneCounter, streams: Mapping[str, Any]) -> None:
        self._planners, self._groups, self._layer_done = planners, load_groups, layer_done
        self._streams = dict(streams)
        self._cuda = any(s is not None for s in self._streams.values())
        self._on_stream = {d: OnStream(s) for d, s in self._streams.items()}  # built once
        self._spare_events: list = []  # events of acked batches: recorded again
        self._routes_of: dict[CopyBackend, dict] = {}  # per backend used, its routes
        self.use(backend)

    def use(self, backend: CopyBackend) -> None:
        """Launch later batches through ``backend`` (tests and benchmarks swap it); the
        first time, its route of every (direction, pool set) is decided now."""
        self.backend = backend
        routes = self._routes_of.get(backend)
        if routes is None:
            routes = self._routes_of[backend] = {
                (d, pool_set.roots): _route(backend, pool_set, planner.device)
                for d, planner in self._planners.items() for pool_set in planner.pool_sets.values()
                if pool_set.lanes}
        self._routes = routes

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
            direction = batch.direction
            pool_set, src_rows, dst_rows, counts = self._planners[direction].rows(batch.ops)
            if src_rows is None:  # only pools without data (an anchor of sliding-window layers)
                if direction == "h2d":
                    self._layer_done.record_all(batch.consumer)
                self._record(batch)
                return
            route = self._routes[direction, pool_set.roots]
            if isinstance(route, str):  # the backend refused these tables when it decided
                raise ValueError(route)
            if direction == "d2h":  # one launch of every layer
                prepared = route.prepared.get(counts) or route.prepare(
                    counts, route.plan(src_rows, dst_rows), (pool_set.pairs,))
                prepared.start(pool_set.lanes, src_rows, dst_rows).launch(0)
            else:  # one launch per group of consecutive model layers, then its layers' event
                key = (counts, self._groups.min_bytes)
                prepared = route.prepared.get(key) or self._lay_out(route, key, pool_set, src_rows, dst_rows)
                layer_done = self._layer_done
                prepared.start(pool_set.lanes, src_rows, dst_rows).run(
                    layer_done.group_events(batch.consumer, prepared.tag), layer_done.stream)
            self._record(batch)
        except Exception as exc:  # any launch failure fails the whole batch
            self.fail(batch, exc, outer)

    def _lay_out(self, route: Route, key: tuple, pool_set: PoolSet, src_rows: Rows, dst_rows: Rows):
        """A load's new size class: its launch groups, then the backend's layouts (the
        groups' model-layer bounds kept with it)."""
        groups = self._groups.groups(pool_set.pools, key[0])
        return route.prepare(key, route.plan(src_rows, dst_rows), groups.groups, tag=groups.layers)

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
        """``batch`` was acked and has an event (CUDA): the event (completed) serves a later batch."""
        self._spare_events.append(batch.event)
        batch.event = None


def _route(backend: CopyBackend, pool_set: PoolSet, device: torch.device) -> Route | str:
    """The route of ``pool_set`` on ``backend``, or why the backend refuses its tables (a
    batch of it then fails at launch, as any launch that raises)."""
    try:
        return backend.route(pool_set.lanes, device)
    except ValueError as exc:
        return str(exc)


def make_backend(config: HiCacheConfig) -> CopyBackend:
    """The copy backend ``config.io_backend`` names; every triton kernel (alone or in
    ``auto``) bounded by ``max_copy_programs`` (``None``: the tuned value)."""
    if config.io_backend == "triton":
        return TritonBackend(max_programs=config.max_copy_programs)
    if config.io_backend == "auto":
        return AutoBackend(triton=TritonBackend(max_programs=config.max_copy_programs))
    if config.io_backend == "dma":  # its scatter / gather kernel
        return StagedBackend(kernel=TritonBackend(max_programs=config.max_copy_programs))
    return get_backend(config.io_backend)


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
