"""`HybridCacheController`: turns "back up these slots" / "bring these back" into launches.

Life of an operation (``write`` = backup D2H, ``load`` = H2D):

    write()/load()     validate (once, here; ``trusted=True`` skips it), allocate
         |             destination slots all-or-nothing,
         |             queue (short on any pool -> free what this call took, return None;
         |             an allocator that raises -> free what this call took, re-raise);
         |             write_many()/load_many(): several ops, one allocator call per
         |             pool for all of them, their slots merged once
    start_writing()/start_loading()
         |             merge every queued op of that direction into one batch (see
         |             hicache.batch; the plan is built unchecked: its rows come from
         |             slots validated above), launch (a raising launch -> free the batch's
         |             destination slots, fail its acks; a load returns None)
    poll()             finished batches -> Acks, in order per direction; a successful
                       write makes its host pages loadable

Internal hops trust what the controller produced: its own allocators' destination slots
(a server-supplied ``device_alloc`` is checked), and the rows and plan of a batch.

Acks, not CUDA events, say that data is valid: a rolled-back load still signals every
layer event of its consumer (so no waiter hangs), but its device slots were freed.
CPU mode (device ``cpu``) runs the same path synchronously, without streams.
"""
from __future__ import annotations

import itertools
from collections import deque
from functools import partial
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
import torch

from host_pools.group import HostPoolGroup
from hicache.batch import Batch, LoadGrouper, Op, launch_backup, launch_load
from hicache.batch_plan import BatchPlanner
from hicache.config import HiCacheConfig
from hicache.device_pool import DevicePool
from hicache.host_dtype import codec_of
from hicache.layer_sync import LayerDoneCounter, OnStream
from hicache.queueing import QueueingMixin
from hicache.slots import free_all
from hicache.stats import TransferStats, volume_table
from transfer_kernels import (AutoBackend, CopyBackend, RowTable, StagedBackend, TritonBackend, get_backend,
                              runtime, tuning)
from transfer_kernels.plan import exec_device

AllocFn = Callable[[int], "torch.Tensor | None"]
FreeFn = Callable[[torch.Tensor], Any]
DIRECTIONS = ("d2h", "h2d")


class Ack(NamedTuple):
    """A finished operation: tokens and bytes per pool, and whether it succeeded."""

    op_id: int
    direction: str  # "d2h" | "h2d"
    success: bool
    tokens: dict[str, int]
    bytes: dict[str, int]
    error: str | None = None


