"""`HybridCacheController`: turns "back up these slots" / "bring these back" into launches.

Life of an operation (``write`` = backup D2H, ``load`` = H2D):

    write()/load()     validate (once, here; ``trusted=True`` skips it), allocate
         |             destination slots all-or-nothing,
         |             queue (short on any pool -> free what this call took, return None;
         |             an allocator that raises -> free what this call took, re-raise)
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
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
import torch

from host_pools.group import HostPoolGroup
from hicache.batch import Batch, Op, launch_backup, launch_load, load_groups, plan_jobs
from hicache.config import HiCacheConfig
from hicache.device_pool import DevicePool
from hicache.layer_sync import LayerDoneCounter
from hicache.slots import alloc_all, check_owned, check_pages, edge_slots, free_all
from hicache.stats import TransferStats, volume_table
from transfer_kernels import CopyBackend, RowTable, TritonBackend, get_backend
from transfer_kernels.plan import LaunchGroups, exec_device, trusted_plan
from transfer_kernels.rows import first_duplicate

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


class HybridCacheController:
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
        self.write_stream = torch.cuda.Stream(self.device) if self._cuda else None
        self.load_stream = torch.cuda.Stream(self.device) if self._cuda else None
        self.layer_done = LayerDoneCounter(self.stack.num_model_layers, self.device)
        self._tables: dict[tuple[str, str], RowTable] = {}
        self._anchor = self.stack.anchor.name
        # What a batch needs, computed once: per direction, each data pool's (source,
        # destination) tables; the destination page size per root; the plan's device.
        self._routes = {d: self._route_tables(d) for d in DIRECTIONS}
        self._dst_pages = {"d2h": {n: host_group.pools[n].allocator.page_size for n in own},
                           "h2d": {n: self.device_pools[n].allocator.page_size for n in own}}
        first = next(iter(self._routes["d2h"].values()), None)
        self._plan_device = exec_device(*first) if first else torch.device("cpu")
        self._load_groups: dict[tuple[str, ...], LaunchGroups] = {}
        self._volume = volume_table(self.stack)
        self._queues: dict[str, list[Op]] = {d: [] for d in DIRECTIONS}
        self._inflight: dict[str, deque[Batch]] = {d: deque() for d in DIRECTIONS}
        self._ids = itertools.count()
        self.counters = TransferStats()
        self.last_op_id = -1
        self.closed = False
        if self._cuda:
            self._stage_descriptors()

    def _route_tables(self, direction: str) -> dict[str, tuple[RowTable, RowTable]]:
        routes = {}
        for p in self.stack.data_pools():
            dev, host = self.device_pools[p.name].row_table(), self._host_table(p.name)
            routes[p.name] = (dev, host) if direction == "d2h" else (host, dev)
        return routes

    def _stage_descriptors(self) -> None:
        """Upload every table's descriptor now, not on the first transfer's hot path."""
        for p in self.stack.data_pools():
            self.device_pools[p.name].row_table().device_desc(self.device)
            self._host_table(p.name).device_desc(self.device)

    # ---- queueing -------------------------------------------------------------------
    def write(self, device_indices: Any, extra: Mapping[str, Any] | None = None, *,
              trusted: bool = False) -> dict[str, torch.Tensor] | None:
        """Queue a backup of device slots; allocate their host slots all-or-nothing.

        Args:
            device_indices: anchor device token slots (whole pages; an int64 CPU tensor,
                a list or a numpy array; empty when only ``extra`` moves).
            extra: device slots of other own-indexed pools, e.g. ``{"swa": slots}``.
            trusted: skip the coercion and every check of the slots (an internal caller
                such as the radix tree, which validated them itself). The caller then
                guarantees: ``device_indices`` and each ``extra`` value are 1-D int64
                contiguous CPU tensors (possibly empty) of whole aligned pages of their
                pool, in range, not repeated, currently allocated on the device;
                ``extra`` is ``None`` or a dict keyed by own-indexed pools other than the
                anchor; at least one tensor is non-empty. A broken promise is undefined
                behaviour (wrong rows copied, or an error at launch).
        Returns:
            Host slots keyed by pool name, or ``None`` if any host pool is short (nothing
            is allocated or queued then). The op's id is ``last_op_id`` afterwards.
        Raises:
            ValueError: slots that are unaligned, out of range, repeated, on a CUDA device
                or not allocated on the device; ``extra`` naming a pool that is not an
                own-indexed pool of the stack. Nothing changes.
            RuntimeError: the controller is closed.
        """
        self._check_open()
        if trusted:
            src = self._trusted_slots(device_indices, extra, "device_indices")
        else:
            src = edge_slots(self.stack, device_indices, extra, "device_indices")
            self._check_device_slots(src)
        host = self.host_group.pools
        got = _alloc_own(self._host_allocs, src, "device_indices", "host")
        if got is None:
            return None
        return self._enqueue(Op(-1, "d2h", src, *got))

    def _check_device_slots(self, src: dict[str, torch.Tensor]) -> None:
        for name, slots in src.items():
            pool = self.device_pools[name]
            if name in self._server_alloc:  # the server's own slots: shape and range only
                check_pages(slots, pool.allocator.page_size, pool.num_tokens, _label("device_indices", name))
            else:  # aligned, in range, not repeated, and allocated
                check_owned(pool.allocator, slots, _label("device_indices", name))

    def _trusted_slots(self, anchor: torch.Tensor, extra: dict[str, torch.Tensor] | None,
                       what: str) -> dict[str, torch.Tensor]:
        """A trusted call's slots keyed by pool, empty ones dropped (no other check)."""
        src = {self._anchor: anchor} if anchor.numel() else {}
        if extra:
            for name, slots in extra.items():
                if slots.numel():
                    src[name] = slots
        if not src:
            raise ValueError(f"{what}: nothing to transfer (empty anchor slots and no extra)")
        return src

    def load(self, host_indices: Any, extra: Mapping[str, Any] | None = None, *,
             trusted: bool = False) -> dict[str, torch.Tensor] | None:
        """Queue a load of host slots; allocate their device slots all-or-nothing.

        Args:
            host_indices: anchor host token slots from an acked ``write`` (whole pages).
            extra: host slots of other own-indexed pools, e.g. ``{"swa": slots}``.
            trusted: skip the coercion and every check of the slots (an internal caller
                such as the radix tree). The caller guarantees what ``write(trusted=True)``
                lists, for host slots, and that every page was filled by an acked
                ``write`` (or declared by ``mark_host_written``) and not freed since.
                A server-supplied ``device_alloc``'s slots are still checked.
        Returns:
            Device slots keyed by pool name, or ``None`` if any device pool is short.
        Raises:
            ValueError: bad slots or pool names, or host slots that were never written
                (backup not acked), were freed, or were freed and allocated again since.
                Also when a server allocator hands out bad slots (they are given back).
            RuntimeError: the controller is closed.
        """
        self._check_open()
        if trusted:
            src = self._trusted_slots(host_indices, extra, "host_indices")
        else:
            src = edge_slots(self.stack, host_indices, extra, "host_indices")
            for name, slots in src.items():
                self._check_loadable(name, slots)
        if not self._server_alloc:  # the device pools' own allocators: pages straight from them
            got = _alloc_own(self._device_allocs, src, "host_indices", "device")
            return None if got is None else self._enqueue(Op(-1, "h2d", src, got[0]))
        # a server's allocator: its slots are coerced and checked
        dst = alloc_all(src, lambda n, k: self._alloc[n](k), lambda n, s: self._free[n](s),
                        self._server_alloc)
        if dst is None:
            return None
        self._check_server_slots(dst)
        return self._enqueue(Op(-1, "h2d", src, dst))

    def _check_server_slots(self, dst: dict[str, torch.Tensor]) -> None:
        """A server-supplied allocator must hand out distinct whole aligned pages in range."""
        try:
            for name in self._server_alloc & dst.keys():
                pool, what = self.device_pools[name], _label("device_alloc", name)
                check_pages(dst[name], pool.allocator.page_size, pool.num_tokens, what)
                twice = first_duplicate(dst[name])
                if twice is not None:
                    raise ValueError(f"{what}: slot {twice} handed out twice in one call")
        except ValueError:
            free_all(dst, lambda n, s: self._free[n](s))
            raise

    def mark_host_written(self, host_indices: Any, extra: Mapping[str, Any] | None = None) -> None:
        """Declare host slots that were filled outside the controller loadable.

        For host pages whose bytes came from elsewhere (the storage tier reads pages
        straight into host slots): the caller allocated the slots from the host pools and
        wrote every data pool rooted at them. Afterwards ``load`` accepts them, exactly as
        after an acked ``write``, until they are freed.

        Args:
            host_indices: anchor host slots (whole pages; empty when only ``extra`` is given).
            extra: host slots of other own-indexed pools, e.g. ``{"swa": slots}``.
        Raises:
            ValueError: bad slots or pool names, or slots that are not allocated (nothing changes).
            RuntimeError: the controller is closed.
        """
        self._check_open()
        src = edge_slots(self.stack, host_indices, extra, "host_indices")
        stamps = {}
        for name, slots in src.items():
            alloc = self.host_group.pools[name].allocator
            pages = check_owned(alloc, slots, _label("host_indices", name), "never handed out, or freed")
            stamps[name] = (pages, alloc.generations(pages))
        for name, (pages, gens) in stamps.items():  # all checked first: all or nothing
            self._host_stamp[name][pages] = gens

    def _check_loadable(self, name: str, slots: torch.Tensor) -> None:
        pool = self.host_group.pools[name]
        what = _label("host_indices", name)
        pages = check_owned(pool.allocator, slots, what, "never written, or freed")
        if not (self._host_stamp[name][pages] == pool.allocator.generations(pages)).all():
            raise ValueError(f"{what}: slots were never written (backup not acked yet), or were "
                             f"freed and allocated again since their backup")

    def _enqueue(self, op: Op) -> dict[str, torch.Tensor]:
        op.op_id = self.last_op_id = next(self._ids)
        self._queues[op.direction].append(op)
        return dict(op.dst)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("controller: closed (host memory was released by close())")

    # ---- launching ------------------------------------------------------------------
    def _host_table(self, name: str) -> RowTable:
        key = ("host", name)
        if key not in self._tables:
            self._tables[key] = RowTable.from_views(self.host_group.pools[name].row_views(), name=name,
                                                    chunk_starts=self.host_group.pin_chunks(name))
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
            on_stream = _on_stream(self.write_stream if direction == "d2h" else self.load_stream)
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
        direction = batch.direction
        jobs = plan_jobs(self.stack, batch.ops, self._routes[direction].__getitem__,
                         self._dst_pages[direction])
        # rows derived from slots validated at write()/load(): no second round of checks
        plan = trusted_plan(jobs.values(), self._plan_device)
        if direction == "d2h":
            launch_backup(plan, self.backend)
        else:
            pools = tuple(name for name, _ in jobs)
            groups = self._load_groups.get(pools)
            if groups is None:
                groups = self._load_groups[pools] = load_groups(self.stack, pools)
            consumer, record = batch.consumer, self.layer_done.record
            launch_load(plan, groups, self.backend,
                        (lambda i: record(i, consumer)) if self._cuda else None)
        self._record_event(batch)

    def _record_event(self, batch: Batch) -> None:
        if self._cuda:
            batch.event = torch.cuda.Event()
            batch.event.record()

    def _rollback(self, batch: Batch, exc: BaseException, outer: Any = None) -> None:
        """Free the batch's destination slots; on CUDA it runs on the batch's stream and
        ``outer`` is the caller's (compute) stream."""
        batch.error = f"{type(exc).__name__}: {exc}"
        if batch.direction == "h2d":
            # Every layer event fires after what was enqueued: no waiter hangs or reads early.
            self.layer_done.record_all(batch.consumer)
        if outer is not None:
            # Launches before the failing one may still be copying into the slots freed
            # below: whatever reuses them on the compute stream must run after those.
            outer.wait_stream(torch.cuda.current_stream(self.device))
        self._record_event(batch)
        host = self.host_group.pools
        free = ((lambda n, s: host[n].free(s)) if batch.direction == "d2h"
                else (lambda n, s: self._free[n](s)))
        errors = [e for op in batch.ops for e in free_all(op.dst, free)]
        if errors:
            batch.error += "; rollback: " + "; ".join(errors)
        self.counters.rollback(batch.direction)

    # ---- completion -----------------------------------------------------------------
    def poll(self) -> list[Ack]:
        """Acks of finished batches (never blocks): per direction, oldest first.

        A finished load is not held back by an unfinished backup (or the reverse).
        """
        acks: list[Ack] = []
        for queue in self._inflight.values():
            while queue and (queue[0].event is None or queue[0].event.query()):
                acks.extend(self._finish(queue.popleft()))
        return acks

    def _finish(self, batch: Batch) -> list[Ack]:
        ok, direction, error = batch.error is None, batch.direction, batch.error
        volume, acks, totals = self._volume.volume, [], {}
        for op in batch.ops:
            if ok and direction == "d2h":
                for name, (pages, gens) in op.host_stamps.items():
                    self._host_stamp[name][pages] = gens
            counts = {name: slots.numel() for name, slots in op.src.items()}
            acks.append(Ack(op.op_id, direction, ok, *volume(counts), error))
            for name, n in counts.items():
                totals[name] = totals.get(name, 0) + n
        # the counters take the batch's volume at once, not op by op
        tokens, nbytes = (acks[0].tokens, acks[0].bytes) if len(acks) == 1 else volume(totals)
        self.counters.record(direction, ok, tokens, nbytes, ops=len(acks))
        return acks

    def rolled_back_ops(self) -> set[int]:
        """Ids of ops whose batch was rolled back (their destination slots are free again)
        but whose failed acks ``poll`` has not returned yet."""
        return {op.op_id for queue in self._inflight.values() for batch in queue
                if batch.error is not None for op in batch.ops}

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


