"""`MooncakeBackend`: page objects in Mooncake Store, the distributed tier.

Each object is put and got as two parts in one Mooncake call (``batch_put_from_multi_buffers``
/ ``batch_get_into_multi_buffers``): the 64-byte header from a small registered arena
and the payload straight from/into the caller's host page, so page_first pages move with
no copy on our side (strided layer_first pages go through a registered staging buffer).
Keys are ``<namespace>_<page hash>``; objects already present are not re-sent.
"""
from __future__ import annotations

import time

import torch

from hicache.storage.base import StorageBackend, capacity_flag
from hicache.storage.keys import StorageNamespace
from hicache.storage.mooncake_client import (ALREADY_EXISTS, NO_SPACE, NOT_FOUND, NOT_READY, TRANSFER_FAIL,
                                             acquire_client, release_client)
from hicache.storage.page import (HEADER_BYTES, PageCheck, ThreadStaging, check_header, check_payload,
                                  encode_header)


NOT_READY_RETRY_S = (0.005, 0.02, 0.08)  # waits for a concurrent put of the same key (~0.1 s in all)


class MooncakeBackend(StorageBackend):
    """One pool namespace in Mooncake Store (thread-safe).

    Args:
        namespace: the pool namespace this backend reads and writes.
        master: ``host:port`` of ``mooncake_master`` (``--hicache-storage-master``).
        segment_bytes: memory this process contributes to the store
            (``--hicache-storage-capacity``), shared by every backend of the process.
        **client_kwargs: `MooncakeClient` options (``protocol``, ``connect_timeout_s``, ``retry_s``).

    Raises:
        StorageUnavailableError: Mooncake missing, master unreachable or set-up refused.
        ValueError: a segment that is not 0 (none) but below one object (naming
            ``--hicache-storage-capacity`` and the smallest useful size).
    """

    kind = "mooncake"

    def __init__(self, namespace: StorageNamespace, master: str, segment_bytes: int, **client_kwargs) -> None:
        need = HEADER_BYTES + namespace.object_bytes
        if 0 < segment_bytes < need:
            raise ValueError(f"segment_bytes (--hicache-storage-capacity): {segment_bytes:,} B cannot hold one object "
                             f"of pool {namespace.pool!r} ({need:,} B); the smallest useful one is {capacity_flag(need)} "
                             "(GB), or 0 to contribute no memory")
        super().__init__(namespace)
        self.client = acquire_client(master, segment_bytes, **client_kwargs)
        self._registered: list[torch.Tensor] = []  # what this backend registered (undone at close)
        self._headers = ThreadStaging(on_alloc=self.client.register)
        self._staging = ThreadStaging(on_alloc=self.client.register)

    def register_buffer(self, buffer: torch.Tensor) -> None:
        """Register a host pool's buffer for zero-copy transfers until this backend closes.

        ``buffer`` must stay allocated until then (host pools do).
        """
        self._check_open()
        if self.client.register(buffer):
            self._registered.append(buffer)

    def _names(self, keys: list[str]) -> list[str]:
        return [self.namespace.object_key(k) for k in keys]

    def _exists(self, keys: list[str]) -> int:
        if not self.client.available():
            self.count(errors=1)
            return 0
        codes = self.client.store.batch_is_exist(self._names(keys))
        if self.client.check_codes(codes):
            self.count(errors=1)
        for i, c in enumerate(codes):
            if c != 1:
                return i
        return len(keys)

    def _get(self, keys: list[str], pages: list[torch.Tensor]) -> list[bool]:
        if not self.client.available():
            self.count(errors=len(keys))
            return [False] * len(keys)
        n = self.namespace.object_bytes
        headers = self._headers.get(HEADER_BYTES * len(keys))
        flats = self._targets(pages)
        hptr = headers.data_ptr()
        ptrs = [[hptr + i * HEADER_BYTES, f.data_ptr()] for i, f in enumerate(flats)]
        names = self._names(keys)
        got = self.client.store.batch_get_into_multi_buffers(names, ptrs, [[HEADER_BYTES, n]] * len(keys))
        for delay_s in NOT_READY_RETRY_S:  # another writer's put of the same key is in flight
            wait = [i for i, c in enumerate(got) if c == NOT_READY]
            if not wait:
                break
            time.sleep(delay_s)
            again = self.client.store.batch_get_into_multi_buffers(
                [names[i] for i in wait], [ptrs[i] for i in wait], [[HEADER_BYTES, n]] * len(wait))
            for i, c in zip(wait, again):
                got[i] = c
        self.client.check_codes(got)
        return [self._verify(k, p, f, headers[i * HEADER_BYTES:(i + 1) * HEADER_BYTES], r)
                for i, (k, p, f, r) in enumerate(zip(keys, pages, flats, got))]

    def _targets(self, pages: list[torch.Tensor]) -> list[torch.Tensor]:
        """Where each page's payload lands: the page itself if contiguous, else a staging slice."""
        n = self.namespace.object_bytes
        strided = [i for i, p in enumerate(pages) if not p.is_contiguous()]
        stage = self._staging.get(n * len(strided)) if strided else None
        flats = [p.view(-1) if p.is_contiguous() else None for p in pages]
        for j, i in enumerate(strided):
            flats[i] = stage[j * n:(j + 1) * n]
        return flats

    def _verify(self, key: str, page: torch.Tensor, flat: torch.Tensor, header: torch.Tensor, got: int) -> bool:
        n = self.namespace.object_bytes
        if got in NOT_FOUND or got == NOT_READY:
            self.count(misses=1)
            return False
        if got == TRANSFER_FAIL:  # also what a get of an object shorter than asked returns
            got = self._size_or_fail(key)
        if got < 0 and got != -600:  # -600: our buffer is smaller than the object
            self.count(errors=1)
            self.log_once(f"get:{got}", f"get failed with Mooncake code {got}; treated as a miss")
            return False
        raw = header.numpy().tobytes()
        if got == -600:
            verdict = PageCheck.BAD_LENGTH
        elif got != HEADER_BYTES + n:
            verdict = PageCheck.TRUNCATED
        else:
            verdict = check_header(raw, self.namespace, key)
        if verdict is PageCheck.OK:
            verdict = check_payload(raw, flat)
        if verdict is not PageCheck.OK:
            self.refuse(key, verdict)
            return False
        if not page.is_contiguous():  # staged: scatter into the strided host view
            page.copy_(flat.view(page.shape))
        self.count(hits=1, objects_read=1, bytes_read=n)
        return True

    def _size_or_fail(self, key: str) -> int:
        """Size of a stored object when it differs from ours (a refusal), else TRANSFER_FAIL."""
        size = self.client.store.get_size(self.namespace.object_key(key))
        return size if size >= 0 and size != HEADER_BYTES + self.namespace.object_bytes else TRANSFER_FAIL

    def _set(self, keys: list[str], pages: list[torch.Tensor]) -> list[bool]:
        if not self.client.available():
            self.count(errors=len(keys))
            return [False] * len(keys)
        names = self._names(keys)
        present = self.client.store.batch_is_exist(names)
        if self.client.check_codes(present):
            self.count(errors=len(keys))
            return [False] * len(keys)
        todo = [i for i, c in enumerate(present) if c != 1]
        self.count(writes_skipped=len(keys) - len(todo))
        ok = [True] * len(keys)
        if todo:
            for i, good in zip(todo, self._put([keys[i] for i in todo], [pages[i] for i in todo])):
                ok[i] = good
        return ok

    def _put(self, keys: list[str], pages: list[torch.Tensor]) -> list[bool]:
        n = self.namespace.object_bytes
        flats = self._targets(pages)
        headers = self._headers.get(HEADER_BYTES * len(keys))
        for i, (k, p, f) in enumerate(zip(keys, pages, flats)):
            if not p.is_contiguous():  # gather the strided host view into staging
                f.view(p.shape).copy_(p)
            headers[i * HEADER_BYTES:(i + 1) * HEADER_BYTES] = torch.frombuffer(
                bytearray(encode_header(self.namespace, k, f)), dtype=torch.uint8)
        hptr = headers.data_ptr()
        ptrs = [[hptr + i * HEADER_BYTES, f.data_ptr()] for i, f in enumerate(flats)]
        codes = self.client.store.batch_put_from_multi_buffers(self._names(keys), ptrs, [[HEADER_BYTES, n]] * len(keys))
        self.client.check_codes(codes)
        out = []
        for c in codes:
            good = c == 0 or c == ALREADY_EXISTS
            out.append(good)
            if not good:
                self.count(errors=1)
                why = "the store is full (no memory contributed? --hicache-storage-capacity)" if c == NO_SPACE else f"Mooncake code {c}"
                self.log_once(f"set:{c}", f"put failed ({why}); the page is not stored")
        self.count(objects_written=sum(out), bytes_written=n * sum(out))
        return out

    def _close(self) -> None:
        for buf in self._headers.release() + self._staging.release() + self._registered:
            self.client.unregister(buf)
        self._registered = []
        release_client(self.client)
