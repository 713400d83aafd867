"""`FileIndex`: the LRU index and capacity of one storage directory.

Every `FileBackend` of a process opened on the same directory (one per pool namespace)
shares one index, and every process on the directory shares its total
(`file_ledger.Ledger`): the capacity holds for the directory as a whole, all namespaces,
all processes (tensor-parallel ranks share one directory).

A write is admitted before it starts: room is made, its temporary is created at its
final size, held (``flock``) and counted, all under the directory's lock. It becomes an
object at `FileIndex.commit` (renamed into place, into the LRU) or gives its bytes back
at `FileIndex.release`. A write in flight is never evicted, so a writer that needs room
cannot take the place of one that was admitted but has not finished (a cap of two
objects and four writers: two are stored, two refused).

Eviction order: a process evicts the least recently used objects it knows: those found
at its last scan (oldest modification time first; a read refreshes it with ``utime``, so
the order survives restarts and is shared through the disk), then the ones it wrote or
read since. It rescans the directory when it has nothing left to evict while the total
holds bytes that are not its own writes in flight, and once per capacity it evicted. A
scan (at open, and those rescans) rebuilds the shared total from the disk: objects plus
the temporaries of live writers; a dead writer's temporary is removed, so the bytes it
reserved count until the next open on the directory or one capacity's turnover at most. Nothing outside hicache's own layout (`file_layout`)
is counted, evicted or deleted.
"""
from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hicache.storage.base import LogOnce, capacity_flag, log
from hicache.storage.file_layout import clear_entry, is_regular, scan_root, unlink_quiet
from hicache.storage.file_ledger import Ledger, Reservation, abandon, close_reservation, reserve, scan_namespace


