"""`FileBackend`: the embedded store, one file per object under a namespace directory.

The layout, its private modes and the no-follow rules are `file_layout`'s. A write goes to
a new temporary name and is renamed into place, so a reader (or a restart after a crash)
sees the whole object or none. Reads and writes move the payload straight between the
file and the caller's host buffer (``preadv`` / ``writev``; strided layer_first views go
through one staging copy). Objects survive restarts; an optional capacity evicts
least-recently-read objects first (`FileIndex`). A refused object (header or checksum)
is deleted so that the next backup rewrites it; so is anything else found at an object's
name (a link, a FIFO, an empty directory), counted as corrupt and logged once.
"""
from __future__ import annotations

import json
import os
import stat

import torch

from hicache.storage.base import StorageBackend, StorageUnavailableError, log
from hicache.storage.file_index import close_index, open_index
from hicache.storage.file_ledger import Reservation
from hicache.storage.file_layout import (MARKER_MAX_BYTES, NAMESPACE_FILE, OBJECT_SUFFIX, NotAFile, advance,
                                         clear_entry, describe_mode, entry_mode, is_regular, open_regular, open_root,
                                         private_dir, publish, read_marker, write_all)
from hicache.storage.keys import StorageNamespace
from hicache.storage.page import HEADER_BYTES, PageCheck, ThreadStaging, check_header, check_payload, encode_header


