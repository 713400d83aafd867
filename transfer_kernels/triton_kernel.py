"""The Triton row-copy kernel (private) and its launcher.

Import this module only after deciding compiled vs interpreted mode: ``@triton.jit``
reads ``TRITON_INTERPRET`` when the module is imported.

Work decomposition. A *segment* is one (job, layer, buffer): a base address and row
stride per side (read through the side's cached device descriptor), a row byte count
and a list of (src_row, dst_row) pairs. Each segment is cut into *items* of one tile
(``BLOCK`` bytes): a tile covers ``BLOCK // span`` consecutive pairs of ``span`` bytes
each, where ``span = min(BLOCK, next_pow2(row_bytes))``; a row longer than ``BLOCK``
takes ``ceil(row_bytes / span)`` chunks::

    tile lanes  [0 ........ span) [span ...... 2*span) ...  [BLOCK - span .. BLOCK)
    carry       pair k, bytes c*span+[0,span)   pair k+1    ...   pair k + BLOCK/span - 1

Items are numbered globally across segments; program ``p`` of a persistent grid of
``G`` programs takes the items ``g`` with ``g % G == p`` (the host stores each
segment's first global item modulo ``G``), so the load stays balanced across segments.

Segment descriptor (int64, ``SEG_FIELDS`` per segment, at the start of ``meta``)::

    0 src_desc   address of (base, row_stride) of the source view
    1 dst_desc   address of (base, row_stride) of the destination view
    2 nbytes     bytes per row
    3 align      largest power of two <= 16 dividing every address, stride and nbytes
    4 src_idx    offset (in int64 elements) of the source rows inside ``meta``
    5 dst_idx    offset of the destination rows inside ``meta``
    6 n_rows     pairs in this segment
    7 shift      log2(span)
    8 n_chunks   ceil(nbytes / span)
    9 first      global index of the segment's first item, modulo G
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

SEG_FIELDS = 10


@triton.jit
def _segment(meta_ptr, s, NF: tl.constexpr):
    """Load segment ``s``'s descriptor (module docstring) and resolve its view addresses."""
    seg = meta_ptr + s * NF
    src_desc = tl.load(seg).to(tl.pointer_type(tl.int64))
    dst_desc = tl.load(seg + 1).to(tl.pointer_type(tl.int64))
    src_base = tl.load(src_desc).to(tl.pointer_type(tl.uint8))
    dst_base = tl.load(dst_desc).to(tl.pointer_type(tl.uint8))
    return (src_base, tl.load(src_desc + 1), dst_base, tl.load(dst_desc + 1),
            tl.load(seg + 2), tl.load(seg + 3), meta_ptr + tl.load(seg + 4),
            meta_ptr + tl.load(seg + 5), tl.load(seg + 6), tl.load(seg + 7),
            tl.load(seg + 8), tl.load(seg + 9))


@triton.jit(do_not_specialize=["num_segs"])  # one compiled variant for any segment count
def _copy_rows_kernel(meta_ptr, num_segs, NF: tl.constexpr, BLOCK: tl.constexpr):
    """Copy every segment of ``meta``; see the module docstring for the layout.

    The vector hints are applied inline in each alignment branch, each on its own
    freshly built pointer: hints attach to the op that made a value and are lost across
    a ``@triton.jit`` call boundary, so a helper cannot apply them.
    """
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK).to(tl.int64)
    for s in range(0, num_segs):
        (src_base, src_stride, dst_base, dst_stride, nbytes, align, src_idx, dst_idx,
         n_rows, shift, n_chunks, first) = _segment(meta_ptr, s, NF)
        pairs_per_tile = BLOCK >> shift
        sub = lanes >> shift  # which pair of the tile a lane serves
        byte = lanes & ((1 << shift) - 1)  # which byte of that pair's chunk
        n_items = tl.cdiv(n_rows, pairs_per_tile) * n_chunks
        for w in range((pid - first + nprog) % nprog, n_items, nprog):
            group = w // n_chunks
            pair = (group * pairs_per_tile) + sub
            col = (w - group * n_chunks) * (1 << shift) + byte
            live = pair < n_rows
            src_off = tl.load(src_idx + pair, mask=live, other=0) * src_stride + col
            dst_off = tl.load(dst_idx + pair, mask=live, other=0) * dst_stride + col
            if align >= 16:
                sp = tl.max_contiguous(tl.multiple_of(src_base + src_off, 16), 16)
                dp = tl.max_contiguous(tl.multiple_of(dst_base + dst_off, 16), 16)
                m = tl.max_constancy(live & (col < nbytes), 16)
                tl.store(dp, tl.load(sp, mask=m), mask=m)
            elif align >= 8:
                sp = tl.max_contiguous(tl.multiple_of(src_base + src_off, 8), 8)
                dp = tl.max_contiguous(tl.multiple_of(dst_base + dst_off, 8), 8)
                m = tl.max_constancy(live & (col < nbytes), 8)
                tl.store(dp, tl.load(sp, mask=m), mask=m)
            elif align >= 4:
                sp = tl.max_contiguous(tl.multiple_of(src_base + src_off, 4), 4)
                dp = tl.max_contiguous(tl.multiple_of(dst_base + dst_off, 4), 4)
                m = tl.max_constancy(live & (col < nbytes), 4)
                tl.store(dp, tl.load(sp, mask=m), mask=m)
            else:
                m = live & (col < nbytes)
                tl.store(dst_base + dst_off, tl.load(src_base + src_off, mask=m), mask=m)


def launch_copy_rows(meta: torch.Tensor, num_segs: int, grid: int, block: int,
                     num_warps: int) -> None:
    """Launch :func:`_copy_rows_kernel` once on the current stream.

    Args:
        meta: int64 tensor on the execution device: segment descriptors then row indices.
        num_segs: segments described at the start of ``meta``.
        grid: programs in the persistent grid (the SM budget), >= 1.
        block: tile bytes, a power of two >= 16.
        num_warps: warps per program.
    """
    _copy_rows_kernel[(grid,)](meta, num_segs, NF=SEG_FIELDS, BLOCK=block, num_warps=num_warps)


def is_interpreted() -> bool:
    """True when this module's kernel runs under the Triton interpreter."""
    return isinstance(_copy_rows_kernel, InterpretedFunction)
