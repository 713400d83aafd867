"""Host pools: `HostPool` (one uint8 tensor per pool) and the data-less `LogicalHostPool`.

Host layouts of a pool with L layers, R rows and ``row_bytes`` B (buffers concatenated
in spec order, scales after their data):

    page_first  [R, L, B]   row r of all layers is one contiguous span (one object per
                            page for a later storage tier)
    layer_first [L, R, B]   layer l of all rows is one contiguous span

    one row:  | k ........ | k_scale | v ........ | v_scale |
              0            off[1]    off[2]       off[3]    B
"""
from __future__ import annotations

import torch

from host_pools.allocator import PageAllocator
from host_pools.own_slots import OwnSlots
from host_pools.spec import PoolKind, PoolSpec

LAYOUTS = ("page_first", "layer_first")


class LogicalHostPool:
    """The data-less anchor (DeepSeek-V4): page-aligned host token slots, no tensor.

    ``alloc`` / ``free`` / ``available`` are its allocator's, through its `OwnSlots` part.

    Args:
        num_tokens: host token slots; a positive multiple of ``page_size``.
        page_size: anchor tokens per page.
        name: the anchor pool's name.
    """

    buffer = None
    layout = "none"

    def __init__(self, num_tokens: int, page_size: int, name: str = "kv") -> None:
        self.spec, self.name = PoolSpec(name, PoolKind.ANCHOR, 0, (), tokens_per_row=1), name
        self.allocator = PageAllocator(num_tokens, page_size)
        self.slots = OwnSlots(self.spec, self.allocator)
        self.alloc, self.free, self.available = self.slots.alloc, self.slots.free, self.slots.available
        self.rows_of = self.spec.rows_of
        self.num_tokens = int(num_tokens)
        self.num_rows = self.num_tokens

    @property
    def nbytes(self) -> int:
        return 0


class HostPool:
    """Host mirror of one device pool: one uint8 tensor, optionally with its own allocator.

    ``alloc`` / ``free`` / ``available`` are its `OwnSlots` part's (``slots``): the
    allocator's own calls, or a refusal for a sidecar.

    Args:
        spec: the pool's spec (must hold data).
        num_rows: rows of host capacity.
        layout: ``"page_first"`` (default) or ``"layer_first"``.
        storage: a 1-D uint8 tensor of exactly the pool's bytes (from a
            `HostReservation`); ``None`` allocates plain memory (tests, tools).
        page_size: allocator page in token slots for own-indexed pools (default: one row).
    Raises:
        ValueError: bad layout, row count, storage size, or a data-less spec.
    """

    def __init__(self, spec: PoolSpec, num_rows: int, layout: str = "page_first",
                 storage: torch.Tensor | None = None, page_size: int | None = None) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout: must be one of {LAYOUTS}, got {layout!r}")
        if not spec.has_data:
            raise ValueError(f"spec: pool {spec.name!r} holds no data; use LogicalHostPool")
        if num_rows < 0:
            raise ValueError(f"num_rows: must be >= 0, got {num_rows}")
        self.spec, self.num_rows, self.layout = spec, int(num_rows), layout
        self.num_tokens = self.num_rows * spec.tokens_per_row
        shape = self.shape_for(spec, self.num_rows, layout)
        nbytes = shape[0] * shape[1] * shape[2]
        if storage is None:
            storage = torch.empty(nbytes, dtype=torch.uint8)
        if storage.dtype != torch.uint8 or storage.numel() != nbytes:
            raise ValueError(f"storage: need {nbytes} uint8 bytes for pool {spec.name!r}, "
                             f"got {storage.numel()} {storage.dtype}")
        self.buffer = storage.view(shape)
        self.allocator: PageAllocator | None = None
        if spec.indices_from is None:
            ps = spec.tokens_per_row if page_size is None else page_size
            self.allocator = PageAllocator(self.num_tokens, ps)
        self.name, self.slots = spec.name, OwnSlots(spec, self.allocator)
        self.alloc, self.free, self.available = self.slots.alloc, self.slots.free, self.slots.available
        self.rows_of = spec.rows_of
        self._views: list[list[torch.Tensor]] | None = None

    @staticmethod
    def shape_for(spec: PoolSpec, num_rows: int, layout: str) -> tuple[int, int, int]:
        if layout == "page_first":
            return (num_rows, spec.num_layers, spec.row_bytes)
        return (spec.num_layers, num_rows, spec.row_bytes)

    @staticmethod
    def row_stride_for(spec: PoolSpec, layout: str) -> int:
        """Bytes between consecutive rows of one buffer in ``layout``."""
        return spec.num_layers * spec.row_bytes if layout == "page_first" else spec.row_bytes

    @staticmethod
    def bytes_for(spec: PoolSpec, num_rows: int) -> int:
        return num_rows * spec.num_layers * spec.row_bytes

    @property
    def nbytes(self) -> int:
        return self.buffer.numel()

    def row_views(self) -> list[list[torch.Tensor]]:
        """``views[layer][buffer]``: 2-D uint8 ``[num_rows, buffer_bytes]`` strided views."""
        if self._views is None:
            offs = self.spec.buffer_offsets()
            views = []
            for layer in range(self.spec.num_layers):
                lay = self.buffer[:, layer] if self.layout == "page_first" else self.buffer[layer]
                views.append([lay[:, o:o + b.row_bytes] for o, b in zip(offs, self.spec.buffers)])
            self._views = views
        return self._views

    def read_rows(self, rows: torch.Tensor, layer: int, role: str) -> torch.Tensor:
        """Copy of the bytes of ``rows`` for one layer and buffer (tests and checks)."""
        idx = [b.role for b in self.spec.buffers].index(role)
        return self.row_views()[layer][idx].index_select(0, rows.to(torch.int64)).clone()