def _alloc_own(allocators: Mapping[str, Any], src: Mapping[str, torch.Tensor], what: str,
               tier: str) -> tuple[dict, dict] | None:
    """Whole pages for every pool of ``src`` from the controller's own allocators, all or
    nothing: ``(slots, (pages, generations))`` per pool, or ``None`` when one is short.

    Raises:
        ValueError: slots that are not whole pages of the destination's page size
            (nothing is taken then).
    """
    dst, stamps = {}, {}
    for name, slots in src.items():
        alloc = allocators[name]
        count, rest = divmod(slots.numel(), alloc.page_size)
        got = None if rest else alloc.alloc_pages(count)
        if got is None:
            for taken, (pages, _) in stamps.items():
                allocators[taken].free_pages(pages)
            if rest:
                raise ValueError(f"{_label(what, name)}: {slots.numel()} slots are not whole {tier} pages "
                                 f"of {alloc.page_size}")
            return None
        stamps[name] = got
        dst[name] = torch.from_numpy(alloc.page_slots(got[0]))
    return dst, stamps


def _label(what: str, pool: str) -> str:
    return f"{what} (pool {pool!r})"


def _make_backend(config: HiCacheConfig) -> CopyBackend:
    if config.io_backend == "triton":
        return TritonBackend(max_programs=config.max_copy_programs)
    return get_backend(config.io_backend, fresh=True)


class _on_stream:
    """``torch.cuda.stream(s)`` that first orders ``s`` after the current stream (kept as
    ``outer``); a no-op on CPU."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.ctx, self.outer = stream, None, None

    def __enter__(self) -> "_on_stream":
        if self.stream is not None:
            self.outer = torch.cuda.current_stream(self.stream.device)
            self.stream.wait_stream(self.outer)
            self.ctx = torch.cuda.stream(self.stream)
            self.ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
