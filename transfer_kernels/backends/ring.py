"""The ``"dma"`` backend's staging rings: one per (device, direction) of a backend,
allocated once (when the first layout is built in it) and reused by every load; on CUDA,
its DMA stream and three events. A load holds the ring from its first launch to its last
(`launches.take`); the ring keeps who holds it and where it was last freed."""
from __future__ import annotations

import threading
import weakref

import torch

from transfer_kernels.cuda.runtime import DmaQueue
from transfer_kernels.cuda import cudart


class Ring:
    """A staging ring of one direction on one device: ``nbytes`` allocated once (first
    use) and reused by every load; on CUDA, its DMA stream and events.

    Attributes:
        dma: its DMA calls and their counts (`launches.DmaQueue`), used by its holder.
        cond: guards ``holder``; a load waits on it for another thread's load to end.
        holder: the `launches.Claim` of the load that holds the ring, or ``None``.
        freed_on: the stream its last holder recorded the ``free`` event on (``None``: never).
        events: (mark, done, free) event handles (ids on the CPU).
    """

    def __init__(self, device: torch.device, direction: str, nbytes: int, batch: bool | None = None) -> None:
        self.device, self.direction, self.nbytes = device, direction, nbytes
        self.cuda = device.type == "cuda"
        self.dma = DmaQueue(batch)
        # re-entrant: a dropped load's finalizer may give the ring back from inside this
        # thread's own take (a collection can run at any allocation)
        self.cond = threading.Condition(threading.RLock())
        self.holder = None
        self.freed_on: int | None = None
        self._buffer: torch.Tensor | None = None
        self.stream = 0  # the DMA stream's handle (0 on CPU)
        self.events: tuple[int, int, int] = (0, 0, 0)
        self._keep: list = []

    def buffer(self) -> torch.Tensor:
        """The ring's bytes (allocated, with the CUDA stream and events, on first call;
        called while laying out, under the backend's lock)."""
        if self._buffer is None:
            buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):
                    stream = torch.cuda.Stream(self.device)
                    self.events = (cudart.event_create(), cudart.event_create(), cudart.event_create())
                weakref.finalize(self, _destroy, self.events)
                # the allocator must not hand the bytes out while the DMA stream uses them
                buffer.record_stream(stream)
                self.stream, self._keep = stream.cuda_stream, [stream]
            else:
                self.events = (1, 2, 3)
            self._buffer = buffer
        return self._buffer

    @property
    def allocated(self) -> bool:
        """True once :meth:`buffer` has allocated the ring's bytes."""
        return self._buffer is not None

    def base(self) -> int:
        """Address of the ring's first byte."""
        return self.buffer().data_ptr()


def _destroy(events: tuple[int, ...]) -> None:
    """The ring's events, once it is gone (pending work on them finishes first: CUDA
    releases a recorded event's resources when it completes)."""
    for event in events:
        cudart.event_destroy(event)