class FileBackend(StorageBackend):
    """One file per object on a local or shared file system (thread-safe).

    Args:
        namespace: the pool namespace this backend reads and writes.
        root: the storage directory (``--hicache-storage-dir``); created private if missing.
        capacity_bytes: bytes of objects (and writes in flight) allowed under ``root``: all
            namespaces, all processes on it (`file_ledger`); 0 = unlimited.
        fsync: ``fsync`` each object before its rename (power-loss durability; slower).
            Without it a crash can lose recent objects but never leaves a torn one readable:
            the checksum refuses it.

    Raises:
        StorageUnavailableError: ``root`` cannot be created or written, or is not private
            (not this user's, or writable by others).
        ValueError: a namespace whose marker exceeds ``MARKER_MAX_BYTES`` (a huge ``extra``), a
            negative capacity, or one below one object of every namespace open on
            ``root`` (naming ``--hicache-storage-capacity`` and the smallest useful capacity).
    """

    kind = "file"

    def __init__(self, namespace: StorageNamespace, root: str | os.PathLike, capacity_bytes: int = 0,
                 fsync: bool = False) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes: must be >= 0 (0 = unlimited), got {capacity_bytes}")
        self._marker = json.dumps(namespace.describe(), indent=1, sort_keys=True).encode()
        if len(self._marker) > MARKER_MAX_BYTES:  # read back truncated, it would be "damaged" on every open
            raise ValueError(f"namespace: its {NAMESPACE_FILE} would be {len(self._marker):,} B, over the "
                             f"{MARKER_MAX_BYTES:,} B limit; shorten its extra text")
        super().__init__(namespace)
        self.root = open_root(root)
        self.dir = str(self.root / namespace.digest_hex[:32])
        self.fsync = fsync
        self._made: set[str] = set()
        self._index = open_index(self.root, capacity_bytes, namespace.digest_hex, HEADER_BYTES + namespace.object_bytes)
        try:
            self._open_dir()
            self._index.adopt(self.dir)
        except BaseException:
            close_index(self._index, namespace.digest_hex)
            raise
        self._staging = ThreadStaging()

    def _open_dir(self) -> None:
        """The namespace directory and its marker; a damaged marker is rebuilt (one warning naming it)."""
        try:
            private_dir(self.dir)
            found = read_marker(self.dir)
            if found == self.namespace.describe():
                return
            if found is not None:  # damaged (a dict can only differ if edited to another valid namespace)
                why = found if isinstance(found, str) else f"{self.dir}/{NAMESPACE_FILE} describes another namespace"
                log.warning("file storage: %s; rebuilt from this server's namespace (the pages are checked "
                            "one by one when read)", why)
                clear_entry(os.path.join(self.dir, NAMESPACE_FILE))
            publish(self.dir, NAMESPACE_FILE, [self._marker])
        except OSError as e:
            raise StorageUnavailableError(f"file storage: cannot use --hicache-storage-dir {self.root}: "
                                          f"{e.strerror or e}") from e

    def path(self, key: str) -> str:
        """Where the object of ``key`` lives."""
        return os.path.join(self.dir, key[:2], key + OBJECT_SUFFIX)

    # ---- exists -----------------------------------------------------------------------
    def _exists(self, keys: list[str]) -> int:
        for i, key in enumerate(keys):
            if not is_regular(self.path(key)):
                return i
        return len(keys)

    # ---- get --------------------------------------------------------------------------
    def _get(self, keys: list[str], pages: list[torch.Tensor]) -> list[bool]:
        return [self._get_one(k, p) for k, p in zip(keys, pages)]

    def _get_one(self, key: str, page: torch.Tensor) -> bool:
        path = self.path(key)
        try:
            fd = open_regular(path)
        except NotAFile as e:
            self._damaged(path, e.strerror)
            return False
        except OSError as e:
            self._fault("get", e)
            return False
        if fd is None:
            self.count(misses=1)
            return False
        try:
            verdict = self._read_verified(fd, key, page)
        except OSError as e:
            self._fault("get", e)
            return False
        finally:
            os.close(fd)
        if verdict is not PageCheck.OK:
            self.refuse(key, verdict)
            self._index.discard(path)
            return False
        self._index.touch(path, HEADER_BYTES + page.numel())
        self.count(hits=1, objects_read=1, bytes_read=page.numel())
        return True

    def _damaged(self, path: str, what: str) -> bool:
        """Something other than a page file at ``path``: counted, logged once, removed if it
        can be without deleting anything not ours; whether the name is free now."""
        self.count(corrupt=1)
        self.log_once("damaged", f"{path} is {what}, not a page file; treated as a miss and removed")
        try:
            self._index.clear(path)
            return True
        except OSError as e:
            self._fault("clear", e)
            return False

    def _read_verified(self, fd: int, key: str, page: torch.Tensor) -> PageCheck:
        n = self.namespace.object_bytes
        header, beyond = bytearray(HEADER_BYTES), bytearray(1)  # a byte past the end: longer files show
        flat, staged = self._staging.flat(page)
        got = _preadv_all(fd, [header, flat.numpy(), beyond])
        verdict = check_header(header[:got], self.namespace, key)
        if verdict is PageCheck.OK and got != HEADER_BYTES + n:
            verdict = PageCheck.TRUNCATED if got < HEADER_BYTES + n else PageCheck.BAD_LENGTH
        if verdict is PageCheck.OK:
            verdict = check_payload(header, flat)
        if verdict is PageCheck.OK:
            if staged:
                page.copy_(flat.view(page.shape))
            os.utime(fd)  # LRU order that survives a restart
        return verdict

    # ---- set --------------------------------------------------------------------------
    def _set(self, keys: list[str], pages: list[torch.Tensor]) -> list[bool]:
        return [self._set_one(k, p) for k, p in zip(keys, pages)]

    def _set_one(self, key: str, page: torch.Tensor) -> bool:
        path = self.path(key)
        size = HEADER_BYTES + page.numel()
        mode = entry_mode(path)
        if mode is not None and stat.S_ISREG(mode):
            self._index.touch(path, size)
            self.count(writes_skipped=1)
            return True
        if mode is not None and not self._damaged(path, describe_mode(mode)):
            return False
        try:
            self._subdir(os.path.dirname(path))
            res, evicted = self._index.admit(path, size)
        except OSError as e:
            self._fault("set", e)
            return False
        self.count(evictions=evicted)
        if res is None:
            self._fault("full", OSError(f"no room for an object of {size:,} B under the capacity of "
                                        f"{self._index.capacity_bytes:,} B (--hicache-storage-capacity): the rest "
                                        "is taken by writes in flight"))
            return False
        try:
            self._write(res, key, page)
            self._index.commit(res)
        except BaseException as e:  # whatever failed, the reservation goes back
            self._index.release(res)
            if not isinstance(e, OSError):
                raise
            self._fault("set", e)
            return False
        self.count(objects_written=1, bytes_written=page.numel())
        return True

    def _subdir(self, sub: str) -> None:
        if sub not in self._made:
            private_dir(sub)
            self._made.add(sub)

    def _write(self, res: Reservation, key: str, page: torch.Tensor) -> None:
        flat, staged = self._staging.flat(page)
        if staged:
            flat.view(page.shape).copy_(page)
        write_all(res.fd, [encode_header(self.namespace, key, flat), flat.numpy()], self.fsync)

    def _close(self) -> None:
        close_index(self._index, self.namespace.digest_hex)
        self._staging.release()


def _preadv_all(fd: int, parts: list) -> int:
    """Fill ``parts`` from the start of the file until they are full or the file ends; bytes read."""
    views = [memoryview(p).cast("B") for p in parts]
    done = 0
    while views:
        got = os.preadv(fd, views, done)
        if got == 0:
            break
        done += got
        views = advance(views, got)
    return done
