"""The ``"triton"`` backend: one dense-vector kernel launch per plan or launch group.

Host memory is read and written by the SMs directly through unified addressing: a
pinned (``cudaHostAlloc``/``pin_memory``) host view's ``data_ptr`` is a valid device
address, as is ``cudaHostRegister``'ed memory whose device pointer equals its host
pointer (checked when hicache pins a reservation). A plan on CPU tensors runs the same
kernel under the Triton interpreter, whether or not the machine has a GPU.

A size class's preparation builds the layout of every launch group at once
(``triton_layout``: segment table with the views' addresses, program tables), from the
static part of another class's layout of its route where that fits; a load packs
it with every job's row indices into one int64 buffer and moves that to the device in one
copy on the launching stream; each launch then reads its program table in that buffer.
Nothing the kernel reads is uploaded elsewhere (no per-table descriptor to order against
the launch).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

from transfer_kernels import tuning
from transfer_kernels.backends.base import CopyBackend, all_pairs
from transfer_kernels.backends.launches import Prepared, Upload
from transfer_kernels.backends.quant_triton import TritonQuantBackend
from transfer_kernels.backends.triton_layout import Layout, Static, layout
from transfer_kernels.cuda.abi import MAGIC_BITS
from transfer_kernels.rows import CopyPlan, LaunchGroups

__all__ = ["Launch", "TritonBackend", "TritonKernel", "build_launch", "kernel_module"]


def kernel_module():
    """The kernel module, imported on first use (``import triton`` costs about a second)."""
    from transfer_kernels.cuda import copy_kernel
    return copy_kernel


class TritonBackend(CopyBackend):
    """``"triton"``: every (job, layer, buffer) of a plan in ONE kernel launch."""

    name = "triton"

    def __init__(self, max_programs: int | None = None,
                 tile_bytes: int = tuning.TRITON_TILE_BYTES, num_warps: int | None = None) -> None:
        """Args:
            max_programs: grid size cap (the SM budget), >= 1; ``None`` means
                ``tuning.TRITON_MAX_PROGRAMS`` on CUDA and
                ``tuning.TRITON_INTERPRET_MAX_PROGRAMS`` under the interpreter (CPU).
            tile_bytes: bytes one program moves per loop iteration at 16-byte alignment
                (vectors per tile = tile_bytes // 16), a power of two >= 16.
            num_warps: warps per program, a power of two in [1, 32]; ``None`` means one warp
                per ``32 * tuning.TRITON_VECTORS_PER_THREAD`` vectors of tile, at most
                ``tuning.TRITON_MAX_WARPS``.

        Raises:
            ValueError: an argument outside its allowed values.
        """
        super().__init__()
        if max_programs is not None and not 1 <= max_programs <= tuning.MAX_COPY_PROGRAMS:
            raise ValueError(f"max_programs: must be in [1, {tuning.MAX_COPY_PROGRAMS}], "
                             f"got {max_programs}")
        if tile_bytes < 16 or tile_bytes & (tile_bytes - 1):
            raise ValueError(f"tile_bytes: must be a power of two >= 16, got {tile_bytes}")
        if num_warps is not None and (not 1 <= num_warps <= 32 or num_warps & (num_warps - 1)):
            raise ValueError(f"num_warps: must be a power of two in [1, 32], got {num_warps}")
        self.max_programs = max_programs
        self.tile_bytes = tile_bytes
        self.vpt = tile_bytes // 16
        self.num_warps = num_warps or tuning.triton_warps(tile_bytes)

    def check(self, plan: CopyPlan) -> None:
        """Raise ``ValueError`` when a host side of a CUDA plan is not pinned (no UVA), or
        a row is too long for the kernel's 31-bit vector arithmetic (>= 2 GiB)."""
        for i, job in enumerate(plan.jobs):
            if max(job.src.row_bytes) + self.tile_bytes >= 1 << MAGIC_BITS:
                raise ValueError(f"jobs[{i}]: rows of {max(job.src.row_bytes)} bytes are too long "
                                 f"for the triton backend (< {(1 << MAGIC_BITS) - self.tile_bytes})")
            if plan.device.type != "cuda":
                continue
            for arg, table in (("src", job.src), ("dst", job.dst)):
                if table.device.type == "cpu" and not table.is_pinned:
                    raise ValueError(f"jobs[{i}].{arg}: host table {table.name} must be pinned "
                                     f"memory for the triton backend (read through UVA)")

    def grid_cap(self, device: torch.device) -> int:
        """The grid cap on ``device`` (see ``max_programs``)."""
        if self.max_programs is not None:
            return self.max_programs
        return (tuning.TRITON_MAX_PROGRAMS if device.type == "cuda"
                else tuning.TRITON_INTERPRET_MAX_PROGRAMS)

    def lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any = None,
                keep: bool = False, like: Prepared | None = None) -> Prepared:
        """The size class's layout: every group's segments and program tables at once
        (converting jobs: the fused quant kernel, `quant_triton`); its static part is
        ``like``'s where it fits (`triton_layout.Static.fits`), else built now."""
        if plan.has_quant:
            return self._lay_out_split(plan, groups, keep)
        static = like.kernel.static if like is not None and isinstance(like.kernel, TritonKernel) else None
        static, lay = layout(plan, groups, self.grid_cap(plan.device), self.vpt, static)
        return Prepared(TritonKernel(self, lay, plan.device, keep, static))

    def _make_quant_backend(self, device: torch.device) -> CopyBackend:
        """The fused quantize/dequantize kernel, interpreted on a CPU plan like this one."""
        return TritonQuantBackend(max_programs=self.max_programs)


