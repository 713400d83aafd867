"""Host memory: the budget every host pool must fit in, and one reservation per group.

Budget = min(psutil available, cgroup limit - cgroup usage) - headroom, split evenly
across the ranks that share the host. A reservation checks the *whole* group against
that budget before touching memory, allocates every pool from page-aligned anonymous
mmaps (pre-faulted, so the OS commits the memory now rather than OOM-killing the server
later), pins them with ``cudaHostRegister`` in chunks when CUDA is present, and on any
failure releases everything it took. CPU mode runs the same code without pinning.

Pinned chunks start at multiples of lcm(OS page, row stride) from the buffer start, so
no row straddles two registrations (a copy engine that must not cross a registration
splits runs at the recorded chunk starts). Pinned mappings are ``MADV_DONTFORK``: a
forked child (a tokenizer or data worker) neither copies nor sees them, and the
reservation's finalizer makes no CUDA call outside the process that pinned.
"""
from __future__ import annotations

import math
import mmap
import os
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import psutil
import torch

GIB = 1 << 30
_PIN_CHUNK_BYTES = 1 << 30  # one cudaHostRegister call per GiB keeps each call short
_MAX_PIN_CHUNK_BYTES = 64 << 30  # a row stride forcing larger chunks: one registration
_NO_LIMIT = 1 << 60  # cgroup v1 reports "no limit" as a huge number


class HostMemoryError(ValueError):
    """The host pools do not fit the host-memory budget (nothing was allocated)."""


