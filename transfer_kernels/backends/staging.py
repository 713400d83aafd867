"""Staging for the ``"dma"`` backend: which side of a job can be staged, and the chunk
layouts of its pages in a staging ring (`ring`: the rings and the DMA calls).

A staged job moves, per (host row, *chunk* of consecutive layers), the chunk's bytes — back
to back in a ``page_first`` host row — as ONE piece, into the job's own region of a staging
ring (so two jobs of one plan never share staging bytes)::

    host row r        [ layer 0 | layer 1 | ... | layer L-1 ]            span = L x RB bytes
    chunk [f, f+m)    host  r*span + f*RB, m*RB bytes
                      ring  offset(chunk) + i*k*RB         (the job's i-th row; k = chunk stride)

A chunk holds ``k = ceil(DMA_PIECE_BYTES / RB)`` layers (at most L): pieces of >= 128 KiB
run at the copy engines' limit (H100: 0.98 of one contiguous copy at 128 KiB, 0.68 at
32 KiB). A job whose layers all fall in one launch group is one chunk of whole rows. Only
layers that a launch group names are chunked: no other layer of the host or the device is
touched.

A load of a seen shape reuses its layout (``RingLayout``: every piece's staging address,
bytes and host offset, sorted by issuing group) and only fills in its host rows' addresses
(`launches.Prepared.start`: one vectorized pass). Pieces are never merged across consecutive host rows:
that would be a run analysis of every batch and a piece count that changes per batch, for
rows that are >= 32 KiB whenever ``auto`` stages them (and never straddle a pinned
registration chunk, so no piece needs cutting).

A chunk's DMA is issued by one launch group: H2D by the first group that reads any of its
layers (before that group's scatter), D2H by the group after which all of its layers are
gathered (after that group's gather).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch

from transfer_kernels import tuning
from transfer_kernels.backends.ring import Ring
from transfer_kernels.rows import Lane, LaunchGroups, PlannedJob, RowTable

ALIGN = 256  # every chunk region starts on this boundary (16-byte vectors, cache lines)


class StagedJob(NamedTuple):
    """One job's staging: its chunks (arrays, one entry per chunk) and staging table."""

    job: int  # index in the plan
    ring: str  # "h2d" (host is the source) or "d2h"
    span: int  # bytes of one host row, all layers
    row: int  # RB: bytes of one layer of one row, all buffers
    stride: int  # bytes between two rows of the job in a chunk region (k * RB)
    first: np.ndarray  # per chunk: first layer
    count: np.ndarray  # per chunk: layers
    offset: np.ndarray  # per chunk: byte offset of its region in the ring
    key: np.ndarray  # per chunk: the launch group that issues its DMA
    whole: bool  # one chunk of every layer (a piece is a whole host row)
    staging: RowTable


def host_side(job: Lane | PlannedJob, device: torch.device) -> str | None:
    """``"src"`` or ``"dst"``: the side of ``job`` whose whole pages can be staged, or
    ``None``, from its tables alone. On a CUDA copy: a ``page_span`` table in CPU memory
    facing a CUDA table; on a CPU copy: a ``page_span`` table facing one that is not (both
    contiguous: nothing to gain)."""
    for side, other in (("src", "dst"), ("dst", "src")):
        table, peer = getattr(job, side), getattr(job, other)
        if table.device.type != "cpu" or table.page_span() is None:
            continue
        if peer.device.type == "cuda" if device.type == "cuda" else peer.page_span() is None:
            return side
    return None


def page_piece_bytes(job: Lane | PlannedJob, side: str) -> int:
    """Bytes of one host row of ``job``'s layers on ``side``: its DMA piece when the job's
    layers fall in one launch group (a multi-group load cuts it into chunks of
    ``tuning.DMA_PIECE_BYTES``). Read from the table alone: never from the rows."""
    return len(job.layers) * sum(getattr(job, side).row_bytes)


def layer_groups(groups: LaunchGroups, num_jobs: int) -> list[dict[int, list[int]]]:
    """Per job: layer -> [first group, last group] naming it."""
    seen: list[dict[int, list[int]]] = [{} for _ in range(num_jobs)]
    for g, group in enumerate(groups):
        for j, layer in group:
            span = seen[j].get(layer)
            if span is None:
                seen[j][layer] = [g, g]
            else:
                span[1] = g
    return seen


