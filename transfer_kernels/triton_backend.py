"""The ``"triton"`` backend: one persistent-grid kernel launch per plan or launch group.

Host memory is read and written by the SMs directly through unified addressing: a
pinned (``cudaHostAlloc``/``pin_memory``) host view's ``data_ptr`` is a valid device
address, as is ``cudaHostRegister``'ed memory whose device pointer equals its host
pointer (checked when hicache pins a reservation). A plan on CPU tensors runs the same
kernel under the Triton interpreter, whether or not the machine has a GPU.

Preparation builds the segment descriptors of every launch group at once (numpy, O(jobs)
vector operations), packs them with every job's row indices into one int64 buffer and
moves it to the device in one copy; each launch is then a slice ``[seg_begin, seg_end)``
of that buffer. The per-table (base, stride) descriptors are cached on the tables.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from transfer_kernels import tuning
from transfer_kernels.base import CopyBackend, PreparedPlan
from transfer_kernels.plan import CopyPlan, LaunchGroups, PlannedJob

SEG_FIELDS = 10  # must equal triton_kernel.SEG_FIELDS (that module imports triton)


def kernel_module():
    """The kernel module, imported on first use (``import triton`` costs about a second)."""
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
                ``tuning.TRITON_INTERPRET_MAX_PROGRAMS`` under the interpreter (CPU).
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

    def _grid_cap(self, plan: CopyPlan) -> int:
        if self.max_programs is not None:
            return self.max_programs
        return (tuning.TRITON_MAX_PROGRAMS if plan.device.type == "cuda"
                else tuning.TRITON_INTERPRET_MAX_PROGRAMS)

    def _execute(self, plan: CopyPlan) -> None:
        groups = [[(j, layer) for j, job in enumerate(plan.jobs) for layer in job.layers]]
        self._prepare(plan, groups).run(0)

    def prepare(self, plan: CopyPlan, groups: LaunchGroups) -> PreparedPlan:
        """All groups' descriptors and indices staged in one copy; each launch a slice."""
        self.check(plan)
        return self._prepare(plan, groups)

    def _prepare(self, plan: CopyPlan, groups: LaunchGroups) -> TritonLaunches:
        return TritonLaunches(self, build_launches(plan, groups, self._grid_cap(plan),
                                                   self.tile_bytes))


class Launch(NamedTuple):
    """The arguments of one kernel launch (see ``triton_kernel``'s module docstring)."""

    meta: torch.Tensor  # int64 on the plan's device: segment descriptors, then row indices
    seg_begin: int  # the launch's segments in meta
    seg_end: int
    grid: int  # programs of the persistent grid
    block: int  # tile bytes (power of two)
    num_warps: int

    @property
    def num_segs(self) -> int:
        return self.seg_end - self.seg_begin


class TritonLaunches(PreparedPlan):
    """Prepared launches: one staged ``meta`` buffer, one (segment range, grid) per group."""

    def __init__(self, backend: TritonBackend, launches: list[Launch]) -> None:
        self.backend, self.launches = backend, launches

    @property
    def num_groups(self) -> int:
        return len(self.launches)

    def launch(self, group: int) -> None:
        if self.launches[group].num_segs:
            self.backend.launches += 1
            self.run(group)

    def run(self, group: int) -> None:
        """Launch group ``group`` (no counting; ``execute`` counted already)."""
        launch = self.launches[group]
        if launch.num_segs:
            self.backend.last_launch = launch
            kernel_module().launch_copy_rows(launch.meta, launch.seg_begin, launch.seg_end,
                                             launch.grid, launch.block, launch.num_warps)


