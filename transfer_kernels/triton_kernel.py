"""The Triton row-copy kernel (private), compiled for CUDA and interpreted for CPU.

Both variants are built from the same Python function, whatever ``TRITON_INTERPRET``
says: a plan on CUDA tensors runs the compiled kernel, a plan on CPU tensors runs the
interpreter (the test suite's path on machines without a GPU). The kernel is written
with ``while`` loops and no nested ``@triton.jit`` call (``tl.cdiv`` included) so that
both variants work on every supported Triton (the 3.6 interpreter cannot index ``range`` with a scalar tensor
under numpy >= 2.4, and a compiled helper cannot be called from an interpreted kernel).

Work decomposition. A *segment* is one (job, layer, buffer): a base address and row
stride per side (read through the side's cached device descriptor), a row byte count
and a list of (src_row, dst_row) pairs. Each segment is cut into *items* of one tile
(``BLOCK`` bytes): a tile covers ``BLOCK // span`` consecutive pairs of ``span`` bytes
each, where ``span = min(BLOCK, next_pow2(row_bytes))``; a row longer than ``BLOCK``
takes ``ceil(row_bytes / span)`` chunks::

    tile lanes  [0 ........ span) [span ...... 2*span) ...  [BLOCK - span .. BLOCK)
    carry       pair k, bytes c*span+[0,span)   pair k+1    ...   pair k + BLOCK/span - 1

One launch covers the segments ``[seg_begin, seg_end)`` of ``meta`` (a prepared batch
holds every layer's segments; each per-layer launch is a slice). Items are numbered
across the launch's segments; program ``p`` of a persistent grid of ``G`` programs
takes the items ``g`` with ``g % G == p`` (the host stores each segment's first item
of its launch modulo ``G``), so the load stays balanced across segments.

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
    9 first      index of the segment's first item within its launch, modulo G
"""
from __future__ import annotations

import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

try:  # triton >= 3.4: the launch hooks live in knobs (needed by the direct launch)
    from triton import knobs
except ImportError:  # pragma: no cover - older triton: always the JITFunction path
    knobs = None

SEG_FIELDS = 10


def _copy_rows(meta_ptr, seg_begin, seg_end, NF: tl.constexpr, BLOCK: tl.constexpr):
    """Copy segments ``[seg_begin, seg_end)`` of ``meta``; see the module docstring.

    The vector hints are applied inline in each alignment branch, each on its own
    freshly built pointer: hints attach to the op that made a value.
    """
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK).to(tl.int64)
    s = seg_begin.to(tl.int64)
    while s < seg_end:
        seg = meta_ptr + s * NF
        src_desc = tl.load(seg).to(tl.pointer_type(tl.int64))
        dst_desc = tl.load(seg + 1).to(tl.pointer_type(tl.int64))
        src_base = tl.load(src_desc).to(tl.pointer_type(tl.uint8))
        dst_base = tl.load(dst_desc).to(tl.pointer_type(tl.uint8))
        src_stride = tl.load(src_desc + 1)
        dst_stride = tl.load(dst_desc + 1)
        nbytes = tl.load(seg + 2)
        align = tl.load(seg + 3)
        src_idx = meta_ptr + tl.load(seg + 4)
        dst_idx = meta_ptr + tl.load(seg + 5)
        n_rows = tl.load(seg + 6)
        shift = tl.load(seg + 7)
        n_chunks = tl.load(seg + 8)
        first = tl.load(seg + 9)
        pairs_per_tile = BLOCK >> shift
        sub = lanes >> shift  # which pair of the tile a lane serves
        byte = lanes & ((1 << shift) - 1)  # which byte of that pair's chunk
        # not tl.cdiv: it is itself a @jit function (not callable from the interpreted twin)
        n_items = (n_rows + pairs_per_tile - 1) // pairs_per_tile * n_chunks
        w = (pid - first + nprog) % nprog
        while w < n_items:
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
            w += nprog
        s += 1


# One compiled variant for any segment range; the interpreter needs no specialization.
_compiled = JITFunction(_copy_rows, do_not_specialize=["seg_begin", "seg_end"])
_interpreted = InterpretedFunction(_copy_rows)


# Compiled kernels by (device, tile, warps), launched directly after their first launch.
_launchers: dict[tuple, object] = {}


def launch_copy_rows(meta: torch.Tensor, seg_begin: int, seg_end: int, grid: int,
                     block: int, num_warps: int) -> None:
    """Launch the kernel once over segments ``[seg_begin, seg_end)`` of ``meta``.

    On CUDA it is enqueued on the current stream; on CPU it runs (interpreted) before
    returning. A per-layer load launches 61 times per batch, so after the first launch
    of a (tile, warps) variant the compiled kernel is called directly, skipping the
    argument binding and cache-key work of ``JITFunction.run`` (the same call
    ``JITFunction.run`` ends with; ``meta`` is always a fresh, aligned allocation, so the
    specialization cannot change).

    Args:
        meta: int64 tensor on the execution device: segment descriptors then row indices.
        seg_begin / seg_end: the launch's segment range, ``0 <= seg_begin < seg_end``.
        grid: programs in the persistent grid (the SM budget), >= 1.
        block: tile bytes, a power of two >= 16.
        num_warps: warps per program (ignored by the interpreter).
    """
    if meta.device.type == "cpu":
        _interpreted[(grid,)](meta, seg_begin, seg_end, NF=SEG_FIELDS, BLOCK=block)
        return
    key = (meta.device.index, block, num_warps)
    kernel = _launchers.get(key)
    if kernel is None or knobs is None or meta.data_ptr() % 16:
        kernel = _compiled[(grid,)](meta, seg_begin, seg_end, NF=SEG_FIELDS, BLOCK=block,
                                    num_warps=num_warps)
        _launchers.setdefault(key, kernel)
        return
    stream = torch.cuda.current_stream(meta.device).cuda_stream
    args = (meta, seg_begin, seg_end, SEG_FIELDS, block)
    kernel.run(grid, 1, 1, stream, kernel.function, kernel.packed_metadata,
               kernel.launch_metadata((grid, 1, 1), stream, *args),
               knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)


def compiled_kernel() -> JITFunction:
    """The compiled variant (tests compile it for a GPU target without running it)."""
    return _compiled
