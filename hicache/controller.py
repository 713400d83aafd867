"""`HybridCacheController`: turns "back up these slots" / "bring these back" into launches.

Life of an operation (``write`` = backup D2H, ``load`` = H2D):

    write()/load()     validate, allocate destination slots all-or-nothing, queue
         |             (short on any pool -> free what this call took, return None)
    start_writing()/start_loading()
         |             merge every queued op into one batch (see hicache.batch), launch
         |             (a raising launch -> free the batch's destination slots, fail acks)
    poll()             finished batches -> Acks in order; successful writes mark their
                       host pages readable by later loads

CPU mode (device ``cpu``) runs the same path synchronously, without streams.
"""
from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
import torch

from host_pools.group import HostPoolGroup
from host_pools.spec import slots_to_rows
from hicache.batch import Batch, Op, launch_backup, launch_load, plan_jobs
from hicache.config import HiCacheConfig
from hicache.device_pool import DevicePool
from hicache.layer_sync import LayerDoneCounter
from hicache.stats import TransferStats
from transfer_kernels import CopyBackend, RowTable, TritonBackend, get_backend

AllocFn = Callable[[int], "torch.Tensor | None"]
FreeFn = Callable[[torch.Tensor], Any]


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
            pool name; default to the device pools' allocators.
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
        self._alloc = {n: (device_alloc or {}).get(n, self.device_pools[n].alloc) for n in own}
        self._free = {n: (device_free or {}).get(n, self.device_pools[n].free) for n in own}
        # Host pages whose backup finished: only those may be loaded.
        self._host_valid = {n: np.zeros(host_group.pools[n].allocator.num_pages, np.bool_) for n in own}
        self.device = next(iter(self.device_pools.values())).device
        self._cuda = self.device.type == "cuda"
        self.write_stream = torch.cuda.Stream(self.device) if self._cuda else None
        self.load_stream = torch.cuda.Stream(self.device) if self._cuda else None
        self.layer_done = LayerDoneCounter(self.stack.num_model_layers, self.device)
        self._queues: dict[str, list[Op]] = {"d2h": [], "h2d": []}
        self._inflight: deque[Batch] = deque()
        self._ids = itertools.count()
        self._tables: dict[tuple[str, str], RowTable] = {}
        self.counters = TransferStats()
        self.last_op_id = -1

    # ---- queueing -------------------------------------------------------------------
    def write(self, device_indices: torch.Tensor, extra: Mapping[str, torch.Tensor] | None = None,
              *, op_id: int | None = None) -> dict[str, torch.Tensor] | None:
        """Queue a backup of device slots; allocate their host slots all-or-nothing.

        Args:
            device_indices: anchor device token slots (whole pages, int64, CPU).
            extra: device slots of other own-indexed pools, e.g. ``{"swa": slots}``.
            op_id: the caller's id for the ack (default: a fresh integer).
        Returns:
            Host slots keyed by pool name, or ``None`` if any host pool is short (nothing
            is allocated or queued then).
        Raises:
            ValueError: unaligned or out-of-range slots, or ``extra`` naming a pool that is
                not an own-indexed pool of the stack.
        """
        src = self._own_slots(device_indices, extra, "device_indices")
        for name, slots in src.items():
            self._check_range(slots, self.device_pools[name].num_tokens, name, "device_indices")
        host = self.host_group.pools
        dst = self._alloc_all(src, lambda n, k: host[n].alloc(k), lambda n, s: host[n].free(s))
        if dst is None:
            return None
        for name, slots in dst.items():  # fresh host pages are unreadable until acked
            self._host_valid[name][self._host_pages(name, slots)] = False
        return self._enqueue("d2h", src, dst, op_id)

    def load(self, host_indices: torch.Tensor, extra: Mapping[str, torch.Tensor] | None = None,
             *, op_id: int | None = None) -> dict[str, torch.Tensor] | None:
        """Queue a load of host slots; allocate their device slots all-or-nothing.

        Returns:
            Device slots keyed by pool name, or ``None`` if any device pool is short.
        Raises:
            ValueError: bad slots or pool names, or host slots that were never written
                (backup not acked) or were freed.
        """
        src = self._own_slots(host_indices, extra, "host_indices")
        for name, slots in src.items():
            alloc = self.host_group.pools[name].allocator
            pages = alloc.pages_of(slots)
            if not (alloc.owns_pages(pages) and self._host_valid[name][pages].all()):
                raise ValueError(f"host_indices: slots of pool {name!r} were never written or were freed")
        dst = self._alloc_all(src, lambda n, k: self._alloc[n](k), lambda n, s: self._free[n](s))
        if dst is None:
            return None
        try:  # a server-supplied allocator must hand out whole aligned pages too
            self._own_slots(dst.get(self.stack.anchor.name), {k: v for k, v in dst.items()
                                                             if k != self.stack.anchor.name}, "device_alloc")
        except ValueError:
            for name, slots in dst.items():
                self._free[name](slots)
            raise
        return self._enqueue("h2d", src, dst, op_id)

    def _own_slots(self, anchor: torch.Tensor, extra: Mapping[str, torch.Tensor] | None,
                   what: str) -> dict[str, torch.Tensor]:
        own = {p.name for p in self.stack.own_indexed}
        anchor_name = self.stack.anchor.name
        slots = {anchor_name: anchor} if anchor is not None and anchor.numel() else {}
        for name, s in (extra or {}).items():
            if name not in own or name == anchor_name:
                raise ValueError(f"extra: {name!r} is not an own-indexed pool other than the anchor; "
                                 f"allowed: {sorted(own - {anchor_name})}")
            if s.numel():
                slots[name] = s
        if not slots:
            raise ValueError(f"{what}: nothing to transfer (empty anchor slots and no extra)")
        for name, s in slots.items():
            unit = self.stack.page_size if name == anchor_name else self.stack.pool(name).tokens_per_row
            slots_to_rows(s, unit, what=f"{what} ({name!r}, whole pages of {unit})")
        return {n: s.to("cpu", torch.int64) for n, s in slots.items()}

    @staticmethod
    def _check_range(slots: torch.Tensor, limit: int, name: str, what: str) -> None:
        arr = slots.numpy()
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= limit:
            raise ValueError(f"{what}: slots of {name!r} must be in [0, {limit}), got [{lo}, {hi}]")

    @staticmethod
    def _alloc_all(src: dict[str, torch.Tensor], alloc: Callable, free: Callable) -> dict | None:
        taken: dict[str, torch.Tensor] = {}
        for name, slots in src.items():
            got = alloc(name, slots.numel())
            if got is None:
                for n, s in taken.items():
                    free(n, s)
                return None
            taken[name] = got.to("cpu", torch.int64)
        return taken

    def _host_pages(self, name: str, slots: torch.Tensor):
        """Pages of host slots this controller allocated itself (already whole pages)."""
        page = self.host_group.pools[name].allocator.page_size
        return slots.numpy()[::page] // page

    def _enqueue(self, direction: str, src: dict, dst: dict, op_id: int | None) -> dict[str, torch.Tensor]:
        op_id = next(self._ids) if op_id is None else op_id
        self.last_op_id = op_id
        self._queues[direction].append(Op(op_id, direction, src, dst))
        return dict(dst)

    # ---- launching ------------------------------------------------------------------
    def _table_pair(self, direction: str) -> Callable[[str], tuple[RowTable, RowTable]]:
        def pair(name: str) -> tuple[RowTable, RowTable]:
            dev, host = self.device_pools[name].row_table(), self._host_table(name)
            return (dev, host) if direction == "d2h" else (host, dev)
        return pair

    def _host_table(self, name: str) -> RowTable:
        key = ("host", name)
        if key not in self._tables:
            self._tables[key] = RowTable.from_views(self.host_group.pools[name].row_views(), name=name)
        return self._tables[key]

    def start_writing(self) -> None:
        """Launch every queued write as one batch (all layers, on the write stream)."""
        self._start("d2h")

    def start_loading(self) -> int:
        """Launch every queued load as one batch, layer by layer; returns its consumer index."""
        return self._start("h2d")

    def _start(self, direction: str) -> int:
        ops, self._queues[direction] = self._queues[direction], []
        if not ops:
            return self.layer_done.consumer
        batch = Batch(ops, direction)
        if direction == "h2d":
            batch.consumer = self.layer_done.begin()
        stream = self.write_stream if direction == "d2h" else self.load_stream
        try:
            with _on_stream(stream):
                self._launch(batch)
        except Exception as exc:  # any launch failure rolls the whole batch back
            self._rollback(batch, exc)
        self._inflight.append(batch)
        if direction == "h2d":
            self.layer_done.set_consumer(batch.consumer)
        return batch.consumer

    def _launch(self, batch: Batch) -> None:
        jobs = plan_jobs(self.stack, batch.ops, self._table_pair(batch.direction))
        if batch.direction == "d2h":
            launch_backup(jobs, self.backend)
        else:
            launch_load(self.stack, jobs, self.backend, lambda i: self.layer_done.record(i, batch.consumer))
        if self._cuda:
            batch.event = torch.cuda.Event()
            batch.event.record()

    def _rollback(self, batch: Batch, exc: BaseException) -> None:
        batch.error = f"{type(exc).__name__}: {exc}"
        stream = self.write_stream if batch.direction == "d2h" else self.load_stream
        if stream is not None:
            # Launches before the failing one may still be copying into the slots freed
            # below: whatever reuses them on the current stream must run after those.
            torch.cuda.current_stream(self.device).wait_stream(stream)
        for op in batch.ops:
            for name, slots in op.dst.items():
                if batch.direction == "d2h":
                    self.host_group.pools[name].free(slots)
                else:
                    self._free[name](slots)
        self.counters.rollback(batch.direction)

    # ---- completion -----------------------------------------------------------------
    def poll(self) -> list[Ack]:
        """Acks of finished batches, oldest first (never blocks)."""
        acks: list[Ack] = []
        while self._inflight and (self._inflight[0].event is None or self._inflight[0].event.query()):
            acks.extend(self._finish(self._inflight.popleft()))
        return acks

    def _finish(self, batch: Batch) -> list[Ack]:
        ok = batch.error is None
        acks = []
        for op in batch.ops:
            if ok and batch.direction == "d2h":
                for name, slots in op.dst.items():
                    self._host_valid[name][self._host_pages(name, slots)] = True
            tokens, nbytes = self.counters.op_volume(self.stack, op.src)
            acks.append(Ack(op.op_id, batch.direction, ok, tokens, nbytes, batch.error))
            self.counters.record(batch.direction, ok, tokens, nbytes)
        return acks

    def pending(self) -> int:
        """Operations queued or in flight (not yet acked)."""
        return sum(len(q) for q in self._queues.values()) + sum(len(b.ops) for b in self._inflight)

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
    if config.io_backend == "triton":
        return TritonBackend(max_programs=config.max_copy_programs)
    return get_backend(config.io_backend, fresh=True)


class _on_stream:
    """``torch.cuda.stream(s)`` that first orders ``s`` after the current stream; no-op on CPU."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.ctx = stream, None

    def __enter__(self) -> None:
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
            self.ctx = torch.cuda.stream(self.stream)
            self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
