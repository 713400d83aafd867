"""The ``"triton"`` backend: one persistent-grid kernel launch per plan.

Host memory is read and written by the SMs directly through unified addressing: a
pinned (``cudaHostAlloc``/``pin_memory``) host view's ``data_ptr`` is a valid device
address, as is ``cudaHostRegister``'ed memory on systems where
``cudaDevAttrCanUseHostPointerForRegisteredMem`` is 1 (x86-64 Linux). On a machine
without CUDA the kernel runs under the Triton interpreter on CPU tensors.

Per call the host builds the segment descriptors (numpy, O(jobs) vector ops), packs
them with every job's row indices into one int64 buffer and moves it to the device in
one copy; the per-table (base, stride) descriptors are cached on the tables.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import torch

from transfer_kernels import tuning
from transfer_kernels.base import CopyBackend
from transfer_kernels.plan import CopyPlan, PlannedJob

SEG_FIELDS = 10  # must equal triton_kernel.SEG_FIELDS (that module imports lazily)


def kernel_module():
    """Import the kernel module, choosing the interpreter when there is no CUDA.

    Side effect: without CUDA, sets ``TRITON_INTERPRET=1`` (unless already set) before
    the import, because ``@triton.jit`` decides interpreted vs compiled at import.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from transfer_kernels import triton_kernel
    return triton_kernel


class TritonBackend(CopyBackend):
    """``"triton"``: every (job, layer, buffer) of a plan in ONE kernel launch."""

    name = "triton"

    def __init__(self, max_programs: int | None = None,
                 tile_bytes: int = tuning.TRITON_TILE_BYTES) -> None:
        """Args:
            max_programs: persistent grid size cap (the SM budget), >= 1; ``None`` means
                ``tuning.TRITON_MAX_PROGRAMS`` on CUDA and
                ``tuning.TRITON_INTERPRET_MAX_PROGRAMS`` under the interpreter.
            tile_bytes: bytes per program per loop iteration, a power of two >= 16.

        Raises:
            ValueError: either argument outside its allowed values.
        """
        super().__init__()
        if max_programs is not None and max_programs < 1:
            raise ValueError(f"max_programs: must be >= 1, got {max_programs}")
        if tile_bytes < 16 or tile_bytes & (tile_bytes - 1):
            raise ValueError(f"tile_bytes: must be a power of two >= 16, got {tile_bytes}")
        self.max_programs = max_programs
        self.tile_bytes = tile_bytes
        self.last_launch: Launch | None = None  # the latest launch's arguments, for tests

    def check(self, plan: CopyPlan) -> None:
        """Raise ``ValueError`` when a host side of a CUDA plan is not pinned (no UVA)."""
        if plan.device.type != "cuda":
            return
        for i, job in enumerate(plan.jobs):
            for arg, table in (("src", job.src), ("dst", job.dst)):
                if table.device.type == "cpu" and not table.is_pinned:
                    raise ValueError(f"jobs[{i}].{arg}: host table {table.name} must be pinned "
                                     f"memory for the triton backend (read through UVA)")

    def _execute(self, plan: CopyPlan) -> None:
        kernels = kernel_module()
        if kernels.is_interpreted() != (plan.device.type == "cpu"):
            raise RuntimeError(
                f"triton backend: plan runs on {plan.device} but the kernel was imported "
                f"{'interpreted' if kernels.is_interpreted() else 'compiled'}; set "
                f"TRITON_INTERPRET=1 exactly when running on CPU tensors")
        max_programs = self.max_programs or (tuning.TRITON_INTERPRET_MAX_PROGRAMS
                                             if kernels.is_interpreted()
                                             else tuning.TRITON_MAX_PROGRAMS)
        launch = build_launch(plan, max_programs, self.tile_bytes)
        self.last_launch = launch
        kernels.launch_copy_rows(launch.meta, launch.num_segs, launch.grid, launch.block,
                                 launch.num_warps)


class Launch(NamedTuple):
    """The arguments of one kernel launch (see ``triton_kernel``'s module docstring)."""

    meta: torch.Tensor  # int64 on the plan's device: segment descriptors, then row indices
    num_segs: int  # segments described at the start of meta
    grid: int  # programs of the persistent grid
    block: int  # tile bytes (power of two)
    num_warps: int


