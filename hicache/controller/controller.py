"""`HybridCacheController`: the public calls, construction and wiring of the parts.

The controller is assembled from parts that each own their state and are called through
a few named methods (composition; each part a module; the life of an operation:
`hicache.controller`):

    part                  owns                                          module
    Slots                 the allocators of both tiers, host pages'     hicache.controller.slots
                          loadable stamps; edge checks, destinations    (+ .edge, .alloc)
    OpQueue               op ids, queued ops, batches in flight         hicache.controller.queue
    BatchPlanner (x2)     per direction: the row tables, what a batch   hicache.controller.planner
                          of each pool set moves (fixed at build); a
                          batch's pool set and rows
    LoadGrouper           the loads' launch groups (``load_groups``)    hicache.controller.groups
    Launcher              backend and its route per (direction, pool    hicache.controller.launcher
                          set), copy streams, batch events; a batch's
                          launch, a failed launch's signals
    LayerDoneCounter      the load events per layer (``layer_done``)    hicache.controller.layer_sync
    BatchStats            the counters; each ack's tokens and bytes     hicache.controller.stats

Records passed between them: `Op`, `Batch`, `Ack` (`hicache.controller.batch`). Only
this class sequences the parts: an op is made by `Slots` and numbered by `OpQueue`; a
batch is taken from `OpQueue`, run by `Launcher`, and at ``poll`` stamped (`Slots`),
counted (`BatchStats`) and its event recycled (`Launcher`).
"""
from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import torch