def launch_config(plan: CopyPlan, tile_bytes: int) -> tuple[int, int]:
    """Choose (tile bytes, warps): the smallest power-of-two tile holding the largest
    segment, clamped to ``[TRITON_MIN_TILE_BYTES, tile_bytes]``; one warp per
    ``TRITON_BYTES_PER_WARP`` bytes of tile, at most ``TRITON_MAX_WARPS``."""
    largest = max((max(j.src.row_bytes) * j.num_rows for j in plan.jobs if j.num_rows),
                  default=1)
    block = 1 << max(0, (largest - 1).bit_length())
    block = max(min(block, tile_bytes), min(tuning.TRITON_MIN_TILE_BYTES, tile_bytes))
    warps = max(1, min(tuning.TRITON_MAX_WARPS, block // tuning.TRITON_BYTES_PER_WARP))
    return block, warps


def build_launch(plan: CopyPlan, max_programs: int, tile_bytes: int) -> Launch:
    """The single launch of every job and layer of ``plan`` (tests inspect it)."""
    groups = [[(j, layer) for j, job in enumerate(plan.jobs) for layer in job.layers]]
    return build_launches(plan, groups, max_programs, tile_bytes)[0]


def build_launches(plan: CopyPlan, groups: LaunchGroups, max_programs: int,
                   tile_bytes: int) -> list[Launch]:
    """Segment table and indices of every group in one buffer on the plan's device.

    Segments are laid out group after group; within a group, in the order its
    ``(job, layer)`` pairs are listed, buffers innermost. Each job's row indices are
    stored once and shared by all its segments.
    """
    block, warps = launch_config(plan, tile_bytes)
    jobs = plan.jobs
    # Each job's layers in first-use order: segments are built per job, then gathered.
    positions: list[dict[int, int]] = [{} for _ in jobs]
    for group in groups:
        for j, layer in group:
            if jobs[j].num_rows:
                positions[j].setdefault(layer, len(positions[j]))
    base, total = [], 0
    for j, job in enumerate(jobs):
        base.append(total)
        total += len(positions[j]) * job.src.num_buffers
    order, bounds = [], [0]
    for group in groups:
        for j, layer in group:
            if jobs[j].num_rows:
                nb = jobs[j].src.num_buffers
                start = base[j] + positions[j][layer] * nb
                order.extend(range(start, start + nb))
        bounds.append(len(order))
    if not order:
        return [Launch(torch.empty(0, dtype=torch.int64), 0, 0, 1, block, warps)] * len(groups)
    idx_at = len(order) * SEG_FIELDS
    segs, idx_parts = [], []
    for j, job in enumerate(jobs):
        if positions[j]:
            segs.append(_job_segments(job, tuple(positions[j]), plan.device, block, idx_at))
            idx_parts += [job.src_rows, job.dst_rows]
            idx_at += 2 * job.num_rows
    seg = np.concatenate(segs)[np.asarray(order, dtype=np.int64)]
    grids = _deal_items(seg, np.asarray(bounds, dtype=np.int64), max_programs)
    meta = _to_device([torch.from_numpy(seg.reshape(-1))] + idx_parts, plan.device)
    return [Launch(meta, int(b), int(e), int(g), block, warps)
            for b, e, g in zip(bounds[:-1], bounds[1:], grids)]


def _deal_items(seg: np.ndarray, bounds: np.ndarray, max_programs: int) -> np.ndarray:
    """Turn field 9 (each segment's item count) into its first item modulo the grid of
    its launch; returns each launch's grid."""
    items = seg[:, 9].copy()
    sizes = np.diff(bounds)
    done = np.concatenate(([0], np.cumsum(items)))  # items before each segment
    grids = np.maximum(1, np.minimum(max_programs, done[bounds[1:]] - done[bounds[:-1]]))
    start = np.repeat(done[bounds[:-1]], sizes)  # items before each segment's launch
    seg[:, 9] = (done[:-1] - start) % np.repeat(grids, sizes)
    return grids


def _job_segments(job: PlannedJob, layers: tuple[int, ...], device: torch.device, block: int,
                  idx_at: int) -> np.ndarray:
    """``[layers * buffers, SEG_FIELDS]`` int64 descriptors of ``layers`` of one job
    (layer-major); field 9 holds each segment's item count."""
    src, dst, n = job.src, job.dst, job.num_rows
    nl, nb = len(layers), src.num_buffers
    layers = np.asarray(layers, dtype=np.int64)
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
    seg[:, 9] = -(-n // (block // span)) * chunks  # item count; _deal_items makes it 'first'
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