def launch_config(plan: CopyPlan, tile_bytes: int) -> tuple[int, int]:
    """Choose (tile bytes, warps): the smallest power-of-two tile holding the largest
    segment, clamped to ``[TRITON_MIN_TILE_BYTES, tile_bytes]``; one warp per
    ``TRITON_BYTES_PER_WARP`` bytes of tile, at most ``TRITON_MAX_WARPS``."""
    largest = max(max(j.src.row_bytes) * j.num_rows for j in plan.jobs if j.num_rows)
    block = 1 << max(0, (largest - 1).bit_length())
    block = max(min(block, tile_bytes), min(tuning.TRITON_MIN_TILE_BYTES, tile_bytes))
    warps = max(1, min(tuning.TRITON_MAX_WARPS, block // tuning.TRITON_BYTES_PER_WARP))
    return block, warps


def build_launch(plan: CopyPlan, max_programs: int, tile_bytes: int) -> Launch:
    """Build the segment table and index buffer of ``plan`` and move them to its device.

    Returns:
        The launch; ``meta`` is on ``plan.device``.
    """
    block, warps = launch_config(plan, tile_bytes)
    jobs = [j for j in plan.jobs if j.num_rows and j.layers]
    num_segs = sum(len(j.layers) * j.src.num_buffers for j in jobs)
    segs, idx_parts = [], []
    idx_at = num_segs * SEG_FIELDS
    for job in jobs:
        segs.append(_job_segments(job, plan.device, block, idx_at))
        idx_parts += [job.src_rows, job.dst_rows]
        idx_at += 2 * job.num_rows
    seg = np.concatenate(segs)
    items = seg[:, 9]  # the builder left each segment's item count in the 'first' field
    grid = int(max(1, min(max_programs, items.sum())))
    seg[:, 9] = (np.cumsum(items) - items) % grid
    meta = _to_device([torch.from_numpy(seg.reshape(-1))] + idx_parts, plan.device)
    return Launch(meta, num_segs, grid, block, warps)


def _job_segments(job: PlannedJob, device: torch.device, block: int, idx_at: int) -> np.ndarray:
    """``[layers * buffers, SEG_FIELDS]`` int64 descriptors of one job (layer-major)."""
    src, dst, n = job.src, job.dst, job.num_rows
    nl, nb = len(job.layers), src.num_buffers
    layers = np.asarray(job.layers, dtype=np.int64)
    entry = (layers[:, None] * nb + np.arange(nb, dtype=np.int64)[None, :]).reshape(-1)
    nbytes = np.tile(np.asarray(src.row_bytes, dtype=np.int64), nl)
    span = np.minimum(block, 1 << np.ceil(np.log2(nbytes)).astype(np.int64))
    chunks = -(-nbytes // span)
    seg = np.empty((nl * nb, SEG_FIELDS), dtype=np.int64)
    seg[:, 0] = src.device_desc(device).data_ptr() + entry * 16  # 2 int64 per entry
    seg[:, 1] = dst.device_desc(device).data_ptr() + entry * 16
    seg[:, 2] = nbytes
    seg[:, 3] = np.gcd(src.align.numpy()[layers].reshape(-1), dst.align.numpy()[layers].reshape(-1))
    seg[:, 4] = idx_at
    seg[:, 5] = idx_at + n
    seg[:, 6] = n
    seg[:, 7] = np.log2(span).astype(np.int64)
    seg[:, 8] = chunks
    seg[:, 9] = -(-n // (block // span)) * chunks  # item count; build_launch makes it 'first'
    return seg


def _to_device(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Concatenate int64 CPU/device parts into one tensor on ``device`` with one copy."""
    if device.type == "cpu":
        return torch.cat(parts)
    if all(p.device.type == "cpu" for p in parts):
        staged = torch.empty(sum(p.numel() for p in parts), dtype=torch.int64, pin_memory=True)
        torch.cat(parts, out=staged)
        return staged.to(device, non_blocking=True)
    return torch.cat([p.to(device, non_blocking=True) for p in parts])