class FileIndex:
    """Object paths in least-recently-used order, and the directory's shared total (thread-safe).

    A namespace directory whose marker is damaged is skipped by every scan (its pages are
    neither counted nor evicted here), with one warning per directory; a namespace this
    process opened warns through its own backend, which rebuilds the marker.

    Args:
        root: the storage directory (checked by `file_layout.open_root`).
        capacity_bytes: bytes of objects and writes in flight allowed under ``root``; 0 = unlimited.
        namespace: the digest (hex) of the namespace whose opening makes the index.
    """

    def __init__(self, root: Path, capacity_bytes: int, namespace: str = "") -> None:
        self.root, self.capacity_bytes = root, int(capacity_bytes)
        self.pid = os.getpid()
        self._lru: OrderedDict[str, int] = OrderedDict()
        self._known = 0  # bytes of the objects in _lru
        self._inflight = 0  # bytes of this process's admitted writes not yet committed or released
        self._turnover = 0  # bytes this process evicted since its last scan
        self._over_cap = False  # the last scan found the directory over the capacity (a neighbour's larger one)
        self._lock = threading.Lock()
        self._dirs: set[str] = set()  # namespace directories scanned
        self._open: dict[str, list[int]] = {}  # open namespace -> [bytes of one object, backends]
        self._ledger = Ledger(root)
        self._opened = {namespace[:32]}  # directory names of the namespaces opened here (their backends warn)
        self._damage = LogOnce(log, f"file storage [{root}]")
        with self._locked():
            self._rescan()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """This process's threads, then the other processes (the ledger's flock)."""
        with self._lock, self._ledger:
            yield

    @property
    def total_bytes(self) -> int:
        """Bytes of objects and writes in flight under ``root``, all processes together."""
        with self._locked():
            return self._total()

    def __len__(self) -> int:
        return len(self._lru)

    def _total(self) -> int:
        """The shared total (lock held), rebuilt from the disk first when it cannot be true."""
        total = self._ledger.read()
        return self._rescan() if total is None or not self._believable(total) else total

    def _believable(self, total: int) -> bool:
        """Whether ``total`` (well formed, within the disk) agrees with what this process
        knows: it counts this process's writes in flight; every admission keeps it at or under
        the capacity (unless the last scan found it over: a neighbour's larger capacity); it
        is not below the objects this process knows while two more objects fit (only others'
        evictions, which start at a full directory, make what this process knows stale)."""
        cap = self.capacity_bytes
        if total < self._inflight or not cap:
            return total >= self._inflight
        if total > cap:
            return self._over_cap
        self._over_cap = False
        room = 2 * max((b for b, _ in self._open.values()), default=0)
        return total >= self._known + self._inflight or total + room > cap

    def _rescan(self) -> int:
        """Rebuild the LRU and the shared total from the disk (lock held); the total."""
        dirs, damaged = scan_root(self.root)
        for ns_dir, why in damaged:
            if os.path.basename(ns_dir) not in self._opened:
                self._damage(ns_dir, f"{why}; that namespace is skipped: its pages are neither counted nor "
                                     "evicted here until a server of that namespace rebuilds the marker")
        found, reserved = [], 0
        for ns_dir in dirs:
            objects, held = scan_namespace(ns_dir)
            found += objects
            reserved += held
        self._dirs.update(dirs)
        self._lru = OrderedDict((path, size) for _, path, size in sorted(found))
        self._known, self._turnover = sum(self._lru.values()), 0
        total = self._known + reserved
        self._over_cap = bool(self.capacity_bytes) and total > self.capacity_bytes
        self._ledger.write(total)
        return total

    def adopt(self, ns_dir: str) -> None:
        """Count a namespace directory the last scan skipped (created, or its marker rebuilt
        since: a rescan); a no-op for one already scanned."""
        with self._locked():
            if ns_dir not in self._dirs:
                self._rescan()

    def touch(self, path: str, size: int) -> None:
        """Mark ``path`` most recently used; learn it if another process wrote it (only
        while a regular file is there: one evicted meanwhile stays out)."""
        with self._lock:
            if path in self._lru:
                self._lru.move_to_end(path)
            elif is_regular(path):
                self._lru[path] = size
                self._known += size

    def admit(self, path: str, size: int) -> tuple[Reservation | None, int]:
        """Make room for an object of ``size`` bytes at ``path`` (least recently used objects
        evicted) and reserve it: its temporary, at its final size, counted.

        Returns:
            (the reservation, or ``None`` when ``size`` exceeds the capacity or every byte
            left is a write in flight; objects evicted).

        Raises:
            OSError: the temporary cannot be created (evictions stand, nothing is reserved).
        """
        cap = self.capacity_bytes
        if cap and size > cap:
            return None, 0
        with self._locked():
            total = self._total()
            if cap and total + size > cap and self._turnover >= cap:
                total = self._rescan()  # once per capacity evicted: a dead writer's bytes go, others' are learnt
            total, evicted = self._evict(total, size)
            if cap and total + size > cap and total > self._inflight:
                total, more = self._evict(self._rescan(), size)  # others' objects: learn them
                evicted += more
            res = None
            try:
                if not cap or total + size <= cap:
                    res = reserve(path, size)
            finally:  # the evictions are recorded whatever happened; a reservation never outlives an error
                try:
                    self._ledger.write(total + (size if res is not None else 0))
                except BaseException:
                    if res is not None:
                        abandon(res)
                    raise
            if res is not None:
                self._inflight += size
            return res, evicted

    def _evict(self, total: int, size: int) -> tuple[int, int]:
        """Unlink least recently used objects until ``size`` more bytes fit (lock held)."""
        evicted = 0
        while self.capacity_bytes and total + size > self.capacity_bytes and self._lru:
            victim, vsize = self._lru.popitem(last=False)
            self._known -= vsize
            gone = _unlink_counted(victim)
            if gone is not None:  # None: another process evicted it first (and counted it)
                total -= gone
                evicted += 1
                self._turnover += gone
        return total, evicted

    def commit(self, res: Reservation) -> None:
        """Rename a written reservation into place: the object is stored and most recently used.

        Raises:
            OSError: the rename failed (`release` the reservation).
        """
        with self._locked():
            total = self._total()
            replaced = _regular_size(res.path)  # the same object by another writer: counted by it
            os.replace(res.tmp, res.path)
            res.committed = True
            self._inflight -= res.size
            self._known += res.size - self._lru.pop(res.path, 0)
            self._lru[res.path] = res.size
            self._ledger.write(total - replaced)
        close_reservation(res)

    def release(self, res: Reservation) -> None:
        """Give back a reservation whose write failed (its temporary removed, its bytes
        uncounted); only closes its file once it was committed."""
        if res.committed:
            return close_reservation(res)
        counted = True  # its bytes still count in _inflight
        try:
            with self._locked():
                total = self._total()
                if unlink_quiet(res.tmp):
                    total -= res.size
                self._inflight -= res.size
                counted = False
                self._ledger.write(total)
        finally:
            if counted:  # the ledger failed: the file and its bytes go anyway (the total stays high: safe)
                with self._lock:
                    self._inflight -= res.size
                unlink_quiet(res.tmp)
            close_reservation(res)

    def discard(self, path: str) -> None:
        """Drop ``path`` and unlink it (a refused object), atomically for concurrent readers."""
        with self._locked():
            self._known -= self._lru.pop(path, 0)
            gone = _unlink_counted(path)
            if gone:
                self._ledger.write(self._total() - gone)

    def clear(self, path: str) -> None:
        """Remove what is at ``path`` (`file_layout.clear_entry`: a damaged object) and uncount it.

        Raises:
            OSError: a non-empty directory is there (nothing removed).
        """
        with self._locked():
            self._known -= self._lru.pop(path, 0)
            size = _regular_size(path)
            clear_entry(path)
            if size:
                self._ledger.write(self._total() - size)

    def smallest_useful(self, namespace: str, object_bytes: int) -> int:
        """Bytes of one object of every namespace open here, ``namespace`` included: below
        that, no page can be stored in every pool at once."""
        need = sum(b for ns, (b, _) in self._open.items() if ns != namespace)
        return need + object_bytes

    def close(self) -> None:
        self._ledger.close()