class Launch(NamedTuple):
    """The arguments of one kernel launch (`transfer_kernels.cuda.copy_kernel`'s module docstring)."""

    meta: torch.Tensor  # int64 on the plan's device: tables, then row indices
    prog_at: int  # the launch's program table in meta
    grid: int  # programs (0: nothing to launch)
    vpt: int  # vectors per tile
    align: int  # vector bytes
    num_warps: int
    seg_begin: int  # the launch's segments in meta (for inspection)
    seg_end: int

    @property
    def num_segs(self) -> int:
        return self.seg_end - self.seg_begin


class TritonKernel(Upload):
    """A size class's kernel step: its layout (segments with the views' addresses, program
    tables) and the layout's static part (the next class of the route may take it); a load
    uploads the layout's head with its rows in one copy on the launching stream and launches
    through one pre-bound launcher (`copy_kernel.BoundLaunches`), kept with ``keep``."""

    def __init__(self, backend: TritonBackend, lay: Layout, device: torch.device, keep: bool = False,
                 static: Static | None = None) -> None:
        super().__init__(device, tuple((j, True) for j in lay.used), lay.head, None, keep)
        self.layout, self.static, self.vpt, self.num_warps = lay, static, backend.vpt, backend.num_warps
        self.live = lay.grids
        self.counts = ((backend.launch_count, self.live),)

    def launcher(self, meta: torch.Tensor) -> Any:
        lay = self.layout
        return kernel_module().BoundLaunches(meta, lay.prog_at, lay.grids, lay.aligns, self.vpt, self.num_warps)

    def launch_args(self, meta: torch.Tensor, group: int) -> Launch:
        """Group ``group``'s launch over a load's ``meta`` (for tests and inspection)."""
        lay = self.layout
        return Launch(meta, lay.prog_at[group], lay.grids[group], self.vpt, lay.aligns[group],
                      self.num_warps, lay.bounds[group], lay.bounds[group + 1])


def build_launch(plan: CopyPlan, backend: TritonBackend) -> Launch:
    """The single launch of every job and layer of ``plan`` (tests inspect it)."""
    prepared = backend.lay_out(plan, (all_pairs(plan),))
    jobs = plan.jobs
    launcher = prepared.start(jobs, [j.src_rows for j in jobs], [j.dst_rows for j in jobs]).launcher
    meta = torch.empty(0, dtype=torch.int64) if launcher is None else launcher.meta
    return prepared.kernel.launch_args(meta, 0)
