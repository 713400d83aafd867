"""The Triton row-copy kernel (private): dense 16-byte vectors, compiled for CUDA and
interpreted for CPU.

Both variants are built from the same Python function, whatever ``TRITON_INTERPRET``
says: a plan on CUDA tensors runs the compiled kernel, a plan on CPU tensors runs the
interpreter (the test suite's path on machines without a GPU). The kernel is written
with ``while`` loops and no nested ``@triton.jit`` call (``tl.cdiv`` included) so that
both variants work on every supported Triton (the 3.6 interpreter cannot index ``range``
with a scalar tensor under numpy >= 2.4, and a compiled helper cannot be called from an
interpreted kernel).

Work decomposition. A *segment* is one (job, layer, buffer): base address and row stride
per side, a row of ``vpr`` *vectors* of ``ALIGN`` bytes, and a list of (src_row, dst_row)
pairs. Its ``n_vec = n_rows * vpr`` vectors are numbered row after row and cut into
*items* of ``VPT`` consecutive vectors; an item spans row ends freely (no padding lane)::

    vectors  | row 0: 0 .. vpr-1 | row 1: vpr .. 2*vpr-1 | ... | row n-1 ... n_vec-1 |
    items    [ item 0: VPT vectors     ][ item 1             ] ... [ last, masked tail ]
    a tile   [VPT, ALIGN] bytes: vector v of the item = row v // vpr, column v % vpr

Each vector loads its row's index once per side (one index load per vector, broadcast
over its ``ALIGN`` bytes), then moves ``ALIGN`` bytes with one vector access. ``ALIGN``
(16, 8, 4 or 1) is a compile-time constant: one specialization per alignment, so the
16-byte kernel carries no code of the narrower paths (no shared memory, no spills).
Division by ``vpr`` is a multiply and a shift by a host-computed magic number (exact for
dividends below 2**31, see ``abi.magic``), and each program tracks its
(row, column) position from one item to the next.

One launch covers the items of its segments, numbered across the launch. Program ``p`` of
a grid of ``G`` programs takes the contiguous items ``[bounds[p], bounds[p + 1])`` and
starts at segment ``first[p]`` (both computed on the host), so a program visits only the
segments it copies from.

``meta`` (int64): segment table, program tables, then row indices::

    segment s (SEG_FIELDS at s * SEG_FIELDS):
      0 src_base  1 src_stride  2 dst_base  3 dst_stride   (bytes)
      4 vpr       vectors per row (row bytes // ALIGN)
      5 magic     6 shift         floor(t / vpr) == (t * magic) >> shift for 0 <= t < 2**31
      7 src_idx   8 dst_idx       offsets (int64 elements) of the rows inside meta
      9 n_vec     vectors of the segment
     10 item_begin  11 item_end   its items within the launch
    program table of a launch (at prog_at): first[G], bounds[G + 1]
"""
from __future__ import annotations

import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from transfer_kernels.cuda import runtime
from transfer_kernels.cuda.abi import SEG_FIELDS

try:  # triton >= 3.4: the launch hooks live in knobs (needed by the direct launch)
    from triton import knobs
except ImportError:  # pragma: no cover - older triton: always the JITFunction path
    knobs = None



def _copy_rows(meta_ptr, prog_at, NF: tl.constexpr, VPT: tl.constexpr, ALIGN: tl.constexpr):
    """Copy this program's items of one launch; see the module docstring.

    The vector hint sits on each freshly built ``[VPT, 1]`` pointer (hints attach to the op
    that made a value) before the ``ALIGN`` byte columns are added.
    """
    pid = tl.program_id(0)
    table = meta_ptr + prog_at
    nprog = tl.num_programs(0)
    s = tl.load(table + pid)
    it = tl.load(table + nprog + pid)
    it_end = tl.load(table + nprog + pid + 1)
    lanes = tl.arange(0, VPT).to(tl.int64)[:, None]
    cols = tl.arange(0, ALIGN)[None, :]
    while it < it_end:
        seg = meta_ptr + s * NF
        src_base = tl.load(seg).to(tl.pointer_type(tl.uint8))
        src_stride = tl.load(seg + 1)
        dst_base = tl.load(seg + 2).to(tl.pointer_type(tl.uint8))
        dst_stride = tl.load(seg + 3)
        vpr = tl.load(seg + 4)
        magic = tl.load(seg + 5)
        shift = tl.load(seg + 6)
        src_idx = meta_ptr + tl.load(seg + 7)
        dst_idx = meta_ptr + tl.load(seg + 8)
        n_vec = tl.load(seg + 9)
        stop = tl.minimum(tl.load(seg + 11), it_end)
        v0 = (it - tl.load(seg + 10)) * VPT  # first vector of the item, within the segment
        r0 = v0 // vpr  # once per segment visit; then tracked item to item
        c0 = v0 - r0 * vpr
        while it < stop:
            t = c0 + lanes  # < vpr + VPT < 2**31: the magic division is exact
            q = (t * magic) >> shift
            row = r0 + q
            col = (t - q * vpr) * ALIGN
            live = (v0 + lanes) < n_vec
            s_off = tl.load(src_idx + row, mask=live, other=0) * src_stride + col
            d_off = tl.load(dst_idx + row, mask=live, other=0) * dst_stride + col
            sp = tl.multiple_of(src_base + s_off, [ALIGN, ALIGN]) + cols
            dp = tl.multiple_of(dst_base + d_off, [ALIGN, ALIGN]) + cols
            tl.store(dp, tl.load(sp, mask=live), mask=live)
            c0 += VPT
            rows_done = (c0 * magic) >> shift
            r0 += rows_done
            c0 -= rows_done * vpr
            v0 += VPT
            it += 1
        s += 1


