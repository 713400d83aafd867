"""Launch layouts of the triton backend: segment and program tables, built with numpy.

A *layout* is everything a set of launches reads besides the row indices: the segment
table (`transfer_kernels.cuda.copy_kernel`'s module docstring) and, per launch, the program
table that deals its items into contiguous ranges. It is built for every launch group of
a size class at once (numpy over all segments, O(jobs) Python), in two steps:

    static  (`Static`) addresses, strides, row bytes, alignment and order of the segments:
            fixed by the jobs' tables, their (job, layer) pairs in launch order and which
            jobs have rows. Neither the row counts nor where the groups are cut enter it,
            so a route's size classes share it: a new class's layout takes the static of
            another class of its route (the route offers one, `Route.prepare`) when it
            `fits`, else builds its own;
    sized   each launch's alignment and vectors per row (where its groups are cut), then
            the row counts: where each job's rows sit in meta, items per segment, each
            launch's grid and program table.

The route keeps the result for the size class (`route.Route`); nothing here keeps anything.

Each launch runs at the largest of 16, 8, 4 or 1 bytes dividing every address, stride
and row size of its segments (every pool of the shipped models is 16-byte aligned; an odd
scale buffer slows its launch, it is never split off into another one).
"""
from __future__ import annotations

import weakref
from itertools import accumulate
from typing import NamedTuple

import numpy as np
import torch

from transfer_kernels.cuda.abi import SEG_FIELDS, magic
from transfer_kernels.rows import CopyPlan, LaunchGroups, RowTable
from transfer_kernels.rows.table import MAX_VECTOR_BYTES


class Static(NamedTuple):
    """The row-count-free, cut-free part of a layout, with the facts it was built from."""

    tables: tuple[weakref.ref, ...]  # each job's src, then dst (weakly: keeps no pool alive)
    pairs: list[tuple[int, int]]  # every group's (job, layer) pairs, in launch order
    has_rows: tuple[bool, ...]  # per job
    seg: np.ndarray | None  # [segments, SEG_FIELDS]: fields 0-3 filled; 4-6 too if ``wide``
    seg_job: np.ndarray  # each segment's job
    used: np.ndarray  # jobs with segments, ascending
    seg_at: np.ndarray  # per pair, and the end: segments before it (a cut's segment offset)
    row_bytes: np.ndarray  # per segment
    seg_align: np.ndarray  # per segment: the widest vector its addresses, stride and size allow
    wide: bool  # every segment takes 16-byte vectors: fields 4-6 hold them, for any cut

    def fits(self, plan: CopyPlan, pairs: list[tuple[int, int]], has_rows: tuple[bool, ...]) -> bool:
        """True when ``plan`` with these pairs and jobs with rows is what this was built
        from (the same table objects): a layout from it is the one built from scratch."""
        if has_rows != self.has_rows or pairs != self.pairs:
            return False
        tables = self.tables
        return all(tables[2 * i]() is j.src and tables[2 * i + 1]() is j.dst
                   for i, j in enumerate(plan.jobs))


class Layout(NamedTuple):
    """A complete layout; ``head`` is the segment and program tables (never written)."""

    head: torch.Tensor | None  # flat int64: segments, then every launch's program table
    used: tuple[int, ...]  # jobs whose rows follow, in this order
    bounds: tuple[int, ...]  # num_groups + 1 segment offsets
    grids: tuple[int, ...]  # programs per group (0: nothing to launch)
    prog_at: tuple[int, ...]  # per group: its program table's offset in meta
    aligns: tuple[int, ...]