from hicache.config import HiCacheConfig
from hicache.controller.batch import DIRECTIONS, Ack, Batch
from hicache.controller.edge import requests_of
from hicache.controller.groups import LoadGrouper
from hicache.controller.launcher import Launcher, copy_streams, make_backend
from hicache.controller.layer_sync import LayerDoneCounter
from hicache.controller.planner import planners
from hicache.controller.queue import OpQueue
from hicache.controller.slots import AllocFn, FreeFn, Slots
from hicache.controller.stats import BatchStats
from hicache.device_pool import DevicePool
from host_pools.group import HostPoolGroup
from transfer_kernels import CopyBackend, get_backend, tuning


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

    Attributes:
        write_stream / load_stream: the copy streams (CUDA; highest priority), or ``None``.
        layer_done: the load events the compute stream waits on per layer.
        load_groups: how loads group consecutive layers into launches; its ``min_bytes``
            (default ``tuning.LOAD_GROUP_MIN_BYTES``) may be changed between batches.
        backend: the copy backend (assigning one launches later batches through it).
        last_op_id: the id of the op queued last.
        mutex: the controller's re-entrant lock: every public call runs whole under it.
            Hold it across calls that must see one state (``with ctrl.mutex:`` a ``write``,
            then ``last_op_id``).
    Thread-safe: any number of threads may call it. Acks go to whichever thread polls (a
    tree owns its controller's: it polls for everyone). ``layer_done`` is read by the
    compute stream's thread as ever (`LayerDoneCounter.wait_until`).
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
        self.device = next(iter(self.device_pools.values())).device
        self._cuda = self.device.type == "cuda"
        streams = copy_streams(self.device)
        self.write_stream, self.load_stream = streams["d2h"], streams["h2d"]
        self.layer_done = LayerDoneCounter(self.stack.num_model_layers, self.device, stream=self.load_stream)
        # Loads launch groups of consecutive layers moving >= load_groups.min_bytes (0: per layer).
        self.load_groups = LoadGrouper(self.stack, tuning.LOAD_GROUP_MIN_BYTES)
        self._slots = Slots(self.stack, self.device_pools, host_group.pools, device_alloc, device_free)
        self._queue = OpQueue()
        self._planners = planners(self.device_pools, host_group)  # the row tables: fixed from here on
        chosen = get_backend(backend) if backend is not None else make_backend(config)
        self._launcher = Launcher(chosen, self._planners, self.load_groups, self.layer_done, streams)
        self._stats = BatchStats(self.stack)
        self.closed = False
        self.mutex = threading.RLock()  # every public call runs whole under it
        # the per-request calls take it through its bound methods (half the instructions
        # of a `with`: bench/tree_instructions.py); the others with `with`
        self._enter, self._leave = self.mutex.acquire, self.mutex.release

    @property
    def backend(self) -> CopyBackend:
        """The copy backend later batches launch through."""
        return self._launcher.backend

    @backend.setter
    def backend(self, backend: CopyBackend) -> None:
        with self.mutex:
            self._launcher.use(backend)

    @property
    def last_op_id(self) -> int:
        """The id of the op queued last (-1 before the first)."""
        return self._queue.last_op_id

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("controller: closed (host memory was released by close())")

    # ---- queueing --------------------------------------------------------------------
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
                behaviour (wrong rows copied, or an error at launch). The dict returned
                is then the op's own (not a copy): the caller leaves it unchanged.
        Returns:
            Host slots keyed by pool name, or ``None`` if any host pool is short (nothing
            is allocated or queued then). The op's id is ``last_op_id`` afterwards. The
            tensors are the queued op's own: read-only until its ack (the batch derives
            its rows from them at ``start_writing``). The caller's own tensors are copied
            here (unless ``trusted``): reusing them afterwards changes nothing queued.
        Raises:
            ValueError: slots that are unaligned, out of range, repeated, on a CUDA device
                or not allocated on the device; ``extra`` naming a pool that is not an
                own-indexed pool of the stack. Nothing changes.
            RuntimeError: the controller is closed.
        """
        self._enter()
        try:
            self._check_open()
            op = self._slots.backup(device_indices, extra, trusted)
            if op is None:
                return None
            dst = self._queue.enqueue(op)  # the op's own dict: a trusted caller leaves it unchanged
        finally:
            self._leave()
        return dst if trusted else dict(dst)

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
            Device slots keyed by pool name, or ``None`` if any device pool is short;
            read-only until the op's ack, as for ``write``.
        Raises:
            ValueError: bad slots or pool names, or host slots that were never written
                (backup not acked), were freed, or were freed and allocated again since.
                Also when a server allocator hands out bad slots (they are given back).
            RuntimeError: the controller is closed.
        """
        self._enter()
        try:
            self._check_open()
            op = self._slots.load(host_indices, extra, trusted)
            if op is None:
                return None
            dst = self._queue.enqueue(op)
        finally:
            self._leave()
        return dst if trusted else dict(dst)

    def load_many(self, requests: Sequence[tuple[Any, Mapping[str, Any] | None]], *,
                  trusted: bool = False) -> list[dict[str, torch.Tensor]] | None:
        """Queue several loads at once: one allocator call per device pool for all of them,
        and their slots merged once, here (``start_loading`` then merges nothing).

        Each request is checked as ``load(host_indices, extra, trusted=...)`` checks it;
        the set is all or nothing. With a server ``device_alloc`` each op allocates on its
        own (still all or nothing). The ops get consecutive ids (``last_op_id`` is the last).

        Args:
            requests: ``(host_indices, extra)`` pairs (``extra`` may be ``None``).
            trusted: as for :meth:`load`, for every request.
        Returns:
            Per request, its device slots keyed by pool (as :meth:`load` returns them), or
            ``None`` when a device pool is short for the sum (nothing allocated or queued).
        Raises:
            ValueError / TypeError: a bad request, naming ``requests[i]``; nothing changes
                (also when an allocator raises: what it took is given back, then it re-raises).
            RuntimeError: the controller is closed.
        """
        return self._many("h2d", requests, trusted)

    def write_many(self, requests: Sequence[tuple[Any, Mapping[str, Any] | None]], *,
                   trusted: bool = False) -> list[dict[str, torch.Tensor]] | None:
        """Queue several backups at once; :meth:`load_many` for ``write``: one host
        allocator call per pool, all or nothing.

        Args:
            requests: ``(device_indices, extra)`` pairs (``extra`` may be ``None``).
            trusted: as for :meth:`write`, for every request.
        Returns:
            Per request, its host slots keyed by pool, or ``None`` when a host pool is short.
        Raises:
            ValueError / TypeError: a bad request, naming ``requests[i]``; nothing changes.
            RuntimeError: the controller is closed.
        """
        return self._many("d2h", requests, trusted)

    def _many(self, direction: str, requests: Any, trusted: bool) -> list[dict] | None:
        requests = requests_of(requests)
        self._enter()
        try:
            self._check_open()
            ops = self._slots.many(direction, requests, trusted)
            if ops is None:
                return None
            got = [self._queue.enqueue(op) for op in ops]
        finally:
            self._leave()
        return got if trusted else [dict(dst) for dst in got]

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
        with self.mutex:
            self._check_open()
            self._slots.mark_written(host_indices, extra)

    # ---- launching -------------------------------------------------------------------
    def start_writing(self) -> None:
        """Launch every queued write as one batch (all layers, on the write stream).

        Raises:
            RuntimeError: the controller is closed.
        """
        self._enter()
        try:
            self._check_open()
            self._start("d2h")
        finally:
            self._leave()

    def start_loading(self) -> int | None:
        """Launch every queued load as one batch, layer by layer, on the load stream.

        Returns:
            The batch's consumer index for ``layer_done.wait_until`` (the current one
            when nothing was queued), or ``None`` when the launch failed and the batch was
            rolled back (its acks report failure; its layer events are all signalled).
        Raises:
            RuntimeError: the controller is closed.
        """
        self._enter()
        try:
            self._check_open()
            return self._start("h2d")
        finally:
            self._leave()

    def _start(self, direction: str) -> int | None:
        ops = self._queue.take(direction)
        if not ops:
            return self.layer_done.consumer if direction == "h2d" else None
        batch = Batch(ops, direction, self.layer_done.begin() if direction == "h2d" else -1)
        self._launcher.start(batch)
        if batch.error is not None:
            # On CUDA copies enqueued before the failure may still write its destination
            # slots (and a CPU writer handed a freed slot would be overwritten): given back
            # at the poll that sees its event complete.
            self._rolled_back(batch, give_back=not self._cuda)
        self._queue.launched(batch)
        if direction == "d2h":
            return None
        self.layer_done.set_consumer(batch.consumer)
        return None if batch.error else batch.consumer

    def _rolled_back(self, batch: Batch, give_back: bool) -> None:
        if give_back:
            batch.given_back(self._slots.give_back(batch.ops, batch.direction))
        self._stats.rolled_back(batch.direction)

    # ---- completion ------------------------------------------------------------------
    def poll(self) -> list[Ack]:
        """Acks of finished batches (never blocks): per direction, oldest first.

        A finished load is not held back by an unfinished backup (or the reverse).
        """
        acks: list[Ack] = []
        self._enter()
        try:
            for batch in self._queue.finished():
                if batch.error is not None and not batch.freed:  # its copies have all ended now
                    batch.given_back(self._slots.give_back(batch.ops, batch.direction))
                elif batch.error is None and batch.direction == "d2h":
                    self._slots.stamp(batch.ops)
                acks.extend(self._stats.acks(batch))
                if batch.event is not None:  # CUDA: its event serves a later batch
                    self._launcher.recycle(batch)
        finally:
            self._leave()
        return acks

    def rolled_back_ops(self) -> set[int]:
        """Ids of ops whose batch was rolled back and whose destination slots are free
        again, but whose failed acks ``poll`` has not returned yet (on CUDA a launched
        batch's slots are freed only by the ``poll`` that returns its acks: its ops stay
        out of this set and keep their slots until then)."""
        with self.mutex:
            return self._queue.rolled_back_ops()

    def pending(self) -> int:
        """Operations queued or in flight (not yet acked)."""
        with self.mutex:
            return self._queue.pending()

    def backlog_bytes(self, direction: str) -> int:
        """Bytes of the ``direction`` (``"h2d"`` / ``"d2h"``) ops queued or in flight, not yet
        acked: what a new transfer that way waits behind (the load gate's backlog,
        `hicache.cost.links`). Changes nothing; scheduler thread."""
        ops = self._queue.unacked(direction)
        return self._stats.bytes_of(ops) if ops else 0

    def close(self) -> None:
        """Wait for every launched copy, roll back queued ops, release host memory.

        Afterwards ``write``/``load``/``start_*`` raise ``RuntimeError``; ``poll`` still
        returns the remaining acks (queued ops fail with "closed"). Idempotent.
        """
        with self.mutex:
            if self.closed:
                return
            for stream in (self.write_stream, self.load_stream):
                if stream is not None:
                    stream.synchronize()
            for direction in DIRECTIONS:
                ops = self._queue.take(direction)
                if ops:
                    batch = Batch(ops, direction, self.layer_done.begin())
                    self._launcher.fail(batch, RuntimeError("controller closed before launch"))
                    self._rolled_back(batch, give_back=True)  # nothing of it was launched
                    self._queue.launched(batch)
            self.closed = True
            self.host_group.close()

    def check_integrity(self) -> None:
        """``RuntimeError`` if any host or device allocator breaks free + used = total."""
        with self.mutex:
            self.host_group.check_integrity()
            for pool in self.device_pools.values():
                if pool.allocator is not None:
                    pool.allocator.check_integrity()

    def stats(self) -> dict:
        """Counters: ops, tokens and bytes per pool and direction, failures, rollbacks."""
        with self.mutex:
            return self._stats.as_dict()
