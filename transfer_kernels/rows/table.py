"""Row tables: one side of a transfer as per-(layer, buffer) base addresses and row strides.

A *row table* describes every buffer of one pool on one side (host or device) as a 2-D
``uint8`` view ``[num_rows, row_bytes[b]]`` per layer, so host ``page_first``, host
``layer_first`` and per-layer device tensors are the same shape of problem::

    views[layer][buffer]          base address       row stride (bytes)   row bytes
    page_first  [R, L, RB]        buf[0, l, off_b]   L * RB               n_b
    layer_first [L, R, RB]        buf[l, 0, off_b]   RB                   n_b
    device t[l][b] [R, *shape]    t[l][b][0]         t.stride(0) * item   prod(shape) * item

Within one table every layer has the same buffers: the same ``row_bytes[b]`` and
``row_strides[b]`` for every layer, one ``num_rows`` and one device. Only the base
addresses differ per layer; they live in ``ptrs`` (an int64 CPU tensor).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

import numpy as np
import torch

from transfer_kernels.quant.codec import Int8Codec

T = TypeVar("T")
# Widest vector access the Triton kernel issues (bytes); also the cap of ``align``.
MAX_VECTOR_BYTES = 16


def as_row_bytes(t: torch.Tensor) -> torch.Tensor:
    """View a ``[num_rows, *row_shape]`` tensor of any dtype as ``uint8 [num_rows, row_bytes]``.

    The result aliases ``t`` (writes land in ``t``); fp8, bool and other 1-byte dtypes work.

    Args:
        t: at least 1-D; each row (all dims after the first) must be contiguous in itself.
            The row stride (dim 0) is arbitrary.

    Returns:
        A 2-D ``uint8`` view of ``t``.

    Raises:
        ValueError: ``t`` is 0-D or its rows are not contiguous (no view is possible).
    """
    if t.dim() == 0:
        raise ValueError(f"t: must have a row dimension, got a 0-D tensor of {t.dtype}")
    num_rows = t.shape[0]
    try:
        rows = t.view(num_rows, math.prod(t.shape[1:]))
        if rows.dtype != torch.uint8:
            # A 1-byte dtype keeps its shape; wider dtypes widen the last dim.
            rows = rows.view(torch.uint8)
    except RuntimeError as exc:
        raise ValueError(
            f"t: each row must be contiguous to view it as bytes, got shape "
            f"{tuple(t.shape)} stride {t.stride()} ({exc})") from exc
    return rows


def _check_view(v: torch.Tensor, where: str) -> None:
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{where}: must be a torch.Tensor, got {type(v).__name__}")
    if v.dtype != torch.uint8 or v.dim() != 2:
        raise ValueError(f"{where}: must be a 2-D uint8 tensor, got {v.dim()}-D {v.dtype}")
    if v.shape[1] == 0:
        raise ValueError(f"{where}: rows must hold at least 1 byte, got shape {tuple(v.shape)}")
    if v.shape[1] > 1 and v.stride(1) != 1:
        raise ValueError(f"{where}: last-dim stride must be 1, got {v.stride(1)}")


def _row_stride(v: torch.Tensor) -> int:
    # A single-row view's stride is meaningless; report a dense stride for it.
    return v.stride(0) if v.shape[0] > 1 else v.shape[1]


@dataclass(frozen=True, eq=False)
class RowTable:
    """One side of a transfer: per-(layer, buffer) byte views of one pool.

    Immutable after construction except for a cache of derived values (:meth:`derived`:
    the page span, the kernel's per-buffer side table; filled on first use, never changed
    after). Thread-safe for concurrent reads; a first call should not race (it would build
    twice).

    Attributes:
        name: label used in error messages (``"kv.host"``, ``"swa.device"``).
        num_layers: layers of this table (>= 1).
        num_buffers: buffers per layer (>= 1).
        num_rows: rows of every view.
        row_bytes: bytes of one row, per buffer.
        row_strides: bytes between consecutive rows, per buffer.
        ptrs: int64 CPU tensor ``[num_layers, num_buffers]`` of view base addresses.
        align: int64 CPU tensor ``[num_layers, num_buffers]``: the largest power of two
            (<= 16) dividing the base address, the row stride and the row bytes.
        device: where the views live.
        views: the views themselves (kept alive here; a table `over` one buffer makes
            them on first use).
        chunk_starts: sorted start addresses of the pinned registrations behind a host
            table (``None`` when unknown or not pinned in chunks); a copy engine must not
            issue one copy across a chunk start.
        codec: ``None`` (rows are plain bytes), or the `Int8Codec` whose int8 host format
            these rows hold (a job from or to an uncoded table converts; `codec`).
    """

    name: str
    num_layers: int
    num_buffers: int
    num_rows: int
    row_bytes: tuple[int, ...]
    row_strides: tuple[int, ...]
    ptrs: torch.Tensor
    align: torch.Tensor
    device: torch.device
    _views: tuple[tuple[torch.Tensor, ...], ...] | None = field(repr=False)
    chunk_starts: np.ndarray | None = field(default=None, repr=False)
    codec: Int8Codec | None = None
    _cache: dict = field(default_factory=dict, repr=False)
    _buffer: tuple[torch.Tensor, int] | None = field(default=None, repr=False)  # `over`'s buffer and row stride

    @property
    def views(self) -> tuple[tuple[torch.Tensor, ...], ...]:
        """``views[layer][buffer]``: 2-D uint8 ``[num_rows, row_bytes[b]]`` byte views."""
        if self._views is not None:
            return self._views
        return self.derived("views", _buffer_views)

    @classmethod
    def from_views(cls, views: Sequence[Sequence[torch.Tensor]], name: str,
                   chunk_starts: Sequence[int] | np.ndarray | None = None,
                   codec: Int8Codec | None = None) -> RowTable:
        """Build a table from ``views[layer][buffer]``, each a 2-D uint8 ``[num_rows, n_b]``.

        Args:
            views: per layer, per buffer byte views (see the module docstring).
            name: label for error messages.
            chunk_starts: start addresses of the pinned registrations behind the views.
            codec: the int8 host format the views hold (their row bytes must be its
                ``host_row_bytes``), or ``None``.

        Returns:
            A new table; the views are kept alive by it.

        Raises:
            ValueError: no layers or buffers, or layers disagree on buffer count, row
                bytes, row stride, row count or device; a view is not 2-D uint8 with
                last-dim stride 1; row bytes that are not ``codec``'s host rows.
            TypeError: a view is not a tensor.
        """
        layers = tuple(tuple(layer) for layer in views)
        if not layers or not layers[0]:
            raise ValueError(f"views: {name} needs >= 1 layer and >= 1 buffer, got {len(layers)}"
                             f" layers of {len(layers[0]) if layers else 0} buffers")
        first = layers[0]
        for l, layer in enumerate(layers):
            if len(layer) != len(first):
                raise ValueError(f"views[{l}]: {name} layer has {len(layer)} buffers, "
                                 f"layer 0 has {len(first)}")
            for b, v in enumerate(layer):
                _check_view(v, f"views[{l}][{b}]")
                _check_same_geometry(v, first[b], f"views[{l}][{b}]", name)
        row_bytes = tuple(v.shape[1] for v in first)
        if codec is not None and codec.host_row_bytes != row_bytes:
            raise ValueError(f"codec: {name} rows of {row_bytes} bytes per buffer are not the int8 host "
                             f"rows {codec.host_row_bytes} of {codec}")
        row_strides = tuple(_row_stride(v) for v in first)
        ptrs = torch.tensor([[v.data_ptr() for v in layer] for layer in layers], dtype=torch.int64)
        return cls(name=name, num_layers=len(layers), num_buffers=len(first),
                   num_rows=first[0].shape[0], row_bytes=row_bytes, row_strides=row_strides,
                   ptrs=ptrs, align=_alignment(ptrs, row_strides, row_bytes),
                   device=first[0].device, _views=layers,
                   chunk_starts=None if chunk_starts is None
                   else np.sort(np.asarray(chunk_starts, dtype=np.int64)), codec=codec)

    @classmethod
    def over(cls, buffer: torch.Tensor, offsets: np.ndarray, num_rows: int, row_stride: int,
             row_bytes: tuple[int, ...], name: str, codec: Int8Codec | None = None) -> RowTable:
        """A table of views into one byte ``buffer`` without making them: layer ``l``'s
        buffer ``b`` starts at byte ``offsets[l, b]``, its ``num_rows`` rows of
        ``row_bytes[b]`` bytes ``row_stride`` apart. The same table as `from_views` of
        those views (every field; the views are made on first use of ``views``), at the
        cost of a few array operations instead of a view per (layer, buffer).

        Args:
            buffer: a 1-D uint8 contiguous tensor (kept alive by the table).
            offsets: int64 ``[num_layers, num_buffers]``.
            num_rows: >= 1.
        Raises:
            ValueError: a view outside ``buffer``, or rows that are not ``codec``'s host rows.
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        nl, nb = offsets.shape
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
            raise ValueError(f"buffer: {name} needs a 1-D contiguous uint8 tensor, got {buffer.dim()}-D "
                             f"{buffer.dtype}")
        if not nl or not nb or nb != len(row_bytes) or min(row_bytes) < 1 or num_rows < 1:
            raise ValueError(f"offsets: {name} needs [layers >= 1, {len(row_bytes)} buffers], >= 1 row and rows of "
                             f">= 1 byte, got shape {offsets.shape}, row bytes {row_bytes}, {num_rows} rows")
        ends = offsets + (num_rows - 1) * row_stride + np.asarray(row_bytes, dtype=np.int64)
        if offsets.min() < 0 or ends.max() > buffer.numel():
            raise ValueError(f"offsets: {name} views reach byte {int(ends.max())} of a {buffer.numel()}-byte buffer")
        if codec is not None and codec.host_row_bytes != tuple(row_bytes):
            raise ValueError(f"codec: {name} rows of {tuple(row_bytes)} bytes per buffer are not the int8 host "
                             f"rows {codec.host_row_bytes} of {codec}")
        # as `_row_stride` reads a single-row view: a dense stride
        row_strides = tuple(row_bytes) if num_rows <= 1 else (row_stride,) * nb
        ptrs = torch.from_numpy(offsets + buffer.data_ptr())
        return cls(name=name, num_layers=nl, num_buffers=nb, num_rows=num_rows, row_bytes=tuple(row_bytes),
                   row_strides=row_strides, ptrs=ptrs, align=_alignment(ptrs, row_strides, tuple(row_bytes)),
                   device=buffer.device, _views=None, codec=codec, _buffer=(buffer, row_stride))

    @property
    def signature(self) -> tuple[int, ...]:
        """The buffer layout (row bytes per buffer); two sides of a copy must match."""
        return self.row_bytes

    @property
    def decoded_signature(self) -> tuple[int, ...]:
        """The row bytes of the rows this table stands for (its codec's device rows, else
        its own): the two sides of a converting job agree on it."""
        return self.row_bytes if self.codec is None else self.codec.device_row_bytes

    @property
    def is_pinned(self) -> bool:
        """True when every view is CPU page-locked memory (device-addressable through UVA)."""
        if self.device.type != "cpu":
            return False
        return self.derived("pinned", lambda t: all(v.is_pinned() for layer in t.views for v in layer))

    def derived(self, key: str, build: Callable[[RowTable], T]) -> T:
        """A value computed from this (immutable) table once and kept: ``build(self)`` on
        the first call per ``key``, the same object afterwards.

        Args:
            key: names the value (one meaning per key across the package).
            build: computes it from the table alone.

        Returns:
            The cached value.
        """
        try:
            return self._cache[key]
        except KeyError:
            value = self._cache[key] = build(self)
            return value

    def page_span(self) -> tuple[torch.Tensor, int] | None:
        """The whole-page view of a ``page_first`` table, or ``None``.

        When every layer and buffer of a row lie back to back (layer-major, buffers in
        order) and rows follow each other, row ``r`` of all layers is one contiguous span:
        the DMA path copies it as one piece.

        Returns:
            ``(rows, span)``: a ``[num_rows, span]`` uint8 view of the memory behind the
            table (span = layers x row bytes) and ``span``; ``None`` for any other layout,
            or views over more than one storage. Cached.
        """
        return self.derived("page_span", _page_span)


