"""The fused int8 quantize / dequantize copy: one Triton pass from bf16/fp16 device rows to
int8 + fp32-scale host rows (D2H) and back (H2D), compiled for CUDA and interpreted for CPU.

Same bytes as `transfer_kernels.quant.reference` (tests compare bytes), which takes care in
three places:

* division: the compiled ``/`` of fp32 is approximate (``div.full``); the kernel uses
  ``tl.math.div_rn`` there and ``/`` under the interpreter (numpy's fp32 division is IEEE,
  its ``div_rn`` is not);
* rounding: round-half-even as ``(y + 1.5 * 2**23) - 1.5 * 2**23`` (exact for |y| < 2**22;
  here |y| <= 127) with FMA contraction off (``enable_fp_fusion=False``), so ``f * inv`` is
  rounded once, as torch rounds it;
* the bf16 cast: round-to-nearest-even on the fp32 bits (the interpreter truncates).

A *segment* is one (job, layer, device buffer): device rows of ``vpr`` vectors of ``VEC``
values, host int8 rows and fp32 scale rows. Program (s, p) handles vectors
``[p * BV, (p + 1) * BV)`` of segment ``s``, then every ``grid[1]``-th block after. One
launch per (group, mode, dtype, vector length): one for a whole MHA or MLA load group.
The grid is about the copy kernel's program budget in all (``max(cap, segments)``
programs, ``tuning.TRITON_MAX_PROGRAMS`` by default on CUDA): a conversion takes no more
SMs from the model than a copy. (Not tuned on a GPU yet.) The kernel itself is
`transfer_kernels.cuda.quant_kernel`.

Like the copy kernel's, a prepared plan's calls go through `transfer_kernels.cuda.runtime`: one
``upload`` of ``meta`` per plan and one ``launch`` per launch group (of a `BoundQuant`
bound at the first launch), so an int8 load keeps the load's call budget.

``meta`` (int64): each job's device and host row indices, then per segment ``SEG``
fields::

    0 dev_base  1 dev_stride (elements)  2 q_base  3 q_stride (bytes)  4 s_base
    5 s_stride (fp32 elements)  6 dev_idx  7 host_idx (offsets in meta)  8 vpr  9 n_vec
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from transfer_kernels import tuning
from transfer_kernels.backends.base import CopyBackend
from transfer_kernels.backends.launches import Prepared, Upload
from transfer_kernels.cuda import runtime
from transfer_kernels.cuda.abi import QUANT_SEG_FIELDS as SEG
from transfer_kernels.quant.reference import TINY
from transfer_kernels.rows import CopyPlan, LaunchGroups


class _Launch(NamedTuple):
    """One kernel launch: its segments in ``meta`` and its constants."""

    seg_at: int
    num_segs: int
    max_vec: int  # the largest segment's vectors (sets the grid)
    quantize: bool
    bf16: bool
    vec: int


class TritonQuantBackend(CopyBackend):
    """The fused quant kernel for converting jobs (`base`: the converting split)."""

    name = "triton_quant"
    converts = True

    def __init__(self, max_programs: int | None = None) -> None:
        """Args:
            max_programs: programs of one launch, at least one per segment (``None``: the
                copy kernel's tuned grid, ``tuning.TRITON_MAX_PROGRAMS`` on CUDA and
                ``tuning.TRITON_INTERPRET_MAX_PROGRAMS`` under the interpreter).
        """
        super().__init__()
        self.max_programs = max_programs

    def check(self, plan: CopyPlan) -> None:
        """``ValueError`` when a CUDA plan's host side is not pinned, or a scale buffer is not
        4-byte aligned (the kernel stores fp32 scales)."""
        for i, job in enumerate(plan.jobs):
            host = job.dst if job.mode == "quantize" else job.src
            scale_align = int(np.gcd.reduce(np.append(host.ptrs[:, 1::2].numpy().ravel(),
                                                       list(host.row_strides[1::2]))))
            if scale_align % 4:
                raise ValueError(f"jobs[{i}]: scale rows of {host.name} are not 4-byte aligned "
                                 f"for the triton quant kernel")
            if plan.device.type == "cuda" and host.device.type == "cpu" and not host.is_pinned:
                raise ValueError(f"jobs[{i}]: host table {host.name} must be pinned memory for the "
                                 f"triton quant kernel (read through UVA)")

    def lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any = None,
                keep: bool = False, like: Prepared | None = None) -> Prepared:
        """The size class's launches and segment tables: a load only gathers and uploads
        its rows."""
        return Prepared(QuantKernel(self, build_layout(plan, groups, self.grid_cap(plan.device)), plan, keep))

    def grid_cap(self, device: torch.device) -> int:
        """Programs one launch may take on ``device`` (see ``max_programs``)."""
        if self.max_programs is not None:
            return self.max_programs
        return tuning.TRITON_MAX_PROGRAMS if device.type == "cuda" else tuning.TRITON_INTERPRET_MAX_PROGRAMS


class QuantLayout(NamedTuple):
    """What a size class's launches need besides its rows (`build_layout`)."""

    jobs: tuple[int, ...]  # jobs with rows, in ``meta``'s index order
    launches: list[list[_Launch]]  # per group
    calls: list[list[tuple]]  # per group: each launch's (seg_at, grid, constants)
    segs: torch.Tensor  # int64 CPU: the segment tables, after the indices in ``meta``


