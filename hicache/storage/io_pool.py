"""`StorageIO`: storage queries, prefetches and backups on I/O threads, polled for completion.

The scheduler submits and polls; it never blocks on the store. An operation runs in
chunks of ``chunk_pages`` so that a cancel or a prefetch deadline stops it between
chunks; the pages it did not reach report ``False``.

    submitted --(worker picks it)--> running --(all chunks | first miss | cancel | deadline)--> done
        |                                                                                   |
        +--(cancel before start, or close)--> done (nothing moved)                          v
                                                                        IOResult in poll() (once)

Ownership: the host buffers of a prefetch or backup belong to the operation until its
`IOResult` comes out of `poll` (or `StorageOp.done()` is true): a cancel or a timeout
stops it early but a chunk already running still writes or reads them. A caller that
must not wait for that chunk (a deadline that has to hold while the store stalls) takes
the pages `StorageOp.progress` reports as read, and leaves the buffers of the others to
the operation until it is done.

Results go to the channel the operation was submitted with (`StorageIO.channel`; by
default the pool's own, read by `StorageIO.poll`), so several users of one pool (two
trees' stores) each poll only their own. A result is in its channel before the
operation reports ``done()``.

A query or presence check may name operations it must come ``after`` (read after write:
a lookup of keys whose backup is still running sees them stored); it is submitted when
the last of them is done, from the thread that finished it: no thread waits.
"""
from __future__ import annotations

import enum
import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import NamedTuple, Sequence

import torch

from hicache.storage.base import StorageBackend


class IOKind(enum.Enum):
    QUERY = "query"  # batch_exists: leading run present
    PRESENCE = "presence"  # each key checked alone: which are present (state snapshots)
    PREFETCH = "prefetch"  # batch_get into host buffers
    BACKUP = "backup"  # batch_set from host buffers


class IOResult(NamedTuple):
    """A finished operation.

    Attributes:
        op_id: the id `StorageOp.op_id` had.
        kind: query, prefetch or backup.
        ok: per page: moved and verified; presence: present (empty for a query).
        hit_pages: query: leading run present; presence: keys present; prefetch: leading
            run read (the usable prefix); backup: pages stored.
        stopped: ended early by cancel, deadline or close (``ok`` says how far it got).
        error: an unexpected exception's text (a bug, not a store fault), else ``None``.
    """

    op_id: int
    kind: IOKind
    ok: list[bool]
    hit_pages: int
    stopped: bool
    error: str | None = None


class StorageOp:
    """Handle of a submitted operation (thread-safe)."""

    def __init__(self, op_id: int, kind: IOKind, num_pages: int, deadline: float | None) -> None:
        self.op_id, self.kind, self.num_pages, self.deadline = op_id, kind, num_pages, deadline
        self._stop = threading.Event()
        self._read = 0  # prefetch: leading pages read and verified so far
        self.future: Future = Future()

    def cancel(self) -> None:
        """Ask the operation to stop at its next chunk boundary (the result says how far it got)."""
        self._stop.set()

    def should_stop(self) -> bool:
        return self._stop.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline)

    def done(self) -> bool:
        return self.future.done()

    def progress(self) -> int:
        """A prefetch's leading pages read and verified so far: their buffers hold their bytes
        and no chunk of this operation touches them again (before it is done, too)."""
        return self._read

    def result(self, timeout_s: float | None = None) -> IOResult | None:
        """Wait up to ``timeout_s`` (``None`` = forever) for the result; ``None`` if not done by then."""
        try:
            return self.future.result(timeout_s)
        except FutureTimeout:
            return None


def _leading(ok: Sequence[bool]) -> int:
    for i, v in enumerate(ok):
        if not v:
            return i
    return len(ok)


class IOChannel:
    """Where finished operations submitted with it report (thread-safe)."""

    def __init__(self) -> None:
        self._done: deque[IOResult] = deque()

    def put(self, res: IOResult) -> None:
        self._done.append(res)

    def poll(self) -> list[IOResult]:
        """Operations of this channel finished since the last poll, each reported once (non-blocking)."""
        out = []
        while self._done:
            out.append(self._done.popleft())
        return out


