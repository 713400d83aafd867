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

from typing import Any, NamedTuple, Sequence

import torch

from transfer_kernels import tuning
from transfer_kernels.backends.base import CopyBackend, all_pairs
from transfer_kernels.backends.launches import Launches, Prepared
from transfer_kernels.backends.quant_triton import TritonQuantBackend
from transfer_kernels.backends.triton_layout import Layout, Static, layout
from transfer_kernels.cuda import runtime
from transfer_kernels.cuda.abi import MAGIC_BITS
from transfer_kernels.rows import CopyPlan, LaunchGroups

__all__ = ["Launch", "LaunchSet", "TritonBackend", "TritonLaunches", "build_launch", "kernel_module"]


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
        self._last: tuple[LaunchSet, int] | None = None  # the latest launch, for tests

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

    @property
    def last_launch(self) -> Launch | None:
        """The latest kernel launch's arguments (for tests), or ``None`` before any."""
        return None if self._last is None else self._last[0].launch_args(self._last[1])

    def lay_out(self, plan: CopyPlan, groups: LaunchGroups, decided: Any = None,
                keep: bool = False, like: Prepared | None = None) -> Prepared:
        """The size class's layout: every group's segments and program tables at once
        (converting jobs: the fused quant kernel, `quant_triton`); its static part is
        ``like``'s where it fits (`triton_layout.Static.fits`), else built now."""
        if plan.has_quant:
            return self._lay_out_split(plan, groups, keep)
        static = like.static if isinstance(like, TritonPrepared) else None
        static, lay = layout(plan, groups, self.grid_cap(plan.device), self.vpt, static)
        return TritonPrepared(self, lay, plan.device, keep, static)

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


class LaunchSet(NamedTuple):
    """The launches of several groups sharing one ``meta`` buffer."""

    meta: torch.Tensor
    layout: Layout
    vpt: int
    num_warps: int

    def launch_args(self, group: int) -> Launch:
        lay = self.layout
        return Launch(self.meta, lay.prog_at[group], lay.grids[group], self.vpt, lay.aligns[group],
                      self.num_warps, lay.bounds[group], lay.bounds[group + 1])


class TritonPrepared(Prepared):
    """A size class's layout (segments with the views' addresses, program tables) and its
    static part (the next class of the route may take it); a load uploads the layout with
    its rows in one copy on the launching stream. With ``keep`` (a route whose loads run
    on one stream) the first load's ``meta`` buffer and its launches are kept: a later
    load writes only its rows into it (one copy, stream-ordered after the previous load's
    launches) and launches through the same bound launcher."""

    def __init__(self, backend: TritonBackend, lay: Layout, device: torch.device, keep: bool = False,
                 static: Static | None = None) -> None:
        self.backend, self.layout, self.device, self.keep = backend, lay, device, keep
        self.static = static
        self.counters = (backend,)
        self._kept: TritonLaunches | None = None  # keep: the launches over the kept meta

    @property
    def num_groups(self) -> int:
        return len(self.layout.grids)

    def start(self, lanes, src_rows, dst_rows) -> TritonLaunches:
        lay, backend, kept = self.layout, self.backend, self._kept
        if lay.head is None:
            return TritonLaunches(backend, LaunchSet(torch.empty(0, dtype=torch.int64), lay, backend.vpt,
                                                     backend.num_warps), self.counters)
        rows = []
        for j in lay.used:
            rows += (src_rows[j], dst_rows[j])
        if kept is not None:  # the rows into the kept meta, after its head: one copy
            runtime.upload(rows, self.device, out=kept.launch_set.meta[lay.head.numel():])
            return kept
        # one index upload per load (the head is never written: a cached copy)
        meta = runtime.upload([lay.head, *rows], self.device)
        launches = TritonLaunches(backend, LaunchSet(meta, lay, backend.vpt, backend.num_warps), self.counters)
        if self.keep:
            self._kept = launches
        return launches


class TritonLaunches(Launches):
    """One load's launches: one staged ``meta`` buffer, one program table per group. A
    launch reads its table offset, grid and alignment from tuples: no per-launch object is
    built."""

    def __init__(self, backend: TritonBackend, launch_set: LaunchSet, counters: tuple) -> None:
        self.backend, self.launch_set, self.counters = backend, launch_set, counters
        self._grids = launch_set.layout.grids
        self._bound = None  # bound at the first launch (importing triton costs a second)

    @property
    def num_groups(self) -> int:
        return len(self._grids)

    @property
    def launches(self) -> list[Launch]:
        """Every group's launch arguments (for tests and inspection)."""
        return [self.launch_set.launch_args(g) for g in range(self.num_groups)]

    def counts(self, group: int) -> bool:
        return self._grids[group] > 0

    def live(self) -> tuple[int, ...]:
        return self._grids

    def direct(self):
        """The pre-bound launcher (`copy_kernel.BoundLaunches`)."""
        return self._bound or self._bind()

    def run(self, events: Sequence[Any], stream: Any) -> None:
        """Every group, each followed by its event record: three calls per group."""
        grids = self._grids
        live = sum(1 for grid in grids if grid)
        for backend in self.counters:
            backend.launches += live
        bound = self._bound or self._bind()
        launch, record = runtime.launch, runtime.record
        for g in range(len(grids)):
            if grids[g]:
                self.backend._last = (self.launch_set, g)
                launch(bound, g)
            record(events[g], stream)

    def _launch(self, group: int) -> None:
        """Launch group ``group`` through the pre-bound launcher: stream handle and compiled
        kernels resolved once per load."""
        self.backend._last = (self.launch_set, group)
        runtime.launch(self._bound or self._bind(), group)

    def _bind(self):
        """The pre-bound launcher, built at the first launch."""
        ls = self.launch_set
        lay = ls.layout
        self._bound = kernel_module().BoundLaunches(ls.meta, lay.prog_at, lay.grids,
                                                    lay.aligns, ls.vpt, ls.num_warps)
        return self._bound


def build_launch(plan: CopyPlan, backend: TritonBackend) -> Launch:
    """The single launch of every job and layer of ``plan`` (tests inspect it)."""
    prepared = backend.lay_out(plan, (all_pairs(plan),))
    jobs = plan.jobs
    return prepared.start(jobs, [j.src_rows for j in jobs], [j.dst_rows for j in jobs]).launch_set.launch_args(0)
