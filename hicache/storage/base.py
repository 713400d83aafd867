"""`StorageBackend` (API): the batched, page-granular interface of the storage tier.

One backend serves one `StorageNamespace` (one pool of one model on one rank); keys are
page hashes from `keys.page_hashes`. Every call is thread-safe and blocking: the tree
runs them on `StorageIO` threads, never on the scheduler thread. Faults of the store
(unreachable, full, corrupt objects) are outcomes, not exceptions: ``False`` results and
misses, counted in `StorageStats` and logged once per kind. Only a caller's bad
arguments raise.
"""
from __future__ import annotations

import abc
import logging
import threading
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

from hicache.storage.keys import StorageNamespace, check_keys
from hicache.storage.page import PageCheck, check_pages

log = logging.getLogger("hicache.storage")


class StorageUnavailableError(RuntimeError):
    """The store cannot be reached or opened at start-up (the message says which flag to change)."""


def capacity_flag(nbytes: int) -> str:
    """``--hicache-storage-capacity`` in GB that holds at least ``nbytes`` (rounded up past
    float error, so the value printed in an error message is one that works)."""
    return f"--hicache-storage-capacity {(nbytes // 1000 + 2) / 1e6}"


@dataclass(slots=True)
class StorageStats:
    """Counters of one backend since it was opened (a snapshot from `StorageBackend.stats`).

    Attributes:
        objects_read / bytes_read: objects (and their payload bytes) handed out by batch_get.
        objects_written / bytes_written: objects (payload bytes) stored by batch_set.
        writes_skipped: batch_set keys already present (content-addressed: same bytes).
        hits / misses: batch_get keys found and verified / not found.
        corrupt: objects found but refused (header or checksum mismatch).
        errors: I/O or store failures (unreachable, disk full, RPC errors).
        evictions: objects the backend deleted to stay under its capacity.
    """

    objects_read: int = 0
    bytes_read: int = 0
    objects_written: int = 0
    bytes_written: int = 0
    writes_skipped: int = 0
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    errors: int = 0
    evictions: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class LogOnce:
    """Warn the first time each kind of fault happens, debug-log the repeats (thread-safe)."""

    def __init__(self, logger: logging.Logger, prefix: str) -> None:
        self._log, self._prefix = logger, prefix
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, kind: str, msg: str) -> None:
        with self._lock:
            first = kind not in self._seen
            self._seen.add(kind)
        level = logging.WARNING if first else logging.DEBUG
        self._log.log(level, "%s: %s%s", self._prefix, msg, "" if first else " (repeat)")