class StorageIO:
    """A small pool of I/O threads for one or more backends.

    Args:
        num_threads: I/O threads (>= 1); two keep one backup from delaying a prefetch.
        chunk_pages: pages per backend call (>= 1); cancel and deadlines act between chunks.
    """

    def __init__(self, num_threads: int = 2, chunk_pages: int = 32) -> None:
        if num_threads < 1 or chunk_pages < 1:
            raise ValueError(f"num_threads, chunk_pages: must be >= 1, got {num_threads}, {chunk_pages}")
        self.chunk_pages = chunk_pages
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="hicache-storage")
        self._ids = itertools.count()
        self._default = IOChannel()
        self._closed = False
        self._backlog = 0  # bytes of prefetches and backups submitted, not finished (`backlog_bytes`)
        self._backlog_lock = threading.Lock()

    def backlog_bytes(self) -> int:
        """Bytes of the prefetches and backups submitted and not finished: what a new read
        waits behind (the load gate's storage backlog, `hicache.cost.links`). Thread-safe."""
        return self._backlog

    def channel(self) -> IOChannel:
        """A new channel: operations submitted with it report there, not to `poll`."""
        return IOChannel()

    def query(self, backend: StorageBackend, keys: Sequence[str], *, channel: IOChannel | None = None,
              after: Sequence[StorageOp] = ()) -> StorageOp:
        """Submit `batch_exists`; the result's ``hit_pages`` is the leading run present
        (reported to ``channel``, default: `poll`; so for every submit below). It runs once
        every operation of ``after`` (backups of these keys) is done.

        Raises:
            ValueError / TypeError: malformed keys (raised here, nothing is submitted).
        """
        backend.check_args("exists", keys)
        return self._submit(IOKind.QUERY, backend, list(keys), [], None, channel, after)

    def presence(self, backend: StorageBackend, keys: Sequence[str], *,
                 channel: IOChannel | None = None, after: Sequence[StorageOp] = ()) -> StorageOp:
        """Submit a presence check of each key on its own (not a leading run), once every
        operation of ``after`` is done.

        The result's ``ok[i]`` says whether key i is present, ``hit_pages`` how many are.
        Keys are checked in chunks; a cancel stops between chunks (the rest report ``False``).

        Raises:
            ValueError / TypeError: malformed keys (raised here, nothing is submitted).
        """
        backend.check_args("exists", keys)
        return self._submit(IOKind.PRESENCE, backend, list(keys), [], None, channel, after)

    def prefetch(self, backend: StorageBackend, keys: Sequence[str], pages: Sequence[torch.Tensor],
                 timeout_s: float | None = None, *, channel: IOChannel | None = None) -> StorageOp:
        """Submit `batch_get` into ``pages``; stops at the first page not read, or at the deadline.

        Args:
            timeout_s: chunks not started within this many seconds of submission are
                skipped (``None`` = no deadline).

        Raises:
            ValueError / TypeError: malformed keys or buffers (nothing is submitted).
        """
        pages = list(pages)
        backend.check_args("get", keys, pages)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return self._submit(IOKind.PREFETCH, backend, list(keys), pages, deadline, channel)

    def backup(self, backend: StorageBackend, keys: Sequence[str], pages: Sequence[torch.Tensor], *,
               channel: IOChannel | None = None) -> StorageOp:
        """Submit `batch_set` from ``pages`` (every page is tried; see ``IOResult.ok``).

        Raises:
            ValueError / TypeError: malformed keys or buffers (nothing is submitted).
        """
        pages = list(pages)
        backend.check_args("set", keys, pages)
        return self._submit(IOKind.BACKUP, backend, list(keys), pages, None, channel)

    def poll(self) -> list[IOResult]:
        """Operations submitted without a channel finished since the last poll, each
        reported once (non-blocking)."""
        return self._default.poll()

    def close(self, wait: bool = True) -> None:
        """Stop accepting work; queued operations finish as stopped; ``wait`` joins the threads."""
        self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def _submit(self, kind: IOKind, backend: StorageBackend, keys: list[str], pages: list[torch.Tensor],
                deadline: float | None, channel: IOChannel | None, after: Sequence[StorageOp] = ()) -> StorageOp:
        if self._closed:
            raise RuntimeError("StorageIO is closed")
        op = StorageOp(next(self._ids), kind, len(keys), deadline)
        out = self._default if channel is None else channel
        nbytes = sum(p.numel() * p.element_size() for p in pages)  # queued from now: the load gate's backlog
        with self._backlog_lock:
            self._backlog += nbytes
        waiting = [d for d in dict.fromkeys(after) if not d.done()]
        if waiting:
            self._start_after(waiting, op, backend, keys, pages, out, nbytes)
        else:
            self._start(op, backend, keys, pages, out, nbytes)
        return op

    def _start(self, op: StorageOp, backend: StorageBackend, keys: list[str], pages: list[torch.Tensor],
               out: IOChannel, nbytes: int) -> None:
        inner = self._pool.submit(self._run, op, backend, keys, pages)
        inner.add_done_callback(lambda f: self._finish(op, f, out, nbytes))

    def _start_after(self, waiting: list[StorageOp], op: StorageOp, backend: StorageBackend, keys: list[str],
                     pages: list[torch.Tensor], out: IOChannel, nbytes: int) -> None:
        """Submit ``op`` when the last of ``waiting`` is done (on the thread that finished it;
        closed meanwhile: ``op`` ends as stopped, nothing moved)."""
        left, lock = [len(waiting)], threading.Lock()

        def one_done(_f: Future) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            try:
                self._start(op, backend, keys, pages, out, nbytes)
            except RuntimeError:  # the pool shut down while it waited
                never = Future()
                never.cancel()
                self._finish(op, never, out, nbytes)
        for dep in waiting:
            dep.future.add_done_callback(one_done)

    def _finish(self, op: StorageOp, inner: Future, out: IOChannel, nbytes: int) -> None:
        with self._backlog_lock:
            self._backlog -= nbytes
        if inner.cancelled():
            res = IOResult(op.op_id, op.kind, [False] * op.num_pages, 0, True)
        elif inner.exception() is not None:
            e = inner.exception()
            res = IOResult(op.op_id, op.kind, [False] * op.num_pages, 0, True, f"{type(e).__name__}: {e}")
        else:
            res = inner.result()
        out.put(res)  # in the channel before the op reports done()
        op.future.set_result(res)

    def _run(self, op: StorageOp, backend: StorageBackend, keys: list[str], pages: list[torch.Tensor]) -> IOResult:
        if op.kind is IOKind.QUERY:
            if op.should_stop():
                return IOResult(op.op_id, op.kind, [], 0, True)
            return IOResult(op.op_id, op.kind, [], backend.run_exists(keys), False)
        ok: list[bool] = []
        stopped = False
        for start in range(0, len(keys), self.chunk_pages):
            if op.should_stop():
                stopped = True
                break
            end = start + self.chunk_pages
            if op.kind is IOKind.PRESENCE:
                part = [backend.run_exists([k]) == 1 for k in keys[start:end]]
            else:
                part = backend.run("get" if op.kind is IOKind.PREFETCH else "set", keys[start:end], pages[start:end])
            ok.extend(part)
            if op.kind is IOKind.PREFETCH:
                op._read += _leading(part)  # after the bytes landed (this thread wrote them)
                if not all(part):
                    break  # only the leading run is usable; later pages would be wasted reads
        ok.extend([False] * (len(keys) - len(ok)))
        hit = _leading(ok) if op.kind is IOKind.PREFETCH else sum(ok)
        return IOResult(op.op_id, op.kind, ok, hit, stopped)
