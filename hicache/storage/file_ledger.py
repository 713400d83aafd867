"""`Ledger`: the bytes one storage directory holds, shared by every process that writes it,
and `scan_namespace`, the scan that rebuilds them from the disk.

    <root>/.hicache-usage      16 bytes (0600): b"hicache\\x01" + the total, int64 little-endian

The total covers the objects of the directory and the writes in flight (a writer's
temporary, made at its final size when it is admitted). Every change of either (an
admission, an eviction, a removal, a rename over an object) happens under an exclusive
``flock`` of this file with the total changed by the same amount, so all processes on the
directory (tensor-parallel ranks, two servers) see one total and one capacity holds.

Crash safety: a writer holds a ``flock`` on its temporary until it is renamed. The kernel
drops it when the writer dies, so a scan tells a live write (counted) from a dead one
(removed). A scan rebuilds the total from the disk (`FileIndex`): at every open, and
whenever a process needs room and holds none of the bytes it would have to evict. A
file the total does not match (new, or torn by a crash mid-write) is rebuilt the same way,
and so is a total that cannot be true: negative, above the file system's size (`Ledger.read`),
or one the index's own facts rule out (`FileIndex._believable`).

The file itself is re-checked under the lock: if its path no longer names the inode this
process holds (unlinked, or replaced by another process's new file), the process locks the
one at the path, or creates it, and the total is rebuilt: never two totals for one directory.

Where the file system has no ``flock`` (some network or FUSE mounts), the total is kept
per process instead, with one warning: the capacity then holds per process.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from hicache.storage.base import StorageUnavailableError, log
from hicache.storage.file_layout import NAMESPACE_FILE, OBJECT_RE, OBJECT_TMP_RE, SUBDIR_RE, TMP_RE, new_temp, unlink_quiet

LEDGER_FILE = ".hicache-usage"
_MAGIC = b"hicache\x01"
_RECORD = struct.Struct("<8sq")
_INT64_MAX = 2**63 - 1
STALE_TMP_S = 600.0  # a temporary this old whose writer cannot be asked (no locks here) belongs to a dead one
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class Ledger:
    """The shared total of one directory; use ``with ledger:`` around every read and write.

    Not re-entrant and not a thread lock: the caller holds its own thread lock around it
    (a ``flock`` is per open file, so two threads of one process would share it).

    Args:
        root: the storage directory (checked by `file_layout.open_root`).

    Raises:
        StorageUnavailableError: the file cannot be opened, or is not a regular file of this user's.
    """

    def __init__(self, root: Path) -> None:
        self.path = str(root / LEDGER_FILE)
        self.shared = True
        self._local: int | None = None  # the total where the file system cannot lock
        self._pid, self._fd = -1, -1
        self._moved = False  # the file at the path changed since the last read: rebuild
        self._reopen()
        try:
            vfs = os.fstatvfs(self._fd)
            self.disk_bytes = vfs.f_blocks * vfs.f_frsize or _INT64_MAX
        except OSError:
            self.disk_bytes = _INT64_MAX

    def _reopen(self) -> None:
        """(Re)open the file: at start, in a forked child (a shared open file shares its
        lock), and when the path names another file (`_follow`)."""
        try:
            fd = os.open(self.path, _OPEN_FLAGS, 0o600)
        except OSError as e:
            raise StorageUnavailableError(f"file storage: cannot open {self.path}: {e.strerror or e} "
                                          "(a link or another file is in its place?)") from e
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise StorageUnavailableError(f"file storage: {self.path} is not a regular file of this user's; "
                                          "remove it (the store rebuilds it)")
        self._fd, self._pid = fd, os.getpid()

    def __enter__(self) -> "Ledger":
        if self._pid != os.getpid():
            self._reopen()
        if self.shared:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except OSError as e:
                if e.errno not in _NO_LOCKS:
                    raise
                self.shared = False
                log.warning("file storage: %s cannot be locked (%s); the capacity holds per process, not for "
                            "the directory", self.path, e.strerror)
                return self
            try:
                self._follow()
            except BaseException:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                raise
        return self

    def _follow(self) -> None:
        """Under the lock: hold the file the path names now (unlinked or replaced under a
        running process: the lock of a deleted inode excludes no one)."""
        while True:
            try:
                at_path = os.lstat(self.path)
            except FileNotFoundError:
                at_path = None
            held = os.fstat(self._fd)
            if at_path is not None and (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino):
                return
            old = self._fd
            self._reopen()  # creates it when missing; refuses a link or another user's file
            os.close(old)  # drops the old lock; the new one is taken before anything is read
            self._moved = True
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self.shared:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def read(self) -> int | None:
        """The total (under ``with``); ``None`` when it must be rebuilt: the file is new,
        damaged or another than at the last read, or the total cannot be true (negative,
        or above the file system's size)."""
        if not self.shared:
            return self._local
        if self._moved:
            self._moved = False
            return None
        raw = os.pread(self._fd, _RECORD.size + 1, 0)
        if len(raw) != _RECORD.size:
            return None
        magic, total = _RECORD.unpack(raw)
        return total if magic == _MAGIC and 0 <= total <= self.disk_bytes else None

    def write(self, total: int) -> None:
        """Set the total (under ``with``); never below 0 (a file the total never counted was
        removed), never past int64 (read back as one to rebuild)."""
        total = min(max(0, total), _INT64_MAX)
        if not self.shared:
            self._local = total
            return
        os.pwrite(self._fd, _RECORD.pack(_MAGIC, total), 0)

    def close(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = -1


def hold(fd: int) -> None:
    """Mark a writer's temporary as live: a lock the kernel drops if the writer dies."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in _NO_LOCKS:
            raise


@dataclass(slots=True)
class Reservation:
    """An admitted write: the object's final path, its temporary (held open) and its size."""

    path: str
    tmp: str
    fd: int
    size: int
    committed: bool = False


def reserve(path: str, size: int) -> Reservation:
    """The temporary of a write to ``path``: created, held and at its final size."""
    tmp, fd = new_temp(os.path.dirname(path), os.path.basename(path))
    try:
        hold(fd)
        os.ftruncate(fd, size)  # counted at its final size by any scan while it is written
    except BaseException:
        os.close(fd)
        unlink_quiet(tmp)
        raise
    return Reservation(path, tmp, fd, size)


def abandon(res: Reservation) -> None:
    """Undo `reserve` (its temporary removed, its descriptor closed)."""
    unlink_quiet(res.tmp)
    close_reservation(res)


def close_reservation(res: Reservation) -> None:
    if res.fd >= 0:
        os.close(res.fd)  # drops the writer's hold
        res.fd = -1


def writer_died(path: str) -> bool | None:
    """Whether the writer of the temporary ``path`` died (``True``: nobody holds it), is
    alive (``False``), or cannot be told (``None``: no locks here, or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True  # closing ``fd`` drops this probe's lock (an flock is per open file)
    except OSError as e:
        return False if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
    finally:
        os.close(fd)


def scan_namespace(ns_dir: str) -> tuple[list[tuple[float, str, int]], int]:
    """(mtime, path, size) of every object of one namespace directory, and the bytes of
    the writes in flight there; dead writers' and stale temporaries removed."""
    found, reserved, now = [], 0, time.time()
    for sub in _entries(ns_dir):
        if SUBDIR_RE.fullmatch(sub.name) and sub.is_dir(follow_symlinks=False):
            for f in _entries(sub.path):
                if OBJECT_RE.fullmatch(f.name) and f.name[:2] == sub.name:
                    st = _lstat(f)
                    if st is not None and stat.S_ISREG(st.st_mode):
                        found.append((st.st_mtime, f.path, st.st_size))
                elif OBJECT_TMP_RE.fullmatch(f.name):
                    reserved += _in_flight(f, now)
                elif TMP_RE.fullmatch(f.name):
                    _remove_if_stale(f, now)
        elif sub.name != NAMESPACE_FILE and TMP_RE.fullmatch(sub.name):
            _remove_if_stale(sub, now)
    return found, reserved


def _in_flight(entry: os.DirEntry, now: float) -> int:
    """Bytes an object's temporary reserves: its size while its writer lives, else 0 (removed)."""
    st = _lstat(entry)
    if st is None or not stat.S_ISREG(st.st_mode):
        return 0
    died = writer_died(entry.path)
    if died or (died is None and now - st.st_mtime > STALE_TMP_S):
        unlink_quiet(entry.path)
        return 0
    return st.st_size


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
