"""The ``"dma"`` backend's staging rings: one per (device, direction), allocated once (when
the first layout is built in it) and reused by every load; on CUDA, its DMA stream and
two events. A load reads their attributes only (`dma`)."""
from __future__ import annotations

import torch

from transfer_kernels.cuda import cudart


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
