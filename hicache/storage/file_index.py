"""`FileIndex`: the LRU index and capacity of one storage directory, shared by its backends.

Every `FileBackend` of a process opened on the same directory (one per pool namespace)
shares one index, so the capacity limit covers the directory as a whole. The index is
built from the files of hicache's own layout (`file_layout`: namespace directories with a
valid marker, object names only) at open, oldest modification time first (a read
refreshes it with ``utime``), so LRU order survives restarts; nothing else under the
directory is counted, evicted or deleted. Files other processes add are learnt when this
one reads them; the limit is enforced over the files this process knows.

Eviction unlinks its victims under the index lock, and a path is learnt only if a regular
file is still there, both under that lock: a read that finishes after an eviction removed
its object cannot bring the entry back (no ghost entries, no capacity miscount).
"""
from __future__ import annotations

import os
import stat
import threading
import time
from collections import OrderedDict
from pathlib import Path

from hicache.storage.base import capacity_flag
from hicache.storage.file_layout import (NAMESPACE_FILE, OBJECT_RE, SUBDIR_RE, TMP_RE, is_our_namespace_dir,
                                         is_regular, unlink_quiet)

STALE_TMP_S = 600.0  # a temporary file this old belongs to a writer that died


class FileIndex:
    """Object paths in least-recently-used order with their sizes (thread-safe).

    Args:
        root: the storage directory (checked by `file_layout.open_root`).
        capacity_bytes: bytes of objects allowed under ``root``; 0 = unlimited.
    """

    def __init__(self, root: Path, capacity_bytes: int) -> None:
        self.root, self.capacity_bytes = root, int(capacity_bytes)
        self._lru: OrderedDict[str, int] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()
        self._dirs: set[str] = set()  # namespace directories scanned
        self._open: dict[str, list[int]] = {}  # open namespace -> [bytes of one object, backends]
        with os.scandir(root) as entries:
            found = [f for e in entries if is_our_namespace_dir(e) for f in self._scan(e.path)]
        self._add_oldest(found)

    @property
    def total_bytes(self) -> int:
        return self._total

    def __len__(self) -> int:
        return len(self._lru)

    def _scan(self, ns_dir: str) -> list[tuple[float, str, int]]:
        """(mtime, path, size) of every object of one namespace directory; stale temporaries removed."""
        self._dirs.add(ns_dir)
        found, now = [], time.time()
        for sub in _entries(ns_dir):
            if SUBDIR_RE.fullmatch(sub.name) and sub.is_dir(follow_symlinks=False):
                for f in _entries(sub.path):
                    if OBJECT_RE.fullmatch(f.name) and f.name[:2] == sub.name:
                        st = _lstat(f)
                        if st is not None and stat.S_ISREG(st.st_mode):
                            found.append((st.st_mtime, f.path, st.st_size))
                    elif TMP_RE.fullmatch(f.name):
                        _remove_if_stale(f, now)
            elif sub.name != NAMESPACE_FILE and TMP_RE.fullmatch(sub.name):
                _remove_if_stale(sub, now)
        return found

    def _add_oldest(self, found: list[tuple[float, str, int]]) -> None:
        """Put ``found`` at the least-recently-used end, oldest first (caller holds the lock or owns the index)."""
        for _, path, size in sorted(found, reverse=True):
            if path not in self._lru:
                self._lru[path] = size
                self._lru.move_to_end(path, last=False)
                self._total += size

    def adopt(self, ns_dir: str) -> None:
        """Count a namespace directory the initial scan skipped (created or whose marker was
        rebuilt since); a no-op for one already scanned."""
        with self._lock:
            if ns_dir not in self._dirs:
                self._add_oldest(self._scan(ns_dir))

    def touch(self, path: str, size: int) -> None:
        """Mark ``path`` most recently used; learn it if another process wrote it (only
        while a regular file is there: one evicted meanwhile stays out)."""
        with self._lock:
            if path in self._lru:
                self._lru.move_to_end(path)
            elif is_regular(path):
                self._lru[path] = size
                self._total += size

    def admit(self, path: str, size: int) -> int | None:
        """Record ``path`` (about to be written), evicting (unlinking) the least recently
        used objects to stay under capacity.

        Returns:
            Objects evicted, or ``None`` when ``size`` alone exceeds the capacity (nothing changes then).
        """
        with self._lock:
            if path in self._lru:
                self._lru.move_to_end(path)
                return 0
            if self.capacity_bytes and size > self.capacity_bytes:
                return None
            evicted = 0
            while self.capacity_bytes and self._total + size > self.capacity_bytes and self._lru:
                victim, vsize = self._lru.popitem(last=False)
                self._total -= vsize
                evicted += unlink_quiet(victim)
            self._lru[path] = size
            self._total += size
            return evicted

    def forget(self, path: str) -> None:
        """Drop ``path`` from the index (a failed write, a vanished object)."""
        with self._lock:
            self._pop(path)

    def discard(self, path: str) -> None:
        """Drop ``path`` and unlink it (a refused object), atomically for concurrent readers."""
        with self._lock:
            self._pop(path)
            unlink_quiet(path)

    def _pop(self, path: str) -> None:
        size = self._lru.pop(path, None)
        if size is not None:
            self._total -= size

    def smallest_useful(self, namespace: str, object_bytes: int) -> int:
        """Bytes of one object of every namespace open here, ``namespace`` included: below
        that, no page can be stored in every pool at once."""
        need = sum(b for ns, (b, _) in self._open.items() if ns != namespace)
        return need + object_bytes


def _entries(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []  # removed or replaced under our feet by another process


def _lstat(entry: os.DirEntry) -> os.stat_result | None:
    try:
        return entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove_if_stale(entry: os.DirEntry, now: float) -> None:
    st = _lstat(entry)
    if st is not None and not stat.S_ISDIR(st.st_mode) and now - st.st_mtime > STALE_TMP_S:
        unlink_quiet(entry.path)


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
        if index is None:
            index = FileIndex(Path(key), capacity_bytes)
        capacity = int(capacity_bytes) or index.capacity_bytes
        need = index.smallest_useful(namespace, object_bytes)
        if capacity and capacity < need:
            raise ValueError(f"capacity_bytes (--hicache-storage-capacity): {capacity:,} B cannot hold one object "
                             f"of every pool open on {key} ({need:,} B); the smallest useful capacity is "
                             f"{capacity_flag(need)} (GB), or 0 for unlimited")
        index.capacity_bytes = capacity
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
            else:
                _OPEN[key] = (index, refs - 1)
