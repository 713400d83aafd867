"""`DevicePool`: the device side of one pool, as per-layer tensors ``tensors[layer][buffer]``.

Each tensor is ``[num_rows, *row_shape]`` in the buffer's dtype. A server adopts its
existing cache tensors with ``from_tensors``; tests and benchmarks use ``allocate``.
Own-indexed pools (the anchor, ``swa``) carry a device-side slot allocator.
"""
from __future__ import annotations

from typing import Sequence

import torch

from host_pools.allocator import PageAllocator
from host_pools.own_slots import OwnSlots
from host_pools.spec import PoolSpec


class DevicePool:
    """Device buffers of one pool plus, when own-indexed, its slot allocator.

    ``alloc`` / ``free`` / ``available`` (API) are its `OwnSlots` part's (``slots``): the
    allocator's own calls, or a refusal naming the source for a sidecar.

    Args:
        spec: the pool.
        tensors: ``tensors[layer][buffer]``, validated by the factories.
        num_rows: rows of capacity (token slots for a data-less anchor).
        device: where the tensors live.
        page_size: allocator page in token slots (default: one row); ignored for sidecars.
    """

    def __init__(self, spec: PoolSpec, tensors: list[list[torch.Tensor]], num_rows: int,
                 device: torch.device, page_size: int | None = None) -> None:
        self.spec, self.tensors, self.num_rows = spec, tensors, int(num_rows)
        self.device = torch.device(device)
        self.num_tokens = self.num_rows * spec.tokens_per_row
        self.allocator: PageAllocator | None = None
        if spec.indices_from is None:
            self.allocator = PageAllocator(self.num_tokens, page_size or spec.tokens_per_row)
        self.name, self.slots = spec.name, OwnSlots(spec, self.allocator)
        self.alloc, self.free, self.available = self.slots.alloc, self.slots.free, self.slots.available
        self.rows_of = spec.rows_of
        self._views: list[list[torch.Tensor]] | None = None
        self._table = None

    @classmethod
    def allocate(cls, spec: PoolSpec, num_rows: int, device: str | torch.device = "cpu",
                 page_size: int | None = None) -> "DevicePool":
        """Fresh (uninitialised) device buffers for ``num_rows`` rows of every layer."""
        if num_rows < 0:
            raise ValueError(f"num_rows: must be >= 0, got {num_rows}")
        dev = torch.device(device)
        tensors = [[torch.empty((num_rows, *b.row_shape), dtype=b.dtype, device=dev) for b in spec.buffers]
                   for _ in range(spec.num_layers)]
        return cls(spec, tensors, num_rows, dev, page_size)

    @classmethod
    def from_tensors(cls, spec: PoolSpec, tensors: Sequence[Sequence[torch.Tensor]],
                     page_size: int | None = None) -> "DevicePool":
        """Adopt a server's per-layer tensors (no copy).

        Raises:
            ValueError: wrong layer or buffer count, shape, dtype, device, or a
                non-contiguous tensor (the message names layer and buffer).
        """
        if len(tensors) != spec.num_layers:
            raise ValueError(f"tensors: pool {spec.name!r} has {spec.num_layers} layers, got {len(tensors)}")
        if not spec.has_data:
            raise ValueError(f"spec: pool {spec.name!r} holds no data; build it with DevicePool.logical")
        for layer, bufs in enumerate(tensors):
            if len(bufs) != len(spec.buffers):
                raise ValueError(f"tensors[{layer}]: pool {spec.name!r} has buffers "
                                 f"{[b.role for b in spec.buffers]}, got {len(bufs)} tensors")
        num_rows, device = tensors[0][0].shape[0], tensors[0][0].device
        for layer, bufs in enumerate(tensors):
            for b, t in zip(spec.buffers, bufs):
                _check_tensor(f"tensors[{layer}][{b.role!r}]", t, (num_rows, *b.row_shape), b.dtype, device)
        return cls(spec, [list(b) for b in tensors], num_rows, device, page_size)

    @classmethod
    def logical(cls, spec: PoolSpec, num_tokens: int, device: str | torch.device = "cpu",
                page_size: int = 1) -> "DevicePool":
        """A data-less anchor: an allocator over ``num_tokens`` device token slots."""
        return cls(spec, [], num_tokens, torch.device(device), page_size)

    @property
    def nbytes(self) -> int:
        return self.num_rows * self.spec.num_layers * self.spec.row_bytes

    def row_views(self) -> list[list[torch.Tensor]]:
        """``views[layer][buffer]``: ``[num_rows, buffer_bytes]`` uint8 views of the tensors."""
        if self._views is None:
            self._views = [[as_row_bytes(t) for t in bufs] for bufs in self.tensors]
        return self._views

    def row_table(self):
        """The cached `transfer_kernels.RowTable` of this pool (built on first use)."""
        if self._table is None:
            from transfer_kernels import RowTable
            self._table = RowTable.from_views(self.row_views(), name=self.name)
        return self._table


def as_row_bytes(t: torch.Tensor) -> torch.Tensor:
    """``[R, *shape]`` tensor of any dtype as a ``[R, row_bytes]`` uint8 view (no copy)."""
    flat = t.reshape(t.shape[0], -1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def _check_tensor(what: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                  device: torch.device) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{what}: shape must be {shape}, got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{what}: dtype must be {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{what}: device must be {device} (as layer 0), got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{what}: must be contiguous")