def chunk_layers(layers: Sequence[int], k: int) -> list[list[int]]:
    """``[first, count]`` per chunk: each run of consecutive ``layers`` (sorted) cut into
    as few chunks of at most k layers as it needs, of even sizes (30 layers at k = 4: six
    of 4 and two of 3, not seven of 4 and one of 2: no small remainder piece)."""
    runs_: list[list[int]] = []
    for layer in layers:
        if runs_ and layer == runs_[-1][0] + runs_[-1][1]:
            runs_[-1][1] += 1
        else:
            runs_.append([layer, 1])
    out = []
    for first, length in runs_:
        parts = -(-length // k)
        for i in range(parts):
            count = length // parts + (i < length % parts)
            out.append([first, count])
            first += count
    return out


def stage_job(j: int, job: PlannedJob, side: str, seen: dict[int, list[int]], ring: Ring,
             offset: int) -> StagedJob | None:
    """The staging of ``job`` in ``ring`` from byte ``offset``; ``None`` if it does not fit.

    Args:
        seen: layer -> [first, last] group, for the layers the launch groups name.
    """
    host = getattr(job, side)
    span, row, num_layers = host.page_span()[1], sum(host.row_bytes), host.num_layers
    layers = sorted(seen)
    runs_ = chunk_layers(layers, num_layers)
    longest = max(c for _, c in runs_)
    one_group = len({g for span_ in seen.values() for g in span_}) == 1
    k = longest if one_group else min(longest, -(-tuning.DMA_PIECE_BYTES // row))
    chunks = np.asarray(chunk_layers(layers, k), dtype=np.int64).reshape(-1, 2)
    region = -(-job.num_rows * k * row // ALIGN) * ALIGN
    if offset + region * len(chunks) > ring.nbytes:
        return None
    offsets = offset + region * np.arange(len(chunks), dtype=np.int64)
    h2d = side == "src"
    keys = np.asarray([min(seen[f][0] for f in range(a, a + c)) if h2d else
                       max(seen[f][1] for f in range(a, a + c)) for a, c in chunks.tolist()],
                      dtype=np.int64)
    staging = _staging_table(host, ring, chunks, offsets, job.num_rows, k * row)
    whole = len(chunks) == 1 and int(chunks[0, 1]) == num_layers
    return StagedJob(j, "h2d" if h2d else "d2h", span, row, k * row, chunks[:, 0],
                     chunks[:, 1], offsets, keys, whole, staging)


def region_end(stage: StagedJob) -> int:
    """The ring byte after the job's last chunk region."""
    region = -(-stage.staging.num_rows * stage.stride // ALIGN) * ALIGN
    return int(stage.offset[-1]) + region


def _staging_table(host: RowTable, ring: Ring, chunks: np.ndarray, offsets: np.ndarray,
                   num_rows: int, stride: int) -> RowTable:
    """The device table of a job's chunk regions: row i of layer l of chunk c at
    ``offset[c] + i*stride + (l - first[c])*RB``; a layer no chunk holds points at the
    first region (never read or written)."""
    where = np.full(host.num_layers, offsets[0], dtype=np.int64)
    first, count = chunks[:, 0], chunks[:, 1]
    layer = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count - first, count)
    where[layer] = np.repeat(offsets - first * sum(host.row_bytes), count) + layer * sum(host.row_bytes)
    inner = np.cumsum((0,) + host.row_bytes[:-1])
    # the host's bytes, in the host's format: a job converts from (or into) an int8 staging
    return RowTable.over(ring.buffer(), where[:, None] + inner[None, :], num_rows, stride, host.row_bytes,
                         f"{host.name}.staging", codec=host.codec)


class RingLayout(NamedTuple):
    """One ring's pieces of a cached layout: a piece per (host row, chunk), sorted by the
    group that issues it. Everything but the host rows is fixed; a load fills them in."""

    ring: Ring
    jobs: tuple[int, ...]  # plan jobs whose host rows ``row`` indexes (concatenated)
    row: np.ndarray  # per piece: index into the concatenated host rows
    span: np.ndarray  # per piece: host row stride
    fixed: np.ndarray  # int64 [3, P] (dst, src, bytes); the host row holds address - row * span
    ends: tuple[int, ...]  # per group: pieces issued by then


def ring_layout(ring: Ring, stages: Sequence[tuple[StagedJob, RowTable]],
                num_groups: int, growth: int = 1) -> RingLayout:
    """The fixed part of one ring's pieces (``stages``: each with its host table), issued
    in DMA windows of groups growing by ``growth`` (:func:`window_ends`)."""
    base, at, fields = ring.base(), 0, []
    for st, host in stages:
        n, c = st.staging.num_rows, st.first.size
        rows = np.arange(n, dtype=np.int64)
        host_at = int(host.ptrs[0, 0]) + st.first * st.row  # per chunk, less row * span
        fields.append((np.tile(at + rows, c), np.repeat(host_at, n),
                       np.full(c * n, st.span, dtype=np.int64),
                       (base + st.offset[:, None] + rows[None, :] * st.stride).ravel(),
                       np.repeat(st.count * st.row, n), np.repeat(st.key, n)))
        at += n
    row, host, span, ring_addr, size, key = (np.concatenate(f) for f in zip(*fields))
    order = np.argsort(key, kind="stable")
    ends = np.searchsorted(key[order], np.arange(num_groups), side="right")
    pair = (ring_addr, host) if ring.direction == "h2d" else (host, ring_addr)
    fixed = np.stack(pair + (size,))[:, order]
    return RingLayout(ring, tuple(st.job for st, _ in stages), row[order], span[order],
                      np.ascontiguousarray(fixed),
                      window_ends(tuple(ends.tolist()), growth, ring.direction == "h2d"))


def window_ends(ends: tuple[int, ...], growth: int, h2d: bool) -> tuple[int, ...]:
    """Per group, the pieces issued by then when each DMA call covers a window of groups,
    windows growing by ``growth`` (2: groups [0], [1, 2], [3..6], ...; 1: one window per
    group, ``ends`` unchanged). H2D issues a window's pieces before its first group's
    scatter, D2H after its last group's gather: fewer DMA calls, event records and waits
    per load, while the first group still waits for its own pieces alone."""
    if growth <= 1:
        return ends
    out, start, size = list(ends), 0, 1
    while start < len(ends):
        stop = min(len(ends), start + size)
        before = ends[start - 1] if start else 0
        for g in range(start, stop):
            out[g] = ends[stop - 1] if h2d or g == stop - 1 else before
        start, size = stop, size * growth
    return tuple(out)
