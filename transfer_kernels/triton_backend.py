"""The ``"triton"`` backend: one persistent-grid kernel launch per plan or launch group.

Host memory is read and written by the SMs directly through unified addressing: a
pinned (``cudaHostAlloc``/``pin_memory``) host view's ``data_ptr`` is a valid device
address, as is ``cudaHostRegister``'ed memory whose device pointer equals its host
pointer (checked when hicache pins a reservation). A plan on CPU tensors runs the same
kernel under the Triton interpreter, whether or not the machine has a GPU.

Preparation builds the segment descriptors of every launch group at once (numpy over all
segments, O(jobs) Python), packs them with every job's row indices into one int64 buffer
and moves it to the device in one copy; each launch is then a slice ``[seg_begin,
seg_end)`` of that buffer. The per-table (base, stride) descriptors and per-(layer,
buffer) segment fields are cached on the tables; flattened launch groups per groups value.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from transfer_kernels import tuning
from transfer_kernels.base import CopyBackend, PreparedPlan
from transfer_kernels.plan import CopyPlan, LaunchGroups
from transfer_kernels.table import RowTable

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
        self._last: tuple[LaunchSet, int] | None = None  # the latest launch, for tests

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

    @property
    def last_launch(self) -> Launch | None:
        """The latest kernel launch's arguments (for tests), or ``None`` before any."""
        return None if self._last is None else self._last[0].launch_args(self._last[1])

    def _execute(self, plan: CopyPlan) -> None:
        TritonLaunches(self, _build_all_layers(plan, self._grid_cap(plan), self.tile_bytes)).run(0)

    def prepare(self, plan: CopyPlan, groups: LaunchGroups) -> PreparedPlan:
        """All groups' descriptors and indices staged in one copy; each launch a slice."""
        self.check(plan)
        return TritonLaunches(self, _build_groups(plan, groups, self._grid_cap(plan),
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


class LaunchSet(NamedTuple):
    """The launches of several groups sharing one ``meta`` buffer: group ``g`` is the
    segment range ``bounds[g] .. bounds[g + 1]`` with grid ``grids[g]``."""

    meta: torch.Tensor
    bounds: list[int]  # num_groups + 1 segment offsets
    grids: list[int]
    block: int
    num_warps: int

    def launch_args(self, group: int) -> Launch:
        return Launch(self.meta, self.bounds[group], self.bounds[group + 1], self.grids[group],
                      self.block, self.num_warps)


class TritonLaunches(PreparedPlan):
    """Prepared launches: one staged ``meta`` buffer, one (segment range, grid) per group.
    A launch reads its range and grid from lists: no per-launch object is built."""

    def __init__(self, backend: TritonBackend, launch_set: LaunchSet) -> None:
        self.backend, self.launch_set = backend, launch_set
        self._kernel = None

    @property
    def num_groups(self) -> int:
        return len(self.launch_set.grids)

    @property
    def launches(self) -> list[Launch]:
        """Every group's launch arguments (for tests and inspection)."""
        return [self.launch_set.launch_args(g) for g in range(self.num_groups)]

    def launch(self, group: int) -> None:
        bounds = self.launch_set.bounds
        if bounds[group + 1] > bounds[group]:
            self.backend.launches += 1
            self.run(group)

    def run(self, group: int) -> None:
        """Launch group ``group`` (no counting; ``execute`` counted already)."""
        ls = self.launch_set
        begin, end = ls.bounds[group], ls.bounds[group + 1]
        if end > begin:
            if self._kernel is None:
                self._kernel = kernel_module().launch_copy_rows
            self.backend._last = (ls, group)
            self._kernel(ls.meta, begin, end, ls.grids[group], ls.block, ls.num_warps)


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
    return _build_all_layers(plan, max_programs, tile_bytes).launch_args(0)


def _build_all_layers(plan: CopyPlan, max_programs: int, tile_bytes: int) -> LaunchSet:
    def pairs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        jobs = np.repeat(np.arange(len(plan.jobs), dtype=np.int64), [len(j.layers) for j in plan.jobs])
        layers = np.fromiter(itertools.chain.from_iterable(j.layers for j in plan.jobs), np.int64,
                             jobs.size)
        return jobs, layers, np.zeros(jobs.size, dtype=np.int64)

    return _build(plan, pairs, ("all layers", tuple(j.layers for j in plan.jobs)), 1,
                  max_programs, tile_bytes)


def _build_groups(plan: CopyPlan, groups: LaunchGroups, max_programs: int,
                  tile_bytes: int) -> LaunchSet:
    """Segment table and indices of every group in one buffer on the plan's device.

    Segments are laid out group after group; within a group, in the order its
    ``(job, layer)`` pairs are listed, buffers innermost. Each job's row indices are
    stored once and shared by all its segments.
    """
    try:  # hashable groups (the controller's are cached tuples): laid out once
        hash(groups)
        key = ("groups", groups)
    except TypeError:
        key = None
    return _build(plan, lambda: _pair_arrays(groups), key, len(groups), max_programs, tile_bytes)


def _pair_arrays(groups: LaunchGroups) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (job, layer) pair of ``groups`` flattened: job, layer and group per pair."""
    flat = [pair for group in groups for pair in group]
    pairs = np.asarray(flat, dtype=np.int64).reshape(-1, 2)
    sizes = np.fromiter(map(len, groups), np.int64, len(groups))
    return pairs[:, 0], pairs[:, 1], np.repeat(np.arange(len(groups), dtype=np.int64), sizes)


class _Lru:
    """A small thread-safe LRU map (the layout caches below)."""

    def __init__(self, size: int) -> None:
        self.size, self.items, self.lock = size, OrderedDict(), threading.Lock()

    def get(self, key: tuple) -> Any:
        with self.lock:
            value = self.items.get(key)
            if value is not None:
                self.items.move_to_end(key)
            return value

    def put(self, key: tuple, value: Any) -> None:
        with self.lock:
            self.items[key] = value
            if len(self.items) > self.size:
                self.items.popitem(last=False)


# Launch layouts cached at two levels; tables are keyed by weak reference, so no cache keeps
# a pool alive and a dead table's entry never matches a new one.
#   shape:  everything but the row indices, for a batch of the same tables, pairs and row
#           counts (a scheduler's steady state): a hit only stages the rows;
#   static: what does not depend on row counts (descriptors, sizes, order, tiling), for the
#           same tables and pairs: a hit computes the row-count fields of the segments.
_SHAPES = _Lru(256)
_STATICS = _Lru(256)


def _build(plan: CopyPlan, pairs: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray]],
           pairs_key: tuple | None, num_groups: int, max_programs: int, tile_bytes: int) -> LaunchSet:
    """The launches of ``num_groups`` groups whose flat (job, layer, group) arrays ``pairs()``
    returns; layouts are reused when ``pairs_key`` and the jobs' tables were seen before."""
    jobs = plan.jobs
    tables = None if pairs_key is None else \
        (pairs_key, num_groups, tile_bytes, plan.device,
         tuple((weakref.ref(j.src), weakref.ref(j.dst)) for j in jobs))
    rows = tuple(j.num_rows for j in jobs)
    shape_key = None if tables is None else (tables, rows, max_programs)
    layout = None if shape_key is None else _SHAPES.get(shape_key)
    if layout is None:
        block, warps = launch_config(plan, tile_bytes)
        static_key = None if tables is None else (tables, tuple(r > 0 for r in rows), block)
        static = None if static_key is None else _STATICS.get(static_key)
        if static is None:
            static = _static_layout(plan, pairs(), num_groups, block, warps)
            if static_key is not None:
                _STATICS.put(static_key, static)
        layout = _sized_layout(static, np.asarray(rows, dtype=np.int64), max_programs)
        if shape_key is not None:
            _SHAPES.put(shape_key, layout)
    seg, used, bounds, grids, block, warps = layout
    if seg is None:
        return LaunchSet(torch.empty(0, dtype=torch.int64), bounds, grids, block, warps)
    idx_parts = [t for j in used for t in (jobs[j].src_rows, jobs[j].dst_rows)]
    meta = _to_device([seg] + idx_parts, plan.device)  # seg is never written: a cached copy
    return LaunchSet(meta, bounds, grids, block, warps)


class _Static(NamedTuple):
    """The row-count-free part of a launch set's layout (see `_static_layout`)."""

    seg: np.ndarray | None  # [segments, SEG_FIELDS]: fields 0-3, 7, 8 filled
    seg_job: np.ndarray  # each segment's job
    used: np.ndarray  # jobs with segments, ascending
    per_item: np.ndarray  # rows per work item of each segment (block // span)
    bounds: np.ndarray  # num_groups + 1 segment offsets
    block: int
    warps: int


def _static_layout(plan: CopyPlan, pairs: tuple[np.ndarray, np.ndarray, np.ndarray], num_groups: int,
                   block: int, warps: int) -> _Static:
    """Every segment of every group at once (numpy over all segments, O(jobs) Python):
    descriptors, row bytes, alignment and tiling. Depends on the jobs' tables, which jobs
    have rows and the tile, never on row counts or row values."""
    jobs = plan.jobs
    has_rows = np.fromiter((j.num_rows > 0 for j in jobs), np.bool_, len(jobs))
    job, layer, group = pairs
    keep = has_rows[job]
    if not keep.all():
        job, layer, group = job[keep], layer[keep], group[keep]
    if not job.size:
        empty = np.empty(0, dtype=np.int64)
        return _Static(None, empty, empty, empty, np.zeros(num_groups + 1, dtype=np.int64), block, warps)
    used = np.flatnonzero(np.bincount(job, minlength=len(jobs)))  # jobs with segments
    src = np.concatenate([_side(jobs[j].src, plan.device) for j in used])
    dst = np.concatenate([_side(jobs[j].dst, plan.device) for j in used])
    # Row (layer * buffers + buffer) of job j's side table sits at base[j] in src / dst.
    nbuf = np.fromiter((j.src.num_buffers for j in jobs), np.int64, len(jobs))
    nlay = np.fromiter((j.src.num_layers for j in jobs), np.int64, len(jobs))
    base = np.zeros(len(jobs), dtype=np.int64)
    base[used] = np.cumsum(nbuf[used] * nlay[used]) - nbuf[used] * nlay[used]
    per_pair = nbuf[job]
    total = int(per_pair.sum())
    pair_first = np.cumsum(per_pair) - per_pair  # each pair's first segment
    order = np.repeat(base[job] + layer * per_pair - pair_first, per_pair) + np.arange(total)
    src, dst = src[order], dst[order]
    nbytes = src[:, 1]
    span = np.minimum(block, 1 << np.ceil(np.log2(nbytes)).astype(np.int64))
    seg = np.empty((total, SEG_FIELDS), dtype=np.int64)
    seg[:, 0], seg[:, 1], seg[:, 2] = src[:, 0], dst[:, 0], nbytes
    seg[:, 3] = np.gcd(src[:, 2], dst[:, 2])
    seg[:, 7] = np.log2(span).astype(np.int64)
    seg[:, 8] = -(-nbytes // span)  # chunks of a row
    bounds = np.zeros(num_groups + 1, dtype=np.int64)
    bounds[1:] = np.cumsum(np.bincount(group, weights=per_pair, minlength=num_groups).astype(np.int64))
    return _Static(seg, np.repeat(job, per_pair), used, block // span, bounds, block, warps)


def _sized_layout(static: _Static, rows: np.ndarray, max_programs: int) -> tuple:
    """``(segment table (flat int64 tensor, never written), used jobs, bounds, grids, block,
    warps)``: the static layout completed with the row counts (where each job's rows sit
    in the meta buffer, rows per segment, work items and each launch's grid)."""
    num_groups = static.bounds.size - 1
    if static.seg is None:
        return None, (), (0,) * (num_groups + 1), (1,) * num_groups, static.block, static.warps
    seg, used, seg_job = static.seg.copy(), static.used, static.seg_job
    idx_at = np.zeros(rows.size, dtype=np.int64)  # each used job's rows in meta
    idx_at[used] = seg.shape[0] * SEG_FIELDS + np.cumsum(2 * rows[used]) - 2 * rows[used]
    n = rows[seg_job]
    seg[:, 4] = idx_at[seg_job]
    seg[:, 5] = seg[:, 4] + n
    seg[:, 6] = n
    seg[:, 9] = -(-n // static.per_item) * seg[:, 8]  # item count; _deal_items makes it 'first'
    grids = _deal_items(seg, static.bounds, max_programs)
    return (torch.from_numpy(seg.reshape(-1)), tuple(used.tolist()), tuple(static.bounds.tolist()),
            tuple(grids.tolist()), static.block, static.warps)


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


def _side(table: RowTable, device: torch.device) -> np.ndarray:
    """``[num_layers * num_buffers, 3]`` int64 per (layer, buffer), layer-major: descriptor
    address on ``device``, row bytes, alignment. Cached on the table (it never changes)."""
    key = ("segment_side", str(device))
    side = table._cache.get(key)
    if side is None:
        nl, nb = table.num_layers, table.num_buffers
        side = np.empty((nl * nb, 3), dtype=np.int64)
        side[:, 0] = table.device_desc(device).data_ptr() + np.arange(nl * nb, dtype=np.int64) * 16
        side[:, 1] = np.tile(np.asarray(table.row_bytes, dtype=np.int64), nl)
        side[:, 2] = table.align.numpy().reshape(-1)
        table._cache[key] = side
    return side


def _to_device(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Concatenate int64 CPU/device parts into one tensor on ``device`` with one copy."""
    if device.type == "cpu":
        return torch.cat(parts)
    if all(p.device.type == "cpu" for p in parts):
        staged = torch.empty(sum(p.numel() for p in parts), dtype=torch.int64, pin_memory=True)
        torch.cat(parts, out=staged)
        return staged.to(device, non_blocking=True)
    return torch.cat([p.to(device, non_blocking=True) for p in parts])