class StorageBackend(abc.ABC):
    """A store of page objects for one namespace (API).

    Subclasses implement ``_exists``, ``_get``, ``_set`` and ``_close``; the public
    methods validate arguments once, count, and turn unexpected store exceptions into
    failed results.

    Args:
        namespace: what the objects' bytes mean; objects of other namespaces are never read.
    """

    kind: str = "abstract"

    def __init__(self, namespace: StorageNamespace) -> None:
        self.namespace = namespace
        self._stats = StorageStats()
        self._stats_lock = threading.Lock()
        self._closed = False
        self.log_once = LogOnce(log, f"{self.kind} storage [{namespace.pool}]")

    # ---- public API -------------------------------------------------------------------
    def batch_exists(self, keys: Sequence[str]) -> int:
        """Length of the leading run of ``keys`` whose objects are present.

        Presence is not verification: a later `batch_get` may still refuse a corrupt object.
        Thread-safe; does not change the store. Store faults count as absent.

        Raises:
            ValueError / TypeError: malformed keys. RuntimeError: backend closed.
        """
        self.check_args("exists", keys)
        return self.run_exists(keys)

    def batch_get(self, keys: Sequence[str], pages: Sequence[torch.Tensor]) -> list[bool]:
        """Read each key's object into the caller's host buffer ``pages[i]``.

        Args:
            keys: page hashes.
            pages: one CPU uint8 tensor of ``namespace.object_bytes`` per key, usually
                `page.page_view` of a host pool (contiguous = zero-copy).

        Returns:
            ``True`` where the object was found and verified and its bytes are in
            ``pages[i]``; ``False`` (miss, corrupt or fault) leaves ``pages[i]``
            unspecified: never publish it.

        Raises:
            ValueError / TypeError: malformed keys or buffers (nothing is read).
            RuntimeError: backend closed.
        """
        pages = list(pages)
        self.check_args("get", keys, pages)
        return self.run("get", keys, pages)

    def batch_set(self, keys: Sequence[str], pages: Sequence[torch.Tensor]) -> list[bool]:
        """Store each ``pages[i]`` as the object of ``keys[i]``; an existing key is kept as is.

        Returns:
            ``True`` where the object is stored (or already was); ``False`` where it is not
            (full, fault); no partial object is ever visible.

        Raises:
            ValueError / TypeError: malformed keys or buffers (nothing is written).
            RuntimeError: backend closed.
        """
        pages = list(pages)
        self.check_args("set", keys, pages)
        return self.run("set", keys, pages)

    def register_buffer(self, buffer: torch.Tensor) -> None:
        """Tell the store about a host buffer that pages will live in (zero-copy transports).

        Optional: backends that need no registration ignore it. Thread-safe.
        """
        self._check_open()

    def stats(self) -> StorageStats:
        """A snapshot of the counters (thread-safe)."""
        with self._stats_lock:
            return StorageStats(**self._stats.as_dict())

    def close(self) -> None:
        """Release the store's resources; idempotent. Calls after close raise RuntimeError."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> "StorageBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- for subclasses ---------------------------------------------------------------
    @abc.abstractmethod
    def _exists(self, keys: list[str]) -> int: ...

    @abc.abstractmethod
    def _get(self, keys: list[str], pages: list[torch.Tensor]) -> list[bool]: ...

    @abc.abstractmethod
    def _set(self, keys: list[str], pages: list[torch.Tensor]) -> list[bool]: ...

    @abc.abstractmethod
    def _close(self) -> None: ...

    def count(self, **deltas: int) -> None:
        """Add to the counters (thread-safe)."""
        with self._stats_lock:
            for name, d in deltas.items():
                setattr(self._stats, name, getattr(self._stats, name) + d)

    def refuse(self, key: str, why: PageCheck) -> None:
        """Count and log (once) an object that failed its header or checksum check."""
        self.count(corrupt=1)
        self.log_once(f"corrupt:{why.name}", f"object {key[:16]}... refused ({why.value}); treated as a miss")

    def _fault(self, op: str, err: BaseException) -> None:
        self.count(errors=1)
        self.log_once(f"fault:{op}", f"{op} failed ({type(err).__name__}: {err}); treated as a miss/failure")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.kind} storage backend for pool {self.namespace.pool!r} is closed")

    def check_args(self, op: str, keys: Sequence[str], pages: Sequence[torch.Tensor] | None = None) -> None:
        """Validate one call's arguments (``op``: ``"exists"``, ``"get"`` or ``"set"``).

        Raises:
            ValueError / TypeError naming the argument; RuntimeError when closed.
        """
        self._check_open()
        check_keys(keys)
        if op != "exists":
            check_pages(list(pages or ()), len(keys), self.namespace.object_bytes, writable=op == "get")

    def run_exists(self, keys: Sequence[str]) -> int:
        """`batch_exists` on arguments already checked by `check_args` (the I/O threads' entry)."""
        if not keys or self._closed:  # closed under a queued I/O op: nothing is read
            return 0
        try:
            return self._exists(list(keys))
        except Exception as e:  # a store fault is a miss, never a crash of the caller
            self._fault("exists", e)
            return 0

    def run(self, op: str, keys: Sequence[str], pages: Sequence[torch.Tensor]) -> list[bool]:
        """`batch_get` (``op="get"``) or `batch_set` on arguments already checked by `check_args`."""
        if self._closed:  # closed under a queued I/O op: nothing moves
            return [False] * len(keys)
        try:
            fn = self._get if op == "get" else self._set
            return fn(list(keys), list(pages))
        except Exception as e:  # a store fault fails the batch, never the caller
            self._fault(op, e)
            return [False] * len(keys)