class HybridCacheController(QueueingMixin):
    """Moves pages of every pool of a stack between device and host pools.

    Args:
        device_pools: device pools keyed by pool name (every pool of the stack).
        host_group: the host pools of the same stack.
        config: io_backend and max_copy_programs are read from it.
        backend: overrides ``config.io_backend`` (a name or a `CopyBackend`, e.g. a
            `FaultyBackend` in tests).
        device_alloc / device_free: the server's own device allocators per own-indexed
            pool name; default to the device pools' allocators. Slots they hand out are
            checked (whole pages, in range); slots passed to ``write`` are checked to be
            allocated only for pools using the device pools' own allocators.

    Attributes:
        write_stream / load_stream: the copy streams (CUDA; highest priority), or ``None``.
        layer_done: the load events the compute stream waits on per layer.
        load_groups: how loads group consecutive layers into launches; its ``min_bytes``
            (default ``tuning.LOAD_GROUP_MIN_BYTES``) may be changed between batches.
    Not thread-safe: call from the scheduler thread.
    """

    def __init__(self, device_pools: Mapping[str, DevicePool], host_group: HostPoolGroup,
                 config: HiCacheConfig, *, backend: Any = None,
                 device_alloc: Mapping[str, AllocFn] | None = None,
                 device_free: Mapping[str, FreeFn] | None = None) -> None:
        self.stack = host_group.stack
        missing = [p.name for p in self.stack if p.name not in device_pools]
        if missing:
            raise ValueError(f"device_pools: missing pools {missing}")
        self.device_pools, self.host_group, self.config = dict(device_pools), host_group, config
        self.backend = get_backend(backend) if backend is not None else _make_backend(config)
        own = [p.name for p in self.stack.own_indexed]
        self._server_alloc = set((device_alloc or {}).keys()) & set(own)
        self._alloc = {n: (device_alloc or {}).get(n, self.device_pools[n].alloc) for n in own}
        self._free = {n: (device_free or {}).get(n, self.device_pools[n].free) for n in own}
        # the own allocators of each tier (destination pages of writes and of loads)
        self._host_allocs = {n: host_group.pools[n].allocator for n in own}
        self._device_allocs = {n: self.device_pools[n].allocator for n in own}
        # Per host page: the allocation generation its last acked backup wrote into.
        # A page is loadable only while it is still that allocation (0 = never written).
        self._host_stamp = {n: np.zeros(host_group.pools[n].allocator.num_pages, np.int64)
                            for n in own}
        self.device = next(iter(self.device_pools.values())).device
        self._cuda = self.device.type == "cuda"
        # High priority: a copy's blocks are scheduled ahead of the forward pass's, so a
        # layer's event is not held back by a busy GPU (the forward then waits on it).
        self.write_stream = _copy_stream(self.device) if self._cuda else None
        self.load_stream = _copy_stream(self.device) if self._cuda else None
        self.layer_done = LayerDoneCounter(self.stack.num_model_layers, self.device)
        self.layer_done.stream = self.load_stream  # resolved once: records look nothing up
        self._streams = {"d2h": self.write_stream, "h2d": self.load_stream}
        self._on_stream = {d: OnStream(s) for d, s in self._streams.items()}  # built once
        self._spare_events: list = []  # batch events whose batch was acked: recorded again
        self._tables: dict[tuple[str, str], RowTable] = {}
        self._anchor = self.stack.anchor.name
        # What a batch needs, computed once: per direction, each data pool's (source,
        # destination) tables; the destination page size per root; the plan's device.
        self._routes = {d: self._route_tables(d) for d in DIRECTIONS}
        self._dst_pages = {"d2h": {n: host_group.pools[n].allocator.page_size for n in own},
                           "h2d": {n: self.device_pools[n].allocator.page_size for n in own}}
        first = next(iter(self._routes["d2h"].values()), None)
        self._plan_device = exec_device(*first) if first else torch.device("cpu")
        # per direction: a batch's jobs, tables and layers per set of roots, built once
        self._planners = {d: BatchPlanner(self.stack, self._routes[d], self._dst_pages[d], self._plan_device)
                          for d in DIRECTIONS}
        # Loads launch groups of consecutive layers moving >= load_groups.min_bytes (0: per layer).
        self.load_groups = LoadGrouper(self.stack, tuning.LOAD_GROUP_MIN_BYTES)
        self._volume = volume_table(self.stack)
        self._queues: dict[str, list[Op]] = {d: [] for d in DIRECTIONS}
        self._inflight: dict[str, deque[Batch]] = {d: deque() for d in DIRECTIONS}
        self._ids = itertools.count()
        self.counters = TransferStats()
        self.last_op_id = -1
        self.closed = False

    def _route_tables(self, direction: str) -> dict[str, tuple[RowTable, RowTable]]:
        routes = {}
        for p in self.stack.data_pools():
            dev, host = self.device_pools[p.name].row_table(), self._host_table(p.name)
            routes[p.name] = (dev, host) if direction == "d2h" else (host, dev)
        return routes

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("controller: closed (host memory was released by close())")

    # ---- launching ------------------------------------------------------------------
    def _host_table(self, name: str) -> RowTable:
        key = ("host", name)
        if key not in self._tables:
            host = self.host_group.pools[name]
            self._tables[key] = RowTable.from_views(host.row_views(), name=name,
                                                    chunk_starts=self.host_group.pin_chunks(name),
                                                    codec=codec_of(self.device_pools[name].spec, host.spec))
        return self._tables[key]

    def start_writing(self) -> None:
        """Launch every queued write as one batch (all layers, on the write stream).

        Raises:
            RuntimeError: the controller is closed.
        """
        self._check_open()
        self._start("d2h")

    def start_loading(self) -> int | None:
        """Launch every queued load as one batch, layer by layer, on the load stream.

        Returns:
            The batch's consumer index for ``layer_done.wait_until`` (the current one
            when nothing was queued), or ``None`` when the launch failed and the batch was
            rolled back (its acks report failure; its layer events are all signalled).
        Raises:
            RuntimeError: the controller is closed.
        """
        self._check_open()
        return self._start("h2d")

    def _start(self, direction: str) -> int | None:
        ops = self._queues[direction]
        if not ops:
            return self.layer_done.consumer if direction == "h2d" else None
        self._queues[direction] = []
        batch = Batch(ops, direction)
        if direction == "h2d":
            batch.consumer = self.layer_done.begin()
        if self._cuda:
            on_stream = self._on_stream[direction]
            with on_stream:
                self._launch_or_rollback(batch, on_stream.outer)
        else:
            self._launch_or_rollback(batch, None)
        self._inflight[direction].append(batch)
        if direction == "d2h":
            return None
        self.layer_done.set_consumer(batch.consumer)
        return None if batch.error else batch.consumer

    def _launch_or_rollback(self, batch: Batch, outer: Any) -> None:
        try:
            self._launch(batch)
        except Exception as exc:  # any launch failure rolls the whole batch back
            self._rollback(batch, exc, outer)

    def _launch(self, batch: Batch) -> None:
        # rows derived from slots validated at write()/load(): no second round of checks
        plan, pools, rows = self._planners[batch.direction].plan(batch.ops)
        if batch.direction == "d2h":
            launch_backup(plan, self.backend)
        else:
            groups = self.load_groups.groups(pools, rows)
            # on the CPU too: the same runtime calls (a record of no event), one per group
            launch_load(plan, groups, self.backend, partial(self.layer_done.record_span, index=batch.consumer))
        self._record_event(batch)

    def _record_event(self, batch: Batch) -> None:
        """One record of the batch's event on its stream (through ``runtime.record``, a
        record of no event on the CPU): an event of an acked batch is reused."""
        if not self._cuda:
            runtime.record(None, None)
            return
        batch.event = self._spare_events.pop() if self._spare_events else torch.cuda.Event()
        runtime.record(batch.event, self._streams[batch.direction])

    def _rollback(self, batch: Batch, exc: BaseException, outer: Any = None) -> None:
        """Fail the batch; on CUDA it runs on the batch's stream and ``outer`` is the
        caller's (compute) stream.

        Its destination slots are freed now when nothing of it can still be copying (CPU,
        or never launched); else when its event has completed (``poll``): a launch
        enqueued before the failing one may still write them, and a CPU writer (the
        storage tier filling host pages) handed a freed slot would be overwritten.
        """
        batch.error = f"{type(exc).__name__}: {exc}"
        if batch.direction == "h2d":
            # Every layer event fires after what was enqueued: no waiter hangs or reads early.
            self.layer_done.record_all(batch.consumer)
        if outer is not None:
            # Whatever the compute stream runs next (with these slots) runs after that too.
            outer.wait_stream(self._streams[batch.direction])
        self._record_event(batch)
        if outer is None:
            self._free_destinations(batch)
        self.counters.rollback(batch.direction)

    def _free_destinations(self, batch: Batch) -> None:
        """Give back a rolled-back batch's destination slots (errors join its message)."""
        host = self.host_group.pools
        free = ((lambda n, s: host[n].free(s)) if batch.direction == "d2h"
                else (lambda n, s: self._free[n](s)))
        errors = [e for op in batch.ops for e in free_all(op.dst, free)]
        if errors:
            batch.error += "; rollback: " + "; ".join(errors)
        batch.freed = True

    # ---- completion -----------------------------------------------------------------
    def poll(self) -> list[Ack]:
        """Acks of finished batches (never blocks): per direction, oldest first.

        A finished load is not held back by an unfinished backup (or the reverse).
        """
        acks: list[Ack] = []
        for queue in self._inflight.values():
            while queue and (queue[0].event is None or queue[0].event.query()):
                batch = queue.popleft()
                acks.extend(self._finish(batch))
                if batch.event is not None:  # completed: free to record for a later batch
                    self._spare_events.append(batch.event)
                    batch.event = None
        return acks

    def _finish(self, batch: Batch) -> list[Ack]:
        if batch.error is not None and not batch.freed:  # its copies have all ended now
            self._free_destinations(batch)
        ok, direction, error = batch.error is None, batch.direction, batch.error
        volume, acks, totals = self._volume.volume, [], {}
        seen: dict[tuple, tuple[dict, dict]] = {}  # ops of one shape: one volume, each ack its dicts
        for op in batch.ops:
            if ok and direction == "d2h":
                for name, (pages, gens) in op.stamps.items():
                    self._host_stamp[name][pages] = gens
            counts = tuple([(name, slots.numel()) for name, slots in op.src.items()])
            got = seen.get(counts)
            if got is None:
                tokens, nbytes = seen[counts] = volume(dict(counts))
            else:
                tokens, nbytes = dict(got[0]), dict(got[1])
            acks.append(Ack(op.op_id, direction, ok, tokens, nbytes, error))
            for name, n in counts:
                totals[name] = totals.get(name, 0) + n
        # the counters take the batch's volume at once, not op by op
        tokens, nbytes = (acks[0].tokens, acks[0].bytes) if len(acks) == 1 else volume(totals)
        self.counters.record(direction, ok, tokens, nbytes, ops=len(acks))
        return acks

    def rolled_back_ops(self) -> set[int]:
        """Ids of ops whose batch was rolled back and whose destination slots are free
        again, but whose failed acks ``poll`` has not returned yet (on CUDA a launched
        batch's slots are freed only by the ``poll`` that returns its acks: its ops stay
        out of this set and keep their slots until then)."""
        return {op.op_id for queue in self._inflight.values() for batch in queue
                if batch.freed for op in batch.ops}

    def pending(self) -> int:
        """Operations queued or in flight (not yet acked)."""
        return (sum(len(q) for q in self._queues.values())
                + sum(len(b.ops) for q in self._inflight.values() for b in q))

    def close(self) -> None:
        """Wait for every launched copy, roll back queued ops, release host memory.

        Afterwards ``write``/``load``/``start_*`` raise ``RuntimeError``; ``poll`` still
        returns the remaining acks (queued ops fail with "closed"). Idempotent.
        """
        if self.closed:
            return
        for stream in (self.write_stream, self.load_stream):
            if stream is not None:
                stream.synchronize()
        for direction in DIRECTIONS:
            ops, self._queues[direction] = self._queues[direction], []
            if ops:
                batch = Batch(ops, direction, consumer=self.layer_done.begin())
                self._rollback(batch, RuntimeError("controller closed before launch"))
                self._inflight[direction].append(batch)
        self.closed = True
        self._tables.clear()
        self.host_group.close()

    def check_integrity(self) -> None:
        """``RuntimeError`` if any host or device allocator breaks free + used = total."""
        self.host_group.check_integrity()
        for pool in self.device_pools.values():
            if pool.allocator is not None:
                pool.allocator.check_integrity()

    def stats(self) -> dict:
        """Counters: ops, tokens and bytes per pool and direction, failures, rollbacks."""
        return self.counters.as_dict()


def _make_backend(config: HiCacheConfig) -> CopyBackend:
    """The configured backend; every triton kernel (alone or in ``auto``) bounded by
    ``max_copy_programs`` (``None``: the tuned value)."""
    if config.io_backend == "triton":
        return TritonBackend(max_programs=config.max_copy_programs)
    if config.io_backend == "auto":
        return AutoBackend(triton=TritonBackend(max_programs=config.max_copy_programs))
    if config.io_backend == "dma":  # its scatter / gather kernel
        return StagedBackend(kernel=TritonBackend(max_programs=config.max_copy_programs))
    return get_backend(config.io_backend, fresh=True)


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    """A side stream at the device's highest priority (numerically lowest; torch maps a
    value beyond the range to the nearest end)."""
    ends = torch.cuda.Stream.priority_range() if hasattr(torch.cuda.Stream, "priority_range") else (-64,)
    return torch.cuda.Stream(device, priority=min(ends))