def layout(plan: CopyPlan, groups: LaunchGroups, max_programs: int, vpt: int,
           like: Static | None = None) -> tuple[Static, Layout]:
    """The layout of one launch per group of ``groups`` (per launch, its ``(job, layer)``
    pairs) for ``plan``'s tables and row counts, and its static part: ``like`` when it
    fits (`Static.fits`), else built now."""
    jobs = plan.jobs
    pairs = [pair for group in groups for pair in group]
    has_rows = tuple([j.num_rows > 0 for j in jobs])
    static = like if like is not None and like.fits(plan, pairs, has_rows) else \
        static_layout(plan, pairs, has_rows)
    cuts = np.fromiter(accumulate(map(len, groups), initial=0), np.int64, len(groups) + 1)
    rows = np.fromiter((j.num_rows for j in jobs), np.int64, len(jobs))
    return static, sized_layout(static, cuts, rows, max_programs, vpt)


def static_layout(plan: CopyPlan, pairs: list[tuple[int, int]], has_rows: tuple[bool, ...]) -> Static:
    """Every segment of ``pairs`` (flattened launch groups) at once, in launch order:
    addresses, strides, row bytes, alignment. Depends on the jobs' tables, the pairs and
    which jobs have rows only."""
    jobs = plan.jobs
    tables = tuple(weakref.ref(t) for j in jobs for t in (j.src, j.dst))
    flat = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    job, layer = flat[:, 0], flat[:, 1]
    kept = np.asarray(has_rows, dtype=np.bool_)[job]
    if not kept.any():
        empty = np.empty(0, dtype=np.int64)
        return Static(tables, pairs, has_rows, None, empty, empty, empty, empty, empty, True)
    seg_at = np.zeros(job.size + 1, dtype=np.int64)
    if not kept.all():
        job, layer = job[kept], layer[kept]
    used = np.flatnonzero(np.bincount(job, minlength=len(jobs)))  # jobs with segments
    src = np.concatenate([_side(jobs[j].src) for j in used])
    dst = np.concatenate([_side(jobs[j].dst) for j in used])
    # Row (layer * buffers + buffer) of job j's side table sits at base[j] in src / dst.
    nbuf = np.fromiter((j.src.num_buffers for j in jobs), np.int64, len(jobs))
    nlay = np.fromiter((j.src.num_layers for j in jobs), np.int64, len(jobs))
    base = np.zeros(len(jobs), dtype=np.int64)
    base[used] = np.cumsum(nbuf[used] * nlay[used]) - nbuf[used] * nlay[used]
    per_pair = nbuf[job]
    seg_at[1:][kept] = per_pair  # a pair whose job has no rows has no segment
    seg_at = seg_at.cumsum()
    total = int(seg_at[-1])
    pair_first = np.cumsum(per_pair) - per_pair  # each pair's first segment
    order = np.repeat(base[job] + layer * per_pair - pair_first, per_pair) + np.arange(total)
    src, dst = src[order], dst[order]
    seg_align = np.minimum(src[:, 3], dst[:, 3])  # both powers of two <= 16
    seg = np.zeros((total, SEG_FIELDS), dtype=np.int64)  # fields 4-11: the sized step's
    seg[:, 0], seg[:, 1], seg[:, 2], seg[:, 3] = src[:, 0], src[:, 1], dst[:, 0], dst[:, 1]
    wide = bool((seg_align == MAX_VECTOR_BYTES).all())
    if wide:  # every launch runs 16-byte vectors, wherever the groups are cut
        _vectors(seg, src[:, 2] // MAX_VECTOR_BYTES)
    return Static(tables, pairs, has_rows, seg, np.repeat(job, per_pair), used, seg_at,
                  src[:, 2], seg_align, wide)


def sized_layout(static: Static, cuts: np.ndarray, rows: np.ndarray, max_programs: int,
                 vpt: int) -> Layout:
    """The static layout cut into launches (launch ``g``: pairs ``cuts[g]`` to
    ``cuts[g + 1]``) and completed with the row counts: each launch's alignment and vectors
    per row, where each job's rows sit in meta, vectors and items per segment, each
    launch's grid and program table."""
    num_groups = cuts.size - 1
    aligns = np.full(num_groups, MAX_VECTOR_BYTES, dtype=np.int64)
    if static.seg is None:
        zeros = (0,) * num_groups
        return Layout(None, (), (0,) * (num_groups + 1), zeros, zeros, tuple(aligns.tolist()))
    bounds = static.seg_at[cuts]
    counts = bounds[1:] - bounds[:-1]  # segments per launch
    seg, used, seg_job = static.seg.copy(), static.used, static.seg_job
    if not static.wide:
        live = np.flatnonzero(counts)
        aligns[live] = np.minimum.reduceat(static.seg_align, bounds[live])
        aligns[aligns == 2] = 1  # one kernel each for 16, 8, 4 and 1 bytes
        _vectors(seg, static.row_bytes // np.repeat(aligns, counts))
    n = rows[seg_job]
    seg[:, 9] = n * seg[:, 4]
    items = -(-seg[:, 9] // vpt)
    done = np.concatenate(([0], np.cumsum(items)))  # items before each segment (global)
    group_first = done[bounds[:-1]]
    per_group = done[bounds[1:]] - group_first
    seg[:, 10] = done[:-1] - np.repeat(group_first, counts)
    seg[:, 11] = seg[:, 10] + items
    grids = np.minimum(max_programs, per_group)
    table, table_at = _program_tables(done, group_first, per_group, grids)
    head_len = seg.size + table.size
    idx_at = np.zeros(rows.size, dtype=np.int64)  # each used job's rows in meta
    idx_at[used] = head_len + np.cumsum(2 * rows[used]) - 2 * rows[used]
    seg[:, 7] = idx_at[seg_job]
    seg[:, 8] = seg[:, 7] + n
    head = torch.from_numpy(np.concatenate([seg.reshape(-1), table]))
    return Layout(head, tuple(used.tolist()), tuple(bounds.tolist()), tuple(grids.tolist()),
                  tuple((seg.size + table_at).tolist()), tuple(aligns.tolist()))


def _vectors(seg: np.ndarray, vpr: np.ndarray) -> None:
    """Fill fields 4-6: vectors per row and its division magic."""
    seg[:, 4] = vpr
    seg[:, 5], seg[:, 6] = magic(vpr)


def _program_tables(done: np.ndarray, group_first: np.ndarray, per_group: np.ndarray,
                    grids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every launch's program table (``first[G], bounds[G + 1]``) back to back, and each
    launch's offset in it. Program ``p`` of ``G`` takes items ``[p * N // G, (p+1) * N // G)``
    of its launch's ``N`` and starts at the segment holding the first of them."""
    sizes = np.where(grids > 0, 2 * grids + 1, 0)
    table_at = np.cumsum(sizes) - sizes
    table = np.empty(int(sizes.sum()), dtype=np.int64)
    g_of = np.repeat(np.arange(grids.size), grids)
    p = np.arange(g_of.size) - np.repeat(np.cumsum(grids) - grids, grids)  # within its launch
    its_grid, at = grids[g_of], table_at[g_of] + p  # per program: its launch's grid, its entry
    lo = p * per_group[g_of] // its_grid  # each program's first item in its launch
    # segments' global item ends are strictly increasing: the first segment ending after lo
    table[at] = np.searchsorted(done[1:], group_first[g_of] + lo, side="right")
    table[at + its_grid] = lo
    live = grids > 0
    table[table_at[live] + 2 * grids[live]] = per_group[live]
    return table, table_at


def _side(table: RowTable) -> np.ndarray:
    """``[num_layers * num_buffers, 4]`` int64 per (layer, buffer), layer-major: base
    address, row stride, row bytes, alignment. Cached on the table (it never changes)."""
    return table.derived("segment_side", _build_side)


def _build_side(table: RowTable) -> np.ndarray:
    nl, nb = table.num_layers, table.num_buffers
    side = np.empty((nl * nb, 4), dtype=np.int64)
    side[:, 0] = table.ptrs.numpy().reshape(-1)
    side[:, 1] = np.tile(np.asarray(table.row_strides, dtype=np.int64), nl)
    side[:, 2] = np.tile(np.asarray(table.row_bytes, dtype=np.int64), nl)
    side[:, 3] = table.align.numpy().reshape(-1)
    return side
