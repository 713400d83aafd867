"""`FileBackend`: the embedded store, one file per object under a namespace directory.

    <root>/<first 32 hex of namespace digest>/namespace.json      what the digest covers
    <root>/<ns>/<key[:2]>/<key>.page                              header + payload
    <root>/<ns>/<key[:2]>/.<key>.<pid>.<thread>.tmp               a write in progress

A write goes to a temporary name and is renamed into place, so a reader (or a restart
after a crash) sees the whole object or none. Reads and writes move the payload straight
between the file and the caller's host buffer (``preadv`` / ``writev``; strided
layer_first views go through one staging copy). Objects survive restarts; an optional
capacity evicts least-recently-read objects first (`FileIndex`). A refused object
(header or checksum) is deleted so that the next backup rewrites it.
"""
from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import torch

from hicache.storage.base import StorageBackend, StorageUnavailableError
from hicache.storage.file_index import OBJECT_SUFFIX, TMP_SUFFIX, close_index, open_index, unlink_quiet
from hicache.storage.keys import StorageNamespace
from hicache.storage.page import (HEADER_BYTES, PageCheck, ThreadStaging, check_header, check_payload,
                                  encode_header)

NAMESPACE_FILE = "namespace.json"


class FileBackend(StorageBackend):
    """One file per object on a local or shared file system (thread-safe).

    Args:
        namespace: the pool namespace this backend reads and writes.
        root: the storage directory (``--hicache-storage-dir``); created if missing.
        capacity_bytes: bytes of objects allowed under ``root`` (all namespaces); 0 = unlimited.
        fsync: ``fsync`` each object before its rename (power-loss durability; slower).
            Without it a crash can lose recent objects but never leaves a torn one readable:
            the checksum refuses it.

    Raises:
        StorageUnavailableError: ``root`` cannot be created or written.
        ValueError: negative capacity.
    """

    kind = "file"

    def __init__(self, namespace: StorageNamespace, root: str | os.PathLike, capacity_bytes: int = 0,
                 fsync: bool = False) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes: must be >= 0 (0 = unlimited), got {capacity_bytes}")
        super().__init__(namespace)
        self.root = Path(root)
        self.dir = self.root / namespace.digest_hex[:32]
        self.fsync = fsync
        self._made: set[str] = set()
        self._open_dir()
        self._index = open_index(self.root, capacity_bytes)
        self._staging = ThreadStaging()

    def _open_dir(self) -> None:
        desc = json.dumps(self.namespace.describe(), indent=1, sort_keys=True)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            meta = self.dir / NAMESPACE_FILE
            if not meta.exists():
                tmp = self.dir / f".{NAMESPACE_FILE}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"
                tmp.write_text(desc)
                os.replace(tmp, meta)
            elif json.loads(meta.read_text()) != self.namespace.describe():
                raise StorageUnavailableError(f"{meta} describes another namespace; the directory "
                                              "was tampered with (--hicache-storage-dir)")
        except OSError as e:
            raise StorageUnavailableError(f"file storage: cannot use --hicache-storage-dir {self.root}: "
                                          f"{e.strerror or e}") from e

    def path(self, key: str) -> str:
        """Where the object of ``key`` lives."""
        return os.path.join(self.dir, key[:2], key + OBJECT_SUFFIX)

    # ---- exists -----------------------------------------------------------------------
    def _exists(self, keys: list[str]) -> int:
        for i, key in enumerate(keys):
            if not os.path.exists(self.path(key)):
                return i
        return len(keys)

    # ---- get --------------------------------------------------------------------------
    def _get(self, keys: list[str], pages: list[torch.Tensor]) -> list[bool]:
        return [self._get_one(k, p) for k, p in zip(keys, pages)]

    def _get_one(self, key: str, page: torch.Tensor) -> bool:
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self.count(misses=1)
            return False
        except OSError as e:
            self._fault("get", e)
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
            self._index.forget(path)
            unlink_quiet(path)
            return False
        self._index.touch(path, HEADER_BYTES + page.numel())
        self.count(hits=1, objects_read=1, bytes_read=page.numel())
        return True

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
        if os.path.exists(path):
            self._index.touch(path, size)
            self.count(writes_skipped=1)
            return True
        victims = self._index.admit(path, size)
        if victims is None:
            self._fault("set", OSError(errno.EFBIG, f"object of {size} B exceeds the capacity "
                                       f"{self._index.capacity_bytes} B (--hicache-storage-capacity)"))
            return False
        evicted = sum(unlink_quiet(v) for v in victims)
        if evicted:
            self.count(evictions=evicted)
        try:
            self._write_atomic(key, path, page)
        except OSError as e:
            self._index.forget(path)
            self._fault("set", e)
            return False
        self.count(objects_written=1, bytes_written=page.numel())
        return True

    def _write_atomic(self, key: str, path: str, page: torch.Tensor) -> None:
        sub = os.path.dirname(path)
        if sub not in self._made:
            os.makedirs(sub, exist_ok=True)
            self._made.add(sub)
        flat, staged = self._staging.flat(page)
        if staged:
            flat.view(page.shape).copy_(page)
        header = encode_header(self.namespace, key, flat)
        tmp = os.path.join(sub, f".{key}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _writev_all(fd, [header, flat.numpy()])
            if self.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            unlink_quiet(tmp)
            raise
        os.close(fd)
        try:
            os.replace(tmp, path)
        except BaseException:
            unlink_quiet(tmp)
            raise

    def _close(self) -> None:
        close_index(self._index)
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
        views = _advance(views, got)
    return done


def _writev_all(fd: int, parts: list) -> None:
    """Write every byte of ``parts`` (short writes resumed)."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        views = _advance(views, os.writev(fd, views))


def _advance(views: list[memoryview], nbytes: int) -> list[memoryview]:
    """What is left of ``views`` after the first ``nbytes`` went through."""
    while views and nbytes >= len(views[0]):
        nbytes -= len(views[0])
        views = views[1:]
    if views and nbytes:
        views = [views[0][nbytes:], *views[1:]]
    return views
