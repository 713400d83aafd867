"""The runtime-level calls of a transfer, in one small module: stream handles, index
uploads, kernel launches and event records.

The load path makes every call of its call budget through a function of this module,
looked up at call time (``runtime.launch(...)``, never ``from runtime import launch``), so
a test can replace each one with a counter and check the budget of a load on any machine
(``tests/hicache/test_call_budget.py``): per load at most one index upload, per launch
group at most one launch and one event record, and no ``torch.cuda`` Python call per
launch. The CPU path makes the same calls (a record of ``None`` does nothing), so the
count a CPU test takes is the count the CUDA path makes.

    stream_handle(device)      the current stream's raw ``cudaStream_t`` (once per load;
                               no lookup while ``bind_stream`` declares it)
    upload(parts, device)      int64 parts -> one tensor on ``device`` (one copy)
    launch(launcher, group)    one pre-bound kernel launch of a prepared plan
    record(event, stream)      one event record on an explicit stream (no stream lookup)
    DmaQueue                   a staging ring's DMA calls, event records and stream waits
                               (cudart), counted
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np
import torch

from transfer_kernels.cuda import cudart

__all__ = ["DmaQueue", "INTERPRETER", "bind_stream", "device_is_current", "launch", "record", "stream_handle", "upload"]


_local = threading.local()  # .bound: (device index, stream handle) made current by bind_stream
# The Triton interpreter (CPU plans) patches ``triton.language`` process-wide while it runs a
# kernel: two at once in two threads break each other. One interpreted launch at a time.
INTERPRETER = threading.Lock()


def bind_stream(bound: tuple[int, int] | None) -> tuple[int, int] | None:
    """Declare ``(device index, handle)`` this thread's current stream, whose device is
    the current device (``None``: nothing declared); returns the previous declaration.

    The controller's ``OnStream`` declares its copy stream while it is current, so
    :func:`stream_handle` and :func:`device_is_current` answer without asking torch.
    """
    previous = getattr(_local, "bound", None)
    _local.bound = bound
    return previous


def stream_handle(device: torch.device) -> int:
    """The raw handle of ``device``'s current stream (0 on the CPU): resolved once per
    prepared load, then passed to every launch; the declared one when there is one."""
    if device.type != "cuda":
        return 0
    bound = getattr(_local, "bound", None)
    if bound is not None and bound[0] == device.index:
        return bound[1]
    return torch.cuda.current_stream(device).cuda_stream


def device_is_current(device: torch.device) -> bool:
    """True when ``device`` is the current CUDA device (a kernel loaded there may be
    launched directly)."""
    bound = getattr(_local, "bound", None)
    if bound is not None and bound[0] == device.index:
        return True
    return torch.cuda.current_device() == device.index


def upload(parts: list[torch.Tensor], device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
    """Concatenate int64 CPU/device parts into one tensor on ``device`` with one copy on
    the current stream (the launches that read it follow on the same stream); into
    ``out`` (a buffer on ``device`` of their total length, kept by the caller) when given."""
    if device.type == "cpu":
        return torch.cat(parts) if out is None else torch.cat(parts, out=out)
    if all(p.device.type == "cpu" for p in parts):
        staged = torch.empty(sum(p.numel() for p in parts), dtype=torch.int64, pin_memory=True)
        torch.cat(parts, out=staged)
        if out is None:
            return staged.to(device, non_blocking=True)
        return out.copy_(staged, non_blocking=True)
    if out is None:
        return torch.cat([p.to(device, non_blocking=True) for p in parts])
    return torch.cat([p.to(device, non_blocking=True) for p in parts], out=out)


def launch(launcher: Any, group: int) -> None:
    """Launch group ``group`` of a pre-bound launcher (``copy_kernel.BoundLaunches``)."""
    launcher.launch(group)


def record(event: Any, stream: Any) -> None:
    """Record ``event`` on ``stream`` (a ``torch.cuda.Stream``; ``None``: the current
    stream); nothing when ``event`` is ``None`` (the CPU)."""
    if event is None:
        return
    if stream is None:
        event.record()
    else:
        event.record(stream)


class DmaQueue:
    """One staging ring's DMA calls and event ordering, counted (on the CPU too: what the
    CUDA path issues) by its holder alone. ``batch``: ``cudaMemcpyBatchAsync`` (``None``:
    when the runtime has it); ``copies`` / ``pieces`` / ``records`` / ``waits``: the counts."""

    def __init__(self, batch: bool | None = None) -> None:
        self.batch = batch
        self.copies = self.pieces = self.records = self.waits = 0

    def issue(self, ring: Any, pieces: np.ndarray, caller: int) -> None:
        """DMA ``pieces`` (``[3, n]`` dst, src, bytes) on ``ring``'s stream, then its done
        event, which the ``caller`` stream waits for. CUDA: one ``cudaMemcpyBatchAsync``
        (>= 12.8; the uint64 slice in place), else a ``cudaMemcpyAsync`` per piece; the
        CPU: a memmove per piece (live tensors' addresses), the events counted only."""
        self.pieces += pieces.shape[1]
        self.records += 1
        self.waits += 1
        if not ring.cuda:
            for d, s, n in pieces.T.tolist():
                ctypes.memmove(d, s, n)
            self.copies += 1
            return
        if cudart.batch_available() if self.batch is None else self.batch:
            cudart.memcpy_batch_rows(pieces, ring.stream)
            self.copies += 1
        else:
            for d, s, n in pieces.T.tolist():
                cudart.memcpy_async(d, s, n, ring.stream)
            self.copies += pieces.shape[1]
        cudart.event_record(ring.events[1], ring.stream)
        cudart.stream_wait_event(caller, ring.events[1])

    def record(self, ring: Any, event: int, stream: int) -> None:
        """Record ``event`` on ``stream`` (CUDA; counted everywhere)."""
        if ring.cuda:
            cudart.event_record(event, stream)
        self.records += 1

    def wait(self, ring: Any, stream: int, event: int) -> None:
        """Make ``stream`` wait for ``event`` (CUDA; counted everywhere)."""
        if ring.cuda:
            cudart.stream_wait_event(stream, event)
        self.waits += 1
