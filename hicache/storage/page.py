"""Page objects: one per (page, pool), every layer of the pool, behind a 64-byte header.

An object is the header followed by the payload. The payload is the page's rows in
page_first order ``[rows, layers, row_bytes]`` whatever the host layout, so a page written
by a layer_first server reads back on a page_first one:

    offset  size  field
    0       4     magic  b"HCPG"
    4       2     schema version (keys.SCHEMA_VERSION)
    6       2     header bytes (64)
    8       8     payload bytes
    16      8     xxh3-64 of the payload
    24      16    namespace digest, first 16 bytes
    40      16    page hash, first 16 bytes
    56      8     reserved (zero)
    64      ...   payload

A header that does not match what the reader expects, or a payload whose checksum
differs, makes the object a miss (`PageCheck` says why); it is never handed out.
"""
from __future__ import annotations

import enum
import struct
import threading
from typing import Callable

import torch
import xxhash

from hicache.storage.keys import SCHEMA_VERSION, StorageNamespace
from host_pools.pools import HostPool

MAGIC = b"HCPG"
HEADER = struct.Struct("<4sHHQQ16s16s8x")
HEADER_BYTES = HEADER.size
assert HEADER_BYTES == 64, HEADER_BYTES


class PageCheck(enum.Enum):
    """Outcome of checking a stored object against what the reader expects."""

    OK = "ok"
    TRUNCATED = "truncated"  # fewer bytes than header + expected payload
    BAD_MAGIC = "bad magic"
    BAD_VERSION = "schema version differs"
    WRONG_NAMESPACE = "namespace digest differs"
    WRONG_KEY = "page hash differs"
    BAD_LENGTH = "payload length differs"
    BAD_CHECKSUM = "payload checksum differs"


def checksum(payload: torch.Tensor) -> int:
    """xxh3-64 of a contiguous CPU uint8 tensor's bytes (no copy)."""
    return xxhash.xxh3_64_intdigest(payload.view(-1).numpy())


def encode_header(namespace: StorageNamespace, page_hash: str, payload: torch.Tensor) -> bytes:
    """The 64-byte header of ``payload`` (contiguous CPU uint8) stored under ``page_hash``."""
    return HEADER.pack(MAGIC, SCHEMA_VERSION, HEADER_BYTES, payload.numel(), checksum(payload),
                       namespace.digest[:16], bytes.fromhex(page_hash)[:16])


def check_header(raw: bytes | memoryview, namespace: StorageNamespace, page_hash: str) -> PageCheck:
    """Whether ``raw`` (at least 64 bytes) is the header this reader expects; payload unchecked."""
    if len(raw) < HEADER_BYTES:
        return PageCheck.TRUNCATED
    magic, version, hdr_bytes, n, _, ns, key = HEADER.unpack_from(raw)
    if magic != MAGIC:
        return PageCheck.BAD_MAGIC
    if version != SCHEMA_VERSION or hdr_bytes != HEADER_BYTES:
        return PageCheck.BAD_VERSION
    if ns != namespace.digest[:16]:
        return PageCheck.WRONG_NAMESPACE
    if key != bytes.fromhex(page_hash)[:16]:
        return PageCheck.WRONG_KEY
    if n != namespace.object_bytes:
        return PageCheck.BAD_LENGTH
    return PageCheck.OK


def check_payload(raw_header: bytes | memoryview, payload: torch.Tensor) -> PageCheck:
    """Whether ``payload`` (contiguous, already read) matches the checksum in its header."""
    stored = HEADER.unpack_from(raw_header)[4]
    return PageCheck.OK if checksum(payload) == stored else PageCheck.BAD_CHECKSUM


def page_view(pool: HostPool, first_row: int, num_rows: int) -> torch.Tensor:
    """The rows ``[first_row, first_row + num_rows)`` of a host pool as a ``[rows, layers, bytes]`` view.

    For page_first pools the view is contiguous (zero-copy I/O); for layer_first pools it
    is strided and the backends gather/scatter it through a staging buffer.

    Raises:
        ValueError: rows out of range.
    """
    if num_rows < 1 or first_row < 0 or first_row + num_rows > pool.num_rows:
        raise ValueError(f"first_row, num_rows: [{first_row}, {first_row + num_rows}) is not inside "
                         f"pool {pool.name!r}'s {pool.num_rows} rows")
    if pool.layout == "page_first":
        return pool.buffer[first_row:first_row + num_rows]
    return pool.buffer[:, first_row:first_row + num_rows].transpose(0, 1)


def check_pages(pages: list[torch.Tensor] | tuple[torch.Tensor, ...], num_keys: int, nbytes: int,
                writable: bool) -> None:
    """Caller's page buffers: one CPU uint8 tensor of ``nbytes`` per key.

    Raises:
        TypeError / ValueError naming ``pages[i]``.
    """
    if len(pages) != num_keys:
        raise ValueError(f"pages: need one buffer per key, got {len(pages)} buffers for {num_keys} keys")
    for i, p in enumerate(pages):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"pages[{i}]: need a torch.Tensor, got {type(p).__name__}")
        if p.dtype != torch.uint8 or p.device.type != "cpu":
            raise ValueError(f"pages[{i}]: need a CPU uint8 tensor (a host pool view), got {p.dtype} on {p.device}")
        if p.numel() != nbytes:
            raise ValueError(f"pages[{i}]: need {nbytes} bytes (one object of this namespace), got {p.numel()}")
        if writable and p.requires_grad:
            raise ValueError(f"pages[{i}]: cannot write into a tensor that requires grad")


class ThreadStaging:
    """One reusable contiguous buffer per I/O thread, for pages whose host view is strided.

    Buffers stay alive (and registered, via ``on_alloc``) until `release`, so a store
    that was told their address never sees it freed under it.

    Args:
        on_alloc: called with every new buffer (e.g. to register it with a store).
    """

    def __init__(self, on_alloc: Callable[[torch.Tensor], None] | None = None) -> None:
        self._local = threading.local()
        self._all: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self._on_alloc = on_alloc

    def get(self, nbytes: int) -> torch.Tensor:
        """This thread's buffer, at least ``nbytes`` long, as a 1-D view of ``nbytes``."""
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8)
            if self._on_alloc is not None:
                self._on_alloc(buf)
            with self._lock:
                self._all.append(buf)
            self._local.buf = buf
        return buf[:nbytes]

    def flat(self, page: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """A contiguous 1-D tensor of ``page``'s bytes: the page itself (``False``) or staging (``True``)."""
        if page.is_contiguous():
            return page.view(-1), False
        return self.get(page.numel()), True

    def release(self) -> list[torch.Tensor]:
        """Forget every buffer; returns them (to unregister) — call once no I/O is running."""
        with self._lock:
            out, self._all = self._all, []
        self._local = threading.local()
        return out