# One compiled variant for any program table; the interpreter needs no specialization.
_compiled = JITFunction(_copy_rows, do_not_specialize=["prog_at"])
_interpreted = InterpretedFunction(_copy_rows)


# Compiled kernels by (device, vectors per tile, alignment, warps), launched directly after
# their first launch; ORDINARY for a variant whose direct entry refused its arguments (a
# triton whose launcher signature changed): that variant takes JITFunction.run from then on.
ORDINARY = "ordinary"
_launchers: dict[tuple, object] = {}


def launch_copy_rows(meta: torch.Tensor, prog_at: int, grid: int, vpt: int, align: int,
                     num_warps: int) -> None:
    """Launch the kernel once: the launch whose program table sits at ``prog_at`` in ``meta``.

    On CUDA it is enqueued on the current stream of ``meta``'s device; on CPU it runs
    (interpreted) before returning. After the first launch of a (device, vpt, align, warps)
    variant the compiled kernel is called directly, skipping the argument binding and
    cache-key work of ``JITFunction.run`` (the same call ``JITFunction.run`` ends with;
    ``meta`` is always a fresh, aligned allocation, so the specialization cannot change).

    Args:
        meta: int64 tensor on the execution device (module docstring layout).
        prog_at: offset (int64 elements) of the launch's program table.
        grid: programs; the table holds ``grid`` starts and ``grid + 1`` item bounds.
        vpt: vectors per tile, a power of two.
        align: vector bytes (16, 8, 4 or 1), dividing every address, stride and row size of
            the launch's segments.
        num_warps: warps per program (ignored by the interpreter).
    """
    if meta.device.type == "cpu":
        with runtime.INTERPRETER:  # the interpreter is not thread-safe
            _interpreted[(grid,)](meta, prog_at, NF=SEG_FIELDS, VPT=vpt, ALIGN=align)
        return
    key = (meta.device.index, vpt, align, num_warps)
    kernel = _launchers.get(key)
    if kernel is not None and kernel is not ORDINARY and knobs is not None and not meta.data_ptr() % 16:
        try:
            if torch.cuda.current_device() != meta.device.index:  # a function runs in its context
                with torch.cuda.device(meta.device):
                    _run(kernel, meta, prog_at, grid, vpt, align)
            else:
                _run(kernel, meta, prog_at, grid, vpt, align)
            return
        except TypeError:  # refused before launching: the ordinary launch from now on
            _launchers[key] = ORDINARY
    # Compiled and loaded in meta's device context, whichever device is current.
    with torch.cuda.device(meta.device):
        kernel = _compiled[(grid,)](meta, prog_at, NF=SEG_FIELDS, VPT=vpt, ALIGN=align,
                                    num_warps=num_warps)
    _launchers.setdefault(key, kernel)


def _run(kernel, meta: torch.Tensor, prog_at: int, grid: int, vpt: int, align: int) -> None:
    """The direct launch of a loaded kernel on the current stream of ``meta``'s device."""
    stream = torch.cuda.current_stream(meta.device).cuda_stream
    args = (meta, prog_at, SEG_FIELDS, vpt, align)
    kernel.run(grid, 1, 1, stream, kernel.function, kernel.packed_metadata,
               kernel.launch_metadata((grid, 1, 1), stream, *args),
               knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)


