"""The ``"dma"`` backend's staging rings and DMA calls: one ring per (device, direction),
allocated once and reused by every load, its DMA stream and events; `DmaQueue` issues a
launch group's pieces and the cross-stream ordering (CUDA runtime calls, or a CPU
stand-in that does the same steps in program order) and counts them.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from transfer_kernels.cuda import cudart, runtime


class Ring:
    """A staging ring of one direction on one device: ``nbytes`` allocated once (first
    use) and reused by every load; on CUDA, its DMA stream and two events.

    Attributes:
        owner: the prepared plan that started last (the only one that may launch).
        last_stream: the stream that last read or wrote the ring besides the DMA stream.
    """

    def __init__(self, device: torch.device, direction: str, nbytes: int) -> None:
        self.device, self.direction, self.nbytes = device, direction, nbytes
        self.cuda = device.type == "cuda"
        self._buffer: torch.Tensor | None = None
        self.owner: object | None = None
        self.last_stream: int | None = None
        self.stream = 0  # the DMA stream's handle (0 on CPU)
        self.events: tuple[int, int] = (0, 0)  # (mark, done); ids on CPU
        self._keep: list = []

    def buffer(self) -> torch.Tensor:
        """The ring's bytes (allocated, with the CUDA stream and events, on first call)."""
        if self._buffer is None:
            self._buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):
                    stream = torch.cuda.Stream(self.device)
                    self.events = (cudart.event_create(), cudart.event_create())
                # the allocator must not hand the bytes out while the DMA stream uses them
                self._buffer.record_stream(stream)
                self.stream, self._keep = stream.cuda_stream, [stream]
            else:
                self.events = (1, 2)
        return self._buffer

    @property
    def allocated(self) -> bool:
        """True once :meth:`buffer` has allocated the ring's bytes."""
        return self._buffer is not None

    def base(self) -> int:
        """Address of the ring's first byte."""
        return self.buffer().data_ptr()

    def current(self) -> int:
        """The caller's current stream (0 on CPU), through ``runtime.stream_handle``: the
        controller's declared copy stream answers without asking torch."""
        return runtime.stream_handle(self.device)


def dma(pieces: np.ndarray, stream: int, device: torch.device, batch: bool | None) -> int:
    """Copy ``pieces`` ``[3, n]`` (dst, src, bytes) on ``stream``; the runtime calls made.

    One ``cudaMemcpyBatchAsync`` on CUDA >= 12.8 (``batch`` None or True; a uint64 slice
    of a load's pieces goes to the runtime in place), else one ``cudaMemcpyAsync`` per
    piece; on the CPU, a memmove per piece (addresses of live tensors the staged backend
    holds)."""
    if device.type != "cuda":
        for d, s, n in pieces.T.tolist():
            ctypes.memmove(d, s, n)
        return 1
    if cudart.batch_available() if batch is None else batch:
        cudart.memcpy_batch_rows(pieces, stream)
        return 1
    for d, s, n in pieces.T.tolist():
        cudart.memcpy_async(d, s, n, stream)
    return pieces.shape[1]


class DmaQueue:
    """The DMA calls and cross-stream ordering of one ``"dma"`` backend, counted (on the
    CPU too: what the CUDA path would issue).

    Attributes:
        batch: use ``cudaMemcpyBatchAsync``; ``None`` means when the runtime has it.
        copies / pieces: DMA calls issued and pieces they moved.
        records / waits: event records and stream waits issued.
    """

    def __init__(self, batch: bool | None = None) -> None:
        self.batch = batch
        self.copies = self.pieces = self.records = self.waits = 0

    def issue(self, ring: Ring, pieces: np.ndarray, caller: int) -> None:
        """DMA ``pieces`` (``[3, n]`` dst, src, bytes) on ``ring``'s stream, record its done
        event there and make the ``caller`` stream wait for it (one launch group's DMA)."""
        self.copies += dma(pieces, ring.stream, ring.device, self.batch)
        self.pieces += pieces.shape[1]
        if ring.cuda:
            cudart.event_record(ring.events[1], ring.stream)
            cudart.stream_wait_event(caller, ring.events[1])
        self.records += 1
        self.waits += 1

    def record(self, ring: Ring, event: int, stream: int) -> None:
        """Record ``event`` on ``stream`` (CUDA; counted everywhere)."""
        if ring.cuda:
            cudart.event_record(event, stream)
        self.records += 1

    def wait(self, ring: Ring, stream: int, event: int) -> None:
        """Make ``stream`` wait for ``event`` (CUDA; counted everywhere)."""
        if ring.cuda:
            cudart.stream_wait_event(stream, event)
        self.waits += 1