class QuantKernel(Upload):
    """A size class's kernel step: its launches and segment tables; a load uploads its rows
    (per job: device rows, then host rows) before the segment tables in one copy (with
    ``keep``, as the copy kernel's: the first load's buffer and launcher kept)."""

    def __init__(self, backend: TritonQuantBackend, lay: QuantLayout, plan: CopyPlan, keep: bool = False) -> None:
        # per job with rows: is its device side the source (quantize)? fixed by its tables
        order = tuple((j, plan.jobs[j].mode == "quantize") for j in lay.jobs)
        super().__init__(plan.device, order, None, lay.segs, keep)
        self.layout, self.live = lay, tuple(bool(g) for g in lay.launches)
        self.counts = ((backend.launch_count, self.live),)

    def launcher(self, meta: torch.Tensor) -> BoundQuant:
        return BoundQuant(meta, self.layout.calls)


class BoundQuant:
    """The quant launches of one ``meta`` buffer, bound once (`runtime.launch` calls
    :meth:`launch`): grids and constants resolved (the layout's ``calls``), and whether the
    plan's device is current (then no device switch per launch)."""

    def __init__(self, meta: torch.Tensor, calls: list[list[tuple]]) -> None:
        self.meta, self.calls = meta, calls
        switch = meta.device.type == "cuda" and not runtime.device_is_current(meta.device)
        self.device = meta.device if switch else None

    def launch(self, group: int) -> None:
        """Enqueue group ``group``'s launches (CUDA: the current stream; CPU: done on return)."""
        from transfer_kernels.cuda import quant_kernel
        for seg_at, grid, consts in self.calls[group]:
            quant_kernel.run(self.meta, seg_at, grid, device=self.device, **consts)


def build_layout(plan: CopyPlan, groups: LaunchGroups, cap: int) -> QuantLayout:
    """The plan's launches per group and their segment tables (row counts, not rows)."""
    offsets: dict[int, tuple[int, int]] = {}
    at = 0
    for j, job in enumerate(plan.jobs):  # each job's rows once
        if job.num_rows:
            offsets[j] = (at, at + job.num_rows)
            at += 2 * job.num_rows
    launches: list[list[_Launch]] = []
    tables: list[np.ndarray] = []
    for group in groups:
        mine = []
        for key, segs in _segments(plan, group, offsets).items():
            mine.append(_Launch(at, len(segs), max(int(s[9]) for s in segs), *key))
            tables.append(np.asarray(segs, dtype=np.int64).reshape(-1))
            at += len(segs) * SEG
        launches.append(mine)
    segs_t = torch.from_numpy(np.concatenate(tables)) if tables else torch.empty(0, dtype=torch.int64)
    calls = [[_bind(lau, cap) for lau in mine] for mine in launches]
    return QuantLayout(tuple(offsets), launches, calls, segs_t)


def _segments(plan: CopyPlan, group: Sequence[tuple[int, int]],
              offsets: dict[int, tuple[int, int]]) -> dict[tuple, list[list[int]]]:
    """The group's segments keyed by launch constants (mode, bf16, vector length)."""
    out: dict[tuple, list[list[int]]] = {}
    for j, layer in group:
        job = plan.jobs[j]
        if not job.num_rows:
            continue
        quantize = job.mode == "quantize"
        dev, host = (job.src, job.dst) if quantize else (job.dst, job.src)
        codec = host.codec
        item = codec.dtype.itemsize
        dev_ptrs, host_ptrs = dev.ptrs.numpy()[layer].tolist(), host.ptrs.numpy()[layer].tolist()
        for b, (elems, vec) in enumerate(zip(codec.elems, codec.vecs)):
            vpr = elems // vec
            out.setdefault((quantize, codec.dtype == torch.bfloat16, vec), []).append([
                dev_ptrs[b], dev.row_strides[b] // item,
                host_ptrs[2 * b], host.row_strides[2 * b],
                host_ptrs[2 * b + 1], host.row_strides[2 * b + 1] // 4,
                offsets[j][0], offsets[j][0] + job.num_rows, vpr, vpr * job.num_rows])
    return out


def _bind(lau: _Launch, cap: int) -> tuple[int, tuple[int, int], dict]:
    """One launch's (seg_at, grid, kernel constants)."""
    block_d = 1 << max(0, (lau.vec - 1).bit_length())
    bv = max(1, 4096 // block_d)
    blocks = min(-(-lau.max_vec // bv), max(1, cap // lau.num_segs))
    return lau.seg_at, (lau.num_segs, blocks), dict(quantize=lau.quantize, bf16=lau.bf16, vec=lau.vec,
                                                    block_d=block_d, bv=bv, tiny=TINY)