def _buffer_views(table: RowTable) -> tuple[tuple[torch.Tensor, ...], ...]:
    """The views of a table made `over` a buffer (what `from_views` would have kept)."""
    buf, stride = table._buffer
    offsets = (table.ptrs.numpy() - buf.data_ptr()).tolist()
    return tuple(tuple(buf.as_strided((table.num_rows, n), (stride, 1), off)
                       for off, n in zip(layer, table.row_bytes)) for layer in offsets)


def _page_span(table: RowTable) -> tuple[torch.Tensor, int] | None:
    row = sum(table.row_bytes)
    span = row * table.num_layers
    offsets = np.cumsum((0,) + table.row_bytes[:-1])
    want = np.arange(table.num_layers)[:, None] * row + offsets[None, :]
    first = table.views[0][0]
    if table.num_rows > 1 and any(s != span for s in table.row_strides):
        return None
    if not np.array_equal(table.ptrs.numpy() - int(table.ptrs[0, 0]), want):
        return None
    storage = first.untyped_storage()
    if any(v.untyped_storage().data_ptr() != storage.data_ptr() for layer in table.views for v in layer):
        return None
    if first.storage_offset() + table.num_rows * span > storage.nbytes():
        return None
    return first.as_strided((table.num_rows, span), (span, 1)), span


