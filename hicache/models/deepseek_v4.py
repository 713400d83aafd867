"""DeepSeek-V4 hybrid stack: a data-less anchor plus six data families (DESIGN §4).

    pool              kind     source  tokens/row  row bytes  layers
    kv                ANCHOR   -         1 (pg 256)        0  -
    swa               STATE    own       128          74 880  all
    c4_kv             HISTORY  kv        256          37 440  ratio 4
    c4_indexer        HISTORY  kv        256           8 448  ratio 4
    c128_kv           HISTORY  kv        256           1 728  ratio 128
    c4_state          STATE    swa       128          65 536  ratio 4
    c4_indexer_state  STATE    swa       128          16 384  ratio 4

The ratio-128 compressor state is per request and never needs offload: pages are 256
tokens, a multiple of 128, so a load never resumes a partial ratio-128 window.

The geometry (page size, window, the two ratios and every pool's row buffers) is a
`V4Geometry`: `REAL_GEOMETRY` above for the presets, `geometry_for_dims` for a model with
other dims (the reference model of `hicache.reference`: page 32, window 16, ratios 4 and
16, fp32 rows shaped by its head dims). The heavily compressed pool keeps the name
``c128_kv`` whatever its ratio.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from host_pools.spec import BufferSpec, PoolKind, PoolSpec, Stack

PAGE_SIZE = 256
WINDOW = 128
SWA_ROW_BYTES = 74_880  # 128 x (448 fp8 + 128 bf16 rope + 8 scale) = 74 752, padded to 130 x 576
C4_KV_ROW_BYTES = 37_440  # 64 x 576 values + 64 x 8 scales = 37 376, padded to 65 x 576
C4_INDEXER_ROW_BYTES = 8_448  # 64 x (128 fp8 + 4 fp32 scale)
C128_KV_ROW_BYTES = 1_728  # 2 x 584 = 1 168, padded to 3 x 576
RING = 8  # compressor ring slots per SWA page

FLASH_RATIOS = (0, 0) + (4, 128) * 20 + (4,)  # 43 layers: 2 SWA-only, 21 ratio-4, 20 ratio-128
PRO_RATIOS = (128, 128) + (4, 128) * 29 + (4,)  # 61 layers: 30 ratio-4, 31 ratio-128


@dataclass(frozen=True)
class V4Geometry:
    """The pool geometry of a DeepSeek-V4 stack.

    Attributes:
        page_size: anchor tokens per page (the tree's unit); a multiple of ``window``
            and of both ratios, so a page boundary never cuts a compressor window.
        window: sliding-window tokens, the ``swa`` row and the state pools' window.
        c4_ratio / hca_ratio: the CSA (overlapping) and HCA compression ratios.
        swa ... c4_indexer_state: the one buffer of each data pool (one row).
    """

    page_size: int
    window: int
    c4_ratio: int
    hca_ratio: int
    swa: BufferSpec
    c4_kv: BufferSpec
    c4_indexer: BufferSpec
    c128_kv: BufferSpec
    c4_state: BufferSpec
    c4_indexer_state: BufferSpec

    def __post_init__(self) -> None:
        for name in ("page_size", "window", "c4_ratio", "hca_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"V4Geometry.{name}: must be >= 1, got {getattr(self, name)}")
        if self.c4_ratio == self.hca_ratio:
            raise ValueError(f"V4Geometry.hca_ratio: must differ from c4_ratio={self.c4_ratio}")
        for name in ("window", "c4_ratio", "hca_ratio"):
            if self.page_size % getattr(self, name):
                raise ValueError(f"V4Geometry.page_size: {self.page_size} must be a multiple of "
                                 f"{name}={getattr(self, name)}")

    @property
    def ratios(self) -> tuple[int, int, int]:
        """Allowed per-layer entries: 0 (SWA only), the CSA ratio, the HCA ratio."""
        return (0, self.c4_ratio, self.hca_ratio)


_U8 = torch.uint8
REAL_GEOMETRY = V4Geometry(
    PAGE_SIZE, WINDOW, 4, 128,
    swa=BufferSpec("kv", (SWA_ROW_BYTES,), _U8), c4_kv=BufferSpec("kv", (C4_KV_ROW_BYTES,), _U8),
    c4_indexer=BufferSpec("indexer", (C4_INDEXER_ROW_BYTES,), _U8),
    c128_kv=BufferSpec("kv", (C128_KV_ROW_BYTES,), _U8),
    c4_state=BufferSpec("state", (RING, 2048), torch.float32),
    c4_indexer_state=BufferSpec("state", (RING, 512), torch.float32))


def geometry_for_dims(page_size: int, window: int, c4_ratio: int, hca_ratio: int, head_dim: int,
                      index_head_dim: int, dtype: torch.dtype = torch.float32) -> V4Geometry:
    """The geometry of a model with these dims, rows as typed tensors (not opaque bytes).

    Rows: ``swa`` the window's K=V vectors ``[window, head_dim]``; compressed pools one
    page of entries ``[page_size // ratio, dim]``; the state rings ``[2 * c4_ratio, 4 * dim]``
    (per token slot the compressor's kv and gate projections of both overlapping series,
    ``2 * dim`` each, at slot ``position % (2 * c4_ratio)``).

    Raises:
        ValueError: a size below 1, or a page that is not a multiple of window and ratios.
    """
    if min(head_dim, index_head_dim) < 1:
        raise ValueError(f"head_dim / index_head_dim: must be >= 1, got {head_dim} / {index_head_dim}")
    if min(page_size, c4_ratio, hca_ratio) < 1:
        raise ValueError(f"page_size / ratios: must be >= 1, got {page_size} / {c4_ratio} / {hca_ratio}")
    ring = 2 * c4_ratio
    return V4Geometry(
        page_size, window, c4_ratio, hca_ratio,
        swa=BufferSpec("kv", (window, head_dim), dtype),
        c4_kv=BufferSpec("kv", (page_size // c4_ratio, head_dim), dtype),
        c4_indexer=BufferSpec("indexer", (page_size // c4_ratio, index_head_dim), dtype),
        c128_kv=BufferSpec("kv", (page_size // hca_ratio, head_dim), dtype),
        c4_state=BufferSpec("state", (ring, 4 * head_dim), dtype),
        c4_indexer_state=BufferSpec("state", (ring, 4 * index_head_dim), dtype))


def deepseek_v4(compress_ratios: Sequence[int], model: str = "deepseek-v4",
                geometry: V4Geometry = REAL_GEOMETRY) -> Stack:
    """Build the seven-pool stack for one entry of ``compress_ratios`` per layer.

    Args:
        compress_ratios: per layer 0, ``geometry.c4_ratio`` or ``geometry.hca_ratio``.
        model: the stack's label (a storage namespace's model id by default).
        geometry: page, window, ratios and row buffers; the real model's by default.
    Raises:
        ValueError: an entry outside ``geometry.ratios``, or an empty list.
    """
    g = geometry
    ratios = tuple(int(r) for r in compress_ratios)
    if not ratios:
        raise ValueError("compress_ratios: need one entry per layer, got an empty list")
    bad = sorted({r for r in ratios if r not in g.ratios})
    if bad:
        raise ValueError(f"compress_ratios: entries must be in {g.ratios}, got {bad}")
    c4 = tuple(i for i, r in enumerate(ratios) if r == g.c4_ratio)
    hca = tuple(i for i, r in enumerate(ratios) if r == g.hca_ratio)
    pools = [
        PoolSpec("kv", PoolKind.ANCHOR, 0, (), tokens_per_row=1),
        PoolSpec("swa", PoolKind.STATE, len(ratios), (g.swa,), tokens_per_row=g.window, window_tokens=g.window),
    ]
    if c4:
        pools += [PoolSpec("c4_kv", PoolKind.HISTORY, len(c4), (g.c4_kv,), g.page_size, indices_from="kv",
                           layer_ids=c4),
                  PoolSpec("c4_indexer", PoolKind.HISTORY, len(c4), (g.c4_indexer,), g.page_size,
                           indices_from="kv", layer_ids=c4)]
    if hca:
        pools.append(PoolSpec("c128_kv", PoolKind.HISTORY, len(hca), (g.c128_kv,), g.page_size,
                              indices_from="kv", layer_ids=hca))
    if c4:
        pools += [PoolSpec("c4_state", PoolKind.STATE, len(c4), (g.c4_state,), g.window, indices_from="swa",
                           window_tokens=g.window, layer_ids=c4),
                  PoolSpec("c4_indexer_state", PoolKind.STATE, len(c4), (g.c4_indexer_state,), g.window,
                           indices_from="swa", window_tokens=g.window, layer_ids=c4)]
    return Stack(tuple(pools), page_size=g.page_size, model=model)
