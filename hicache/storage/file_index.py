"""`FileIndex`: the LRU index and capacity of one storage directory, shared by its backends.

Every `FileBackend` of a process opened on the same directory (one per pool namespace)
shares one index, so the capacity limit covers the directory as a whole. The index is
rebuilt from the files at open (oldest modification time first: a read refreshes it with
``utime``), so LRU order survives restarts. Files other processes add are learnt when
this one reads them; the limit is enforced over the files this process knows.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

OBJECT_SUFFIX = ".page"
TMP_SUFFIX = ".tmp"
STALE_TMP_S = 600.0  # a temporary file this old belongs to a writer that died


class FileIndex:
    """Object paths in least-recently-used order with their sizes (thread-safe).

    Args:
        root: the storage directory.
        capacity_bytes: bytes of objects allowed under ``root``; 0 = unlimited.
    """

    def __init__(self, root: Path, capacity_bytes: int) -> None:
        self.root, self.capacity_bytes = root, int(capacity_bytes)
        self._lru: OrderedDict[str, int] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()
        self._scan()

    @property
    def total_bytes(self) -> int:
        return self._total

    def __len__(self) -> int:
        return len(self._lru)

    def _scan(self) -> None:
        found = []
        now = time.time()
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                path = os.path.join(dirpath, name)
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue  # removed under our feet by another process
                if name.endswith(OBJECT_SUFFIX):
                    found.append((st.st_mtime, path, st.st_size))
                elif name.endswith(TMP_SUFFIX) and now - st.st_mtime > STALE_TMP_S:
                    unlink_quiet(path)
        for _, path, size in sorted(found):
            self._lru[path] = size
            self._total += size

    def touch(self, path: str, size: int) -> None:
        """Mark ``path`` most recently used (adding it if another process wrote it)."""
        with self._lock:
            if path in self._lru:
                self._lru.move_to_end(path)
            else:
                self._lru[path] = size
                self._total += size

    def admit(self, path: str, size: int) -> list[str] | None:
        """Record ``path`` (about to be written) and pick what to evict to stay under capacity.

        Returns:
            Paths removed from the index that the caller must unlink, or ``None`` when
            ``size`` alone exceeds the capacity (nothing changes then).
        """
        with self._lock:
            if path in self._lru:
                self._lru.move_to_end(path)
                return []
            if self.capacity_bytes and size > self.capacity_bytes:
                return None
            victims = []
            while self.capacity_bytes and self._total + size > self.capacity_bytes and self._lru:
                victim, vsize = self._lru.popitem(last=False)
                self._total -= vsize
                victims.append(victim)
            self._lru[path] = size
            self._total += size
            return victims

    def forget(self, path: str) -> None:
        """Drop ``path`` from the index (a failed write, a refused or vanished object)."""
        with self._lock:
            size = self._lru.pop(path, None)
            if size is not None:
                self._total -= size


def unlink_quiet(path: str) -> bool:
    """Remove ``path``; ``False`` if it was already gone."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


_OPEN: dict[str, tuple[FileIndex, int]] = {}
_OPEN_LOCK = threading.Lock()


def open_index(root: Path, capacity_bytes: int) -> FileIndex:
    """The process-wide index of ``root`` (scanned on first open); pair with `close_index`.

    A later open with a different non-zero capacity lowers or raises the shared limit to it.
    """
    key = os.path.realpath(root)
    with _OPEN_LOCK:
        index, refs = _OPEN.get(key, (None, 0))
        if index is None:
            index = FileIndex(Path(key), capacity_bytes)
        elif capacity_bytes:
            index.capacity_bytes = int(capacity_bytes)
        _OPEN[key] = (index, refs + 1)
        return index


def close_index(index: FileIndex) -> None:
    """Release one reference; the last one drops the index."""
    key = str(index.root)
    with _OPEN_LOCK:
        found, refs = _OPEN.get(key, (None, 0))
        if found is index:
            if refs <= 1:
                del _OPEN[key]
            else:
                _OPEN[key] = (index, refs - 1)