@dataclass(frozen=True)
class HostBudget:
    """What this rank may spend on host pools, and where the number came from (bytes)."""

    available_bytes: int  # psutil.virtual_memory().available
    cgroup_free_bytes: int | None  # cgroup limit - usage, None when unlimited
    headroom_bytes: int  # kept free for the server process itself
    ranks_per_host: int  # co-located ranks sharing the same host memory
    budget_bytes: int  # per-rank budget

    def describe(self) -> str:
        cg = "unlimited" if self.cgroup_free_bytes is None else f"{self.cgroup_free_bytes / GIB:.2f} GiB"
        return (f"available {self.available_bytes / GIB:.2f} GiB, cgroup free {cg}, "
                f"headroom {self.headroom_bytes / GIB:.2f} GiB, split over {self.ranks_per_host} rank(s) "
                f"-> budget {self.budget_bytes / GIB:.2f} GiB per rank")


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def cgroup_free_bytes(root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes the cgroup still allows (limit - usage); ``None`` when no limit is set.

    Reads cgroup v2 (``memory.max`` / ``memory.current``) and falls back to v1
    (``memory/memory.limit_in_bytes`` / ``memory/memory.usage_in_bytes``).
    """
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit = _read_int(os.path.join(root, limit_file))
        if limit is None or limit >= _NO_LIMIT:
            continue
        usage = _read_int(os.path.join(root, usage_file)) or 0
        return max(0, limit - usage)
    return None


def default_headroom_bytes(total_bytes: int | None = None) -> int:
    """Headroom left to the server: min(10 GiB, 10 % of physical memory)."""
    total = psutil.virtual_memory().total if total_bytes is None else total_bytes
    return min(10 * GIB, total // 10)


def host_budget(headroom_bytes: int | None = None, ranks_per_host: int = 1,
                cgroup_root: str = "/sys/fs/cgroup", available_bytes: int | None = None) -> HostBudget:
    """Compute this rank's host-memory budget.

    Args:
        headroom_bytes: bytes to leave free; ``None`` uses ``default_headroom_bytes()``.
        ranks_per_host: ranks sharing this host's memory (>= 1); the budget is split evenly.
        cgroup_root: where the cgroup filesystem is mounted (tests point it at a fake).
        available_bytes: override psutil's reading (tests).
    Raises:
        ValueError: ``ranks_per_host`` < 1, or a negative or non-finite headroom.
    """
    if ranks_per_host < 1:
        raise ValueError(f"ranks_per_host: must be >= 1, got {ranks_per_host}")
    if isinstance(headroom_bytes, float) and not math.isfinite(headroom_bytes):  # int(inf): OverflowError
        raise ValueError(f"headroom_bytes: must be a finite number of bytes, got {headroom_bytes}")
    headroom = default_headroom_bytes() if headroom_bytes is None else int(headroom_bytes)
    if headroom < 0:
        raise ValueError(f"headroom_bytes: must be >= 0, got {headroom}")
    avail = psutil.virtual_memory().available if available_bytes is None else int(available_bytes)
    cg = cgroup_free_bytes(cgroup_root)
    usable = avail if cg is None else min(avail, cg)
    budget = max(0, usable - headroom) // ranks_per_host
    return HostBudget(avail, cg, headroom, ranks_per_host, budget)


def _refusal(requests: Mapping[str, int], budget: HostBudget, flag_hint: str, why: str) -> HostMemoryError:
    lines = [f"{why}: host pools need {sum(requests.values()) / GIB:.2f} GiB, budget is "
             f"{budget.budget_bytes / GIB:.2f} GiB ({budget.describe()})."]
    lines += [f"  {name:<20} {n / GIB:10.3f} GiB" for name, n in requests.items() if n]
    lines.append(f"Lower {flag_hint}, or raise the memory limit / lower the headroom.")
    return HostMemoryError("\n".join(lines))


def check_fits(requests: Mapping[str, int], budget: HostBudget,
               flag_hint: str = "--hicache-ratio or --hicache-size") -> None:
    """Refuse ``requests`` (name -> bytes) that exceed ``budget``, before anything is allocated.

    Raises:
        HostMemoryError: the total is over ``budget.budget_bytes`` (per-pool GiB, the
            budget and ``flag_hint``, the setting to lower).
    """
    if sum(requests.values()) > budget.budget_bytes:
        raise _refusal(requests, budget, flag_hint, "not enough host memory")


def _progress(name: str, done: int, total: int, started: float) -> None:
    if time.perf_counter() - started > 1.0:  # only long pins are worth a progress line
        sys.stderr.write(f"\rpinning {name}: {done / GIB:.1f}/{total / GIB:.1f} GiB")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def pin_chunk_bytes(row_stride: int, total: int, target: int | None = None) -> int:
    """Bytes per registration: the largest multiple of lcm(OS page, ``row_stride``) not
    above ``target`` (at least one such unit); the whole buffer when the unit exceeds
    64 GiB. Chunk starts are then page-aligned and never inside a row."""
    target = _PIN_CHUNK_BYTES if target is None else target
    unit = math.lcm(mmap.PAGESIZE, max(1, int(row_stride)))
    if unit > _MAX_PIN_CHUNK_BYTES:
        return max(1, total)
    return max(unit, target // unit * unit)


class HostReservation:
    """Every host buffer of one group, taken (and given back) together.

    Use ``reserve(requests, budget, ...)``; the returned buffers are 1-D uint8 tensors
    keyed like ``requests``. ``release()`` unpins; the memory itself goes when the last
    tensor referencing it goes. Not thread-safe (set-up and teardown only).

    Attributes:
        chunks: per pinned buffer, the start addresses of its registrations (int64).
    """

    def __init__(self, pin: bool = False) -> None:
        self.pin = pin
        self.buffers: dict[str, torch.Tensor] = {}
        self.chunks: dict[str, np.ndarray] = {}
        self._pinned: list[int] = []  # base addresses of registered chunks
        self._owner_pid = os.getpid()
        self._finalizer = weakref.finalize(self, HostReservation._unpin, self._pinned, self._owner_pid)

    @property
    def total_bytes(self) -> int:
        return sum(b.numel() for b in self.buffers.values())

    def reserve(self, requests: Mapping[str, int], budget: HostBudget,
                flag_hint: str = "--hicache-ratio or --hicache-size",
                row_strides: Mapping[str, int] | None = None) -> dict[str, torch.Tensor]:
        """Allocate all ``requests`` (name -> bytes) or nothing.

        Args:
            requests: bytes per buffer name.
            budget: the host-memory budget the total must fit.
            flag_hint: the flags a refusal tells the user to lower.
            row_strides: bytes between consecutive rows per buffer name (chunk edges
                fall between rows); default: one OS page.

        Raises:
            HostMemoryError: the total exceeds ``budget.budget_bytes``, or the OS refused
                memory or pinning midway (everything taken so far is released first).
            ValueError: a negative byte count.
        """
        if any(n < 0 for n in requests.values()):
            raise ValueError(f"requests: byte counts must be >= 0, got {dict(requests)}")
        check_fits(requests, budget, flag_hint)
        strides = row_strides or {}
        try:
            for name, nbytes in requests.items():
                self.buffers[name] = self._allocate(name, nbytes, strides.get(name, 1))
        except (OSError, RuntimeError, MemoryError) as exc:
            self.release()
            raise _refusal(requests, budget, flag_hint, f"host allocation failed ({exc})") from exc
        return dict(self.buffers)

    def _allocate(self, name: str, nbytes: int, row_stride: int) -> torch.Tensor:
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        # Anonymous mmap: page-aligned (torch's pinned allocator would round up to a power
        # of two) and MAP_POPULATE pre-faults every page so the memory is committed now.
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        region = mmap.mmap(-1, nbytes, flags=flags)
        buf = torch.frombuffer(region, dtype=torch.uint8, count=nbytes)
        if self.pin:
            # A fork would otherwise copy every pinned page into the child at once.
            region.madvise(mmap.MADV_DONTFORK)
            self._register(name, buf, row_stride)
        return buf

    def _register(self, name: str, buf: torch.Tensor, row_stride: int) -> None:
        from host_pools import cuda_host

        base, total, started = buf.data_ptr(), buf.numel(), time.perf_counter()
        chunk = pin_chunk_bytes(row_stride, total)
        starts = list(range(0, total, chunk))
        for off in starts:
            size = min(chunk, total - off)
            try:
                cuda_host.register(base + off, size)
            except RuntimeError as exc:
                raise RuntimeError(f"pool {name!r}: {exc}; refusing to fall back to pageable "
                                   f"memory") from None
            self._pinned.append(base + off)
            _progress(name, off + size, total, started)
        device_ptr = cuda_host.device_pointer(base)
        if device_ptr != base:  # the kernels address host rows by their host pointer
            raise RuntimeError(f"pool {name!r}: the device address of pinned host memory "
                               f"({device_ptr:#x}) differs from its host address ({base:#x}); "
                               f"this system does not support unified addressing of "
                               f"registered memory")
        self.chunks[name] = base + np.asarray(starts, dtype=np.int64)

    @staticmethod
    def _unpin(pinned: list[int], owner_pid: int) -> None:
        if pinned and os.getpid() == owner_pid:  # never a CUDA call in a forked child
            from host_pools import cuda_host

            for ptr in pinned:
                cuda_host.unregister(ptr)
        pinned.clear()

    def release(self) -> None:
        """Unpin and drop every buffer of this reservation (idempotent)."""
        HostReservation._unpin(self._pinned, self._owner_pid)
        self.buffers.clear()
        self.chunks.clear()