class BoundLaunches:
    """The launches of one ``meta`` buffer, bound once (a prepared plan's launcher).

    Binding resolves, once, the stream handle (``runtime.stream_handle``: the current
    stream when bound), whether the fast entry can be taken (CUDA, ``meta`` 16-byte
    aligned, its device current, triton's ``knobs`` present) and every launch's argument
    tuple. A launch is then the compiled variant's low-level ``run`` (the call
    ``JITFunction.run`` ends with) on that handle: no ``torch.cuda`` call, no argument
    binding or cache-key work. A variant not compiled yet, and every launch where the fast
    entry cannot be taken (the CPU interpreter included), goes through
    :func:`launch_copy_rows`, the ordinary launch. The first fast call of each variant is
    guarded: a ``TypeError`` (a triton whose launcher takes other arguments; raised before
    anything is launched) marks the variant ``ORDINARY`` in ``kernels``, and it takes the
    ordinary launch from then on, in this launcher and every later one.

    Args:
        meta / prog_at / grids / aligns / vpt / num_warps: see :func:`launch_copy_rows`;
            ``prog_at``, ``grids`` and ``aligns`` per launch.
        kernels: compiled variants by ``(device index, vpt, align, warps)``; ``None``: the
            ones this module loaded. Given explicitly (tests), the fast entry is taken on
            any device with handle ``stream``.
        stream: the handle for explicit ``kernels``.
    """

    def __init__(self, meta: torch.Tensor, prog_at: tuple[int, ...], grids: tuple[int, ...],
                 aligns: tuple[int, ...], vpt: int, num_warps: int,
                 kernels: dict | None = None, stream: int = 0) -> None:
        self.meta, self.grids, self.vpt, self.num_warps = meta, grids, vpt, num_warps
        self.args = tuple((meta, p, SEG_FIELDS, vpt, a) for p, a in zip(prog_at, aligns))
        self.index = meta.device.index
        if kernels is not None:
            self.kernels, self.stream, self.fast = kernels, stream, knobs is not None
        else:
            cuda = meta.device.type == "cuda"
            self.kernels, self.stream = _launchers, runtime.stream_handle(meta.device)
            self.fast = (cuda and knobs is not None and meta.data_ptr() % 16 == 0
                         and runtime.device_is_current(meta.device))
        self._bound: dict[int, tuple] = {}  # align -> (run, function, packed metadata, kernel)

    def launch(self, group: int) -> None:
        """Enqueue launch ``group`` (grid > 0) on the bound stream (one frame: the hooks'
        check inlined)."""
        grid, args = self.grids[group], self.args[group]
        bound = self._bound.get(args[4]) if self.fast else None
        if bound is None:
            self._first(grid, args)
            return
        run, function, packed, kernel = bound
        hooks = knobs.runtime  # a profiler may set a hook at any time: read per launch
        enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
        if enter is not None and getattr(enter, "calls", True) == []:
            enter = None  # an empty HookChain (triton 3.9; older: None)
        if leave is not None and getattr(leave, "calls", True) == []:
            leave = None
        metadata = None if enter is None else kernel.launch_metadata((grid, 1, 1), self.stream, *args)
        run(grid, 1, 1, self.stream, function, packed, metadata, enter, leave, *args)

    def _call(self, bound: tuple, grid: int, args: tuple) -> None:
        """The fast entry of a variant's first launch here (:meth:`launch` inlines it)."""
        run, function, packed, kernel = bound
        hooks = knobs.runtime
        enter, leave = _active(hooks.launch_enter_hook), _active(hooks.launch_exit_hook)
        metadata = None if enter is None else kernel.launch_metadata((grid, 1, 1), self.stream, *args)
        run(grid, 1, 1, self.stream, function, packed, metadata, enter, leave, *args)

    def _first(self, grid: int, args: tuple) -> None:
        """A variant's first launch here: bind its fast entry and launch through it, or the
        ordinary launch (not fast, not compiled yet, or its fast entry refused the call)."""
        key = (self.index, self.vpt, args[4], self.num_warps)
        kernel = self.kernels.get(key) if self.fast else None
        if kernel is not None and kernel is not ORDINARY:
            bound = (kernel.run, kernel.function, kernel.packed_metadata, kernel)
            try:
                self._call(bound, grid, args)
            except TypeError:  # refused before launching anything: ordinary from now on
                self.kernels[key] = ORDINARY
            else:
                self._bound[args[4]] = bound
                return
        launch_copy_rows(self.meta, args[1], grid, self.vpt, args[4], self.num_warps)


def _active(hook):
    """``hook``, or ``None`` when there is none: newer triton (3.9) keeps an empty ``HookChain``
    (calling it does nothing) where older versions keep ``None``; an empty chain is passed
    as ``None`` so that no launch metadata is built for it."""
    if hook is None or getattr(hook, "calls", True) == []:
        return None
    return hook


def compiled_kernel() -> JITFunction:
    """The compiled variant (tests compile it for a GPU target without running it)."""
    return _compiled


def compiled_variants() -> dict[tuple, object]:
    """The loaded kernels by (device, vpt, align, warps) (GPU tests read their metadata)."""
    return {k: v for k, v in _launchers.items() if v is not ORDINARY}