def _regular_size(path: str) -> int:
    """Bytes of the regular file at ``path`` (0 if none, or something else is there)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def _unlink_counted(path: str) -> int | None:
    """Unlink ``path``; the bytes it counted for (0 for anything but a regular file), or
    ``None`` if it was already gone."""
    size = _regular_size(path)
    return size if unlink_quiet(path) else None


_OPEN: dict[str, tuple[FileIndex, int]] = {}
_OPEN_LOCK = threading.Lock()


def open_index(root: Path, capacity_bytes: int, namespace: str = "", object_bytes: int = 0) -> FileIndex:
    """The process-wide index of ``root`` (scanned on first open); pair with `close_index`.

    A later open with a different non-zero capacity lowers or raises the shared limit to it.

    Args:
        namespace, object_bytes: the opening backend's namespace and the bytes of one of its
            objects (header included); the capacity must hold one object of every open namespace.

    Raises:
        ValueError: the capacity is below that (naming ``--hicache-storage-capacity`` and the
            smallest useful capacity); nothing changes.
    """
    key = os.path.realpath(root)
    with _OPEN_LOCK:
        index, refs = _OPEN.get(key, (None, 0))
        fresh = index is None or index.pid != os.getpid()  # a forked child opens its own
        if fresh:
            index, refs = FileIndex(Path(key), capacity_bytes, namespace), 0
        capacity = int(capacity_bytes) or index.capacity_bytes
        need = index.smallest_useful(namespace, object_bytes)
        if capacity and capacity < need:
            if fresh:
                index.close()
            raise ValueError(f"capacity_bytes (--hicache-storage-capacity): {capacity:,} B cannot hold one object "
                             f"of every pool open on {key} ({need:,} B); the smallest useful capacity is "
                             f"{capacity_flag(need)} (GB), or 0 for unlimited")
        index.capacity_bytes = capacity
        index._opened.add(namespace[:32])
        entry = index._open.setdefault(namespace, [object_bytes, 0])
        entry[1] += 1
        _OPEN[key] = (index, refs + 1)
        return index


def close_index(index: FileIndex, namespace: str = "") -> None:
    """Release one reference (``namespace``: the one `open_index` was given); the last drops the index."""
    key = str(index.root)
    with _OPEN_LOCK:
        entry = index._open.get(namespace)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del index._open[namespace]
        found, refs = _OPEN.get(key, (None, 0))
        if found is index:
            if refs <= 1:
                del _OPEN[key]
                index.close()
            else:
                _OPEN[key] = (index, refs - 1)