def _check_same_geometry(v: torch.Tensor, ref: torch.Tensor, where: str, name: str) -> None:
    if v.shape[1] != ref.shape[1]:
        raise ValueError(f"{where}: {name} row bytes {v.shape[1]} differ from layer 0's "
                         f"{ref.shape[1]}")
    if v.shape[0] != ref.shape[0]:
        raise ValueError(f"{where}: {name} has {v.shape[0]} rows, layer 0 has {ref.shape[0]}")
    if _row_stride(v) != _row_stride(ref):
        raise ValueError(f"{where}: {name} row stride {_row_stride(v)} differs from layer 0's "
                         f"{_row_stride(ref)}")
    if v.device != ref.device:
        raise ValueError(f"{where}: {name} is on {v.device}, layer 0 on {ref.device}")


def _alignment(ptrs: torch.Tensor, row_strides: tuple[int, ...],
               row_bytes: tuple[int, ...]) -> torch.Tensor:
    """Largest power of two <= MAX_VECTOR_BYTES dividing address, stride and row bytes."""
    per_buffer = [math.gcd(s, n, MAX_VECTOR_BYTES) for s, n in zip(row_strides, row_bytes)]
    g = torch.gcd(ptrs, torch.tensor(per_buffer, dtype=torch.int64).expand_as(ptrs))
    # gcd with 16 is already a power of two (a divisor of 16).
    return g
