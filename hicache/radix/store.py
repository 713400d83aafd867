"""`TierStore`: the storage tier below the host, as the tree uses it — one backend per data pool.

The tree hands the store page hashes and host slots; the store turns them into page
objects of every data pool and runs them as `StorageIO` operations on I/O threads. The
scheduler thread only submits and polls (`poll` returns the finished jobs):

    pool kind   one object holds                            its key (page hash of ...)
    history     a page's rows of the pool, every layer      the prefix up to and including the page
    state       a snapshot's rows of the pool, every layer  the prefix up to the snapshot's boundary

    job      operations (one per pool)                      result
    lookup   query of the first history pool (leading run)  pages found, snapshot boundaries found
             + presence of the first state pool's keys
    read     prefetch of every pool into host slots         leading run read in every pool, snapshot ok
    write    backup of every pool from host slots           per page and per snapshot: stored

A lookup of a key whose write is still running runs after that write's every operation
(read after write): a page the host dropped while its write was queued is found, whatever
the I/O threads' backlog. Host pages a write reads are pinned until the write completes:
freeing them meanwhile (an eviction, a deleted node) is deferred, so the I/O threads never
read a slot that was handed out again. Keys are namespaced per pool (`StorageNamespace`: model, pool, dtypes,
layers, rank...), so pools, models and ranks never read each other's objects.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from hicache.config import HiCacheConfig
from hicache.radix.jobs import LOOKUP, READ, WRITE, BusyClock, StoreJob
from hicache.radix.pins import HostPins
from hicache.storage import (StorageBackend, StorageIO, StorageNamespace, config_namespace, make_storage, page_hashes,
                             page_view)

class TierStore:
    """The storage tier of one cache: a backend per data pool, I/O threads, pins (scheduler thread).

    Args:
        cache: the `hicache.HiCache` whose host pools the objects move through.
        backends: an open `StorageBackend` per data pool of the stack.
        config: ``storage_prefetch_policy``, ``storage_prefetch_timeout_s``,
            ``storage_write_policy`` and ``storage_admission`` are read from it (default:
            ``cache.config``).
        io: the I/O threads (default: two of them, owned and closed by the store); one
            `StorageIO` may serve several stores: each polls only its own results.
        cache_salt: per-tenant salt of the page hash chain.
    Raises:
        ValueError: a backend missing for a data pool, or one of another namespace shape.
    """

    def __init__(self, cache: Any, backends: Mapping[str, StorageBackend], config: HiCacheConfig | None = None,
                 *, io: StorageIO | None = None, cache_salt: str | bytes | None = None) -> None:
        self.stack, self.host_pools = cache.stack, cache.host_group.pools
        config = config or cache.config
        self.prefetch_policy = config.storage_prefetch_policy
        self.prefetch_timeout_s = config.storage_prefetch_timeout_s
        self.write_policy = config.storage_write_policy
        self.admission = config.storage_admission  # requests a prefix needs (`hicache.radix.admission`)
        self.cache_salt = cache_salt
        self.page_size = self.stack.page_size
        anchor = self.stack.anchor.name
        self.history = [p.name for p in self.stack.data_pools() if self.stack.root_of(p.name).name == anchor]
        self.state = [p.name for p in self.stack.data_pools() if self.stack.root_of(p.name).name != anchor]
        self.backends = dict(backends)
        self._check_backends()
        self._own_io = io is None
        self.io = StorageIO() if io is None else io
        self._results = self.io.channel()  # this store's results only: an ``io`` may be shared
        self.clocks = {LOOKUP: BusyClock(), READ: BusyClock(), WRITE: BusyClock()}
        self._jobs: dict[int, tuple[StoreJob, str]] = {}  # StorageIO op id -> (job, pool)
        self._writing: dict[str, tuple] = {}  # key -> the operations of the write job in flight storing it
        self.pins = HostPins({r: self.host_pools[r] for r in (anchor, *(self.stack.root_of(n).name
                                                                       for n in self.state))})
        for name, backend in self.backends.items():
            backend.register_buffer(self.host_pools[name].buffer)

    def _check_backends(self) -> None:
        names = set(self.history) | set(self.state)
        if set(self.backends) != names:
            raise ValueError(f"backends: need one per data pool {sorted(names)}, got {sorted(self.backends)}")
        for name, backend in self.backends.items():
            rows = self.unit_rows(self.stack, name)
            if backend.namespace.rows_per_object != rows or backend.namespace.pool != name:
                raise ValueError(f"backends[{name!r}]: namespace of pool {backend.namespace.pool!r} with "
                                 f"{backend.namespace.rows_per_object} rows per object; need {rows}")

    @staticmethod
    def unit_rows(stack: Any, pool: str) -> int:
        """Rows of ``pool`` in one object: a page (history pools) or one snapshot (state pools).

        Raises:
            ValueError: a state root whose snapshot is more than one of its rows (its rows
                need not be consecutive host rows, so it is not one object).
        """
        root = stack.root_of(pool)
        if root is stack.anchor:
            return stack.page_size // stack.pool(pool).tokens_per_row
        window = max(p.window_tokens for p in stack if stack.root_of(p.name).name == root.name)
        if window > root.tokens_per_row:
            raise ValueError(f"stack: the snapshot of {root.name!r} spans {window} tokens, more than one "
                             f"row ({root.tokens_per_row}); the storage tier stores one-row snapshots")
        return root.tokens_per_row // stack.pool(pool).tokens_per_row

    # ---- keys and objects ---------------------------------------------------------------
    def page_hashes(self, tokens: np.ndarray, prior_hash: str | None) -> list[str]:
        """Chained hashes of whole pages of ``tokens`` after the page hashed ``prior_hash``
        (``None``: the first page of a prompt, seeded with the cache salt)."""
        if prior_hash is None:
            return page_hashes(tokens, self.page_size, cache_salt=self.cache_salt)
        return page_hashes(tokens, self.page_size, prior_hash=prior_hash)

    def objects(self, pool: str, root_slots: torch.Tensor) -> list[torch.Tensor]:
        """Host page views of ``pool`` for the units (pages or snapshots) at ``root_slots``."""
        spec = self.stack.pool(pool)
        rows = self.backends[pool].namespace.rows_per_object
        first_rows = root_slots.numpy()[::spec.tokens_per_row * rows] // spec.tokens_per_row
        host = self.host_pools[pool]
        return [page_view(host, int(r), rows) for r in first_rows]

    # ---- jobs ---------------------------------------------------------------------------
    def lookup(self, hashes: Sequence[str], snapshots: bool, owner: Any, held: Sequence[str] = ()) -> StoreJob:
        """Leading run of ``hashes`` present (first history pool; a stack without history
        data pools has no ``"history"`` result: every page is there), and with
        ``snapshots`` which boundaries have one (first state pool). ``held``: more snapshot
        keys, each checked on its own (``"held"`` result: boundaries whose history the
        tree holds without a snapshot). Empty ``hashes`` look up ``held`` alone.

        Raises:
            ValueError: nothing to look up (no history data pool, and no snapshots asked).
        """
        ops, io, out = {}, self.io, self._results
        after = self._writes_of((*hashes, *held)) if self._writing else ()
        if self.history and hashes:
            ops["history"] = io.query(self.backends[self.history[0]], hashes, channel=out, after=after)
        if snapshots and self.state and hashes:
            ops["state"] = io.presence(self.backends[self.state[0]], hashes, channel=out, after=after)
        if held and self.state:
            ops["held"] = io.presence(self.backends[self.state[0]], held, channel=out, after=after)
        if not ops:
            raise ValueError("snapshots: a stack without history data pools is looked up by its snapshots")
        return self._track(StoreJob(LOOKUP, ops, owner))

    def read(self, hashes: Sequence[str], anchor_slots: torch.Tensor, snapshot: dict[str, torch.Tensor] | None,
             timeout_s: float | None, owner: Any) -> StoreJob:
        """Read the pages of ``hashes`` into ``anchor_slots`` (every history pool) and, if
        given, the snapshot at the last page's boundary into its host slots (state pools
        first: they are few and a deadline should not cost the whole hit). Their host pages
        stay pinned until the job is done: a prefetch that ends at its deadline frees the
        pages of a read still running, and they must not be handed out before it ends."""
        ops = {}
        for name in self.state if snapshot else ():
            root = self.stack.root_of(name).name
            ops[name] = self.io.prefetch(self.backends[name], [hashes[-1]], self.objects(name, snapshot[root]),
                                         timeout_s=timeout_s, channel=self._results)
        for name in self.history:
            ops[name] = self.io.prefetch(self.backends[name], hashes, self.objects(name, anchor_slots),
                                         timeout_s=timeout_s, channel=self._results)
        job = StoreJob(READ, ops, owner)
        self._pin(job, {self.stack.anchor.name: anchor_slots} if self.history else {})
        self._pin(job, snapshot or {})
        return self._track(job)

    def _pin(self, job: StoreJob, slots: Mapping[str, torch.Tensor]) -> None:
        """Pin the host pages of ``slots`` (per own-indexed pool) until ``job`` is done."""
        for root, s in slots.items():
            job.pins[root] = self.pins.pin(root, s)

    def read_snapshot(self, key: str, snapshot: dict[str, torch.Tensor], timeout_s: float | None,
                      owner: Any) -> StoreJob:
        """Read the snapshot stored under ``key`` (a boundary's page hash) into its host
        slots, every state pool; no history page moves."""
        ops = {}
        for name in self.state:
            root = self.stack.root_of(name).name
            ops[name] = self.io.prefetch(self.backends[name], [key], self.objects(name, snapshot[root]),
                                         timeout_s=timeout_s, channel=self._results)
        job = StoreJob(READ, ops, owner)
        self._pin(job, snapshot)  # a read past its prefetch's deadline still writes them
        return self._track(job)

    def write(self, hashes: Sequence[str], anchor_slots: torch.Tensor, snap_hashes: Sequence[str],
              snap_slots: dict[str, torch.Tensor], owner: Any) -> StoreJob:
        """Write pages (``hashes`` at ``anchor_slots``) and snapshots (``snap_hashes``, each
        one unit of ``snap_slots`` per state root) of every pool; their host pages stay
        pinned until the job is done."""
        ops = {}
        if hashes:
            for name in self.history:
                ops[name] = self.io.backup(self.backends[name], hashes, self.objects(name, anchor_slots),
                                           channel=self._results)
        for name in self.state if snap_hashes else ():
            root = self.stack.root_of(name).name
            ops[name] = self.io.backup(self.backends[name], snap_hashes, self.objects(name, snap_slots[root]),
                                       channel=self._results)
        if not ops:
            raise ValueError("hashes, snap_hashes: nothing to write (no page of a history data pool, no snapshot)")
        job = StoreJob(WRITE, ops, owner, keys=(*hashes, *snap_hashes))
        self._writing.update(dict.fromkeys(job.keys, tuple(ops.values())))
        self._pin(job, {self.stack.anchor.name: anchor_slots} if hashes and self.history else {})
        self._pin(job, snap_slots if snap_hashes else {})
        return self._track(job)

    def _track(self, job: StoreJob) -> StoreJob:
        clock = self.clocks[job.kind]
        for name, op in job.ops.items():
            self._jobs[op.op_id] = (job, name)
            clock.start()
            op.future.add_done_callback(lambda _f, c=clock: c.stop())  # on the I/O thread: true busy time
        return job

    def poll(self) -> list[StoreJob]:
        """Jobs whose every operation has finished since the last poll (non-blocking)."""
        done = []
        for res in self._results.poll():
            job, name = self._jobs.pop(res.op_id)
            job.results[name] = res
            if job.done:
                for root, pages in job.pins.items():
                    self.pins.unpin(root, pages)
                job.pins = {}
                self._forget_write(job)
                done.append(job)
        return done

    def _writes_of(self, keys: Sequence[str]) -> tuple:
        """The operations of the writes in flight that store any of ``keys``."""
        writing = self._writing
        return tuple({op: None for k in keys if k in writing for op in writing[k]})

    def _forget_write(self, job: StoreJob) -> None:
        """A write finished: its keys are no longer in flight (unless a later write stores them)."""
        ops = tuple(job.ops.values())
        for key in job.keys:
            if self._writing.get(key) == ops:
                del self._writing[key]

    def busy(self) -> bool:
        """Whether any job of this store is still running."""
        return bool(self._jobs)

    def backlog_bytes(self) -> int:
        """Bytes its I/O threads have yet to read or write (every store on them; thread-safe)."""
        return self.io.backlog_bytes()

    def free_host(self, root: str, slots: torch.Tensor) -> None:
        """Free host slots of an own-indexed pool; pages a write still reads are freed when it ends."""
        self.pins.free(root, slots)

    def deferred_slots(self) -> dict[str, torch.Tensor]:
        """Host slots freed by the tree but held until a write ends, per own-indexed pool."""
        return self.pins.deferred_slots()

    # ---- accounting and shutdown ------------------------------------------------------
    def stats(self) -> dict:
        """Backend counters summed over the pools, and busy seconds per job kind."""
        total: dict[str, int] = {}
        for backend in self.backends.values():
            for k, v in backend.stats().as_dict().items():
                total[k] = total.get(k, 0) + v
        total.update({f"{kind}_busy_s": clock.seconds for kind, clock in self.clocks.items()})
        return total

    def close(self) -> None:
        """Stop the I/O threads (the store's own) after the running operations, then the backends."""
        if self._own_io:
            self.io.close(wait=True)
        for backend in self.backends.values():
            backend.close()


def store_namespace(config: HiCacheConfig, stack: Any, pool: str, extra: str = "") -> StorageNamespace:
    """The namespace of ``pool``'s objects: the serving identity ``config`` names (model id,
    TP rank and size), one unit (page or snapshot) per object, ``extra`` folded in."""
    return config_namespace(config, stack, pool, rows_per_object=TierStore.unit_rows(stack, pool), extra=extra)


def open_store(cache: Any, config: HiCacheConfig | None = None, *, extra: str = "",
               cache_salt: str | bytes | None = None) -> TierStore | None:
    """Open the storage tier ``config`` asks for (default ``cache.config``), or ``None``.

    One backend per data pool, each under its pool's `StorageNamespace` (`store_namespace`:
    ``--hicache-storage-model-id``, ``--hicache-tp-rank`` / ``--hicache-tp-size``; ``extra``
    is folded into every digest).

    Returns:
        The store; ``None`` for ``--hicache-storage-backend none``, or when the store is
        unreachable and ``--hicache-storage-optional`` is set (a warning says so).
    Raises:
        StorageUnavailableError: unreachable without ``--hicache-storage-optional``.
        ValueError: a stack whose snapshots the tier cannot store, or a capacity below one
            page of every pool (naming ``--hicache-storage-capacity``).
    """
    config = config or cache.config
    if config.storage_backend == "none":
        return None
    stack, backends = cache.host_group.stack, {}  # the host specs: what a page object holds
    try:
        for spec in stack.data_pools():
            backend = make_storage(config, store_namespace(config, stack, spec.name, extra))
            if backend is None:  # unreachable, --hicache-storage-optional: no tier at all
                break
            backends[spec.name] = backend
        else:
            return TierStore(cache, backends, config, cache_salt=cache_salt)
    except BaseException:
        for backend in backends.values():
            backend.close()
        raise
    for backend in backends.values():
        backend.close()
    return None
