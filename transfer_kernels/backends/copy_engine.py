"""The ``"copy_engine"`` backend: coalesced runs of rows, copied by DMA (CUDA) or memcpy.

A job's (src_row, dst_row) pairs are split into *runs* where both advance by 1; a run
of ``k`` rows is the block ``view[a:a+k]`` on each side (views have a uniform row
stride). Per (layer, buffer) each run becomes, on a CUDA plan::

    both sides dense (row stride == row bytes), or k == 1   one 1-D piece of k*n bytes
    strided, k >= COPY_ENGINE_2D_MIN_ROWS                     one cudaMemcpy2DAsync
    strided, shorter                                          k 1-D pieces of n bytes

and all 1-D pieces of a launch go to the runtime in ONE ``cudaMemcpyBatchAsync`` (CUDA
>= 12.8, on any stream but the legacy default one; one ``cudaMemcpyAsync`` each otherwise). A run is cut where it would cross
the start of a pinned registration chunk of either side (``RowTable.chunk_starts``):
no copy spans two registrations. On a CPU plan every run is a numpy slice assignment:
a memcpy per row with about a microsecond of overhead, several times less than a torch
``copy_`` dispatch, and no intra-op thread pool to contend for.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np
import torch

from transfer_kernels import tuning
from transfer_kernels.backends.base import CopyBackend
from transfer_kernels.backends.quant_torch import TorchQuantBackend
from transfer_kernels.backends.quant_triton import TritonQuantBackend
from transfer_kernels.cuda import cudart
from transfer_kernels.cuda.abi import triton_importable
from transfer_kernels.rows import CopyPlan, PlannedJob, RowTable


class CopyEngineBackend(CopyBackend):
    """``"copy_engine"``: DMA copies of coalesced row runs.

    Row indices on a device are copied to the CPU to find the runs, which synchronizes;
    pass CPU index tensors (the controller does).

    Attributes:
        copies: copy calls issued to the runtime (a batched call counts once).
        pieces: contiguous pieces moved (rows or runs, after cutting at chunk starts).
    """

    name = "copy_engine"

    def __init__(self, batch: bool | None = None) -> None:
        """Args:
            batch: use ``cudaMemcpyBatchAsync``; ``None`` means when the runtime has it.
        """
        super().__init__()
        self.copies = 0
        self.pieces = 0
        self._counting = threading.Lock()  # the counts stay exact under threads
        self.batch = batch

    def _make_quant_backend(self, device: torch.device) -> CopyBackend:
        """A copy cannot convert: the fused Triton kernel on CUDA when triton is importable,
        else the pure-torch reference."""
        if device.type == "cuda" and triton_importable():
            return TritonQuantBackend()
        return TorchQuantBackend()

    def _execute(self, plan: CopyPlan) -> None:
        self._copy([(job, job.layers) for job in plan.jobs if job.num_rows and job.layers],
                   plan.device)

    def _execute_group(self, plan: CopyPlan, group: Sequence[tuple[int, int]]) -> None:
        self._copy([(plan.jobs[j], (layer,)) for j, layer in group], plan.device)

    def _copy(self, parts: list[tuple[PlannedJob, Sequence[int]]], device: torch.device) -> None:
        """One launch: the given layers of each (non-empty) job."""
        if device.type != "cuda":
            for job, layers in parts:
                self._copy_job_cpu(job, layers)
            return
        stream = torch.cuda.current_stream(device).cuda_stream
        pieces: list[np.ndarray] = []
        for job, layers in parts:
            pieces += self._copy_job_cuda(job, layers, stream, cudart)
        if pieces:
            dst, src, size = np.concatenate(pieces, axis=1)
            self.add(0, len(size))
            # The batched call refuses the legacy default stream (handle 0).
            use_batch = stream != 0 and (cudart.batch_available() if self.batch is None else self.batch)
            if use_batch:
                cudart.memcpy_batch_async(dst, src, size, stream)
                self.add(1, 0)
            else:
                for d, s, n in zip(dst.tolist(), src.tolist(), size.tolist()):
                    cudart.memcpy_async(d, s, n, stream)
                self.add(len(size), 0)

    def _copy_job_cuda(self, job: PlannedJob, layers: Sequence[int], stream: int,
                       cudart) -> list[np.ndarray]:
        """Issue the 2-D copies of ``layers`` of the job; return its 1-D pieces as
        ``[3, n]`` (dst, src, bytes)."""
        runs = job.runs()
        starts = np.asarray(runs.src_starts, dtype=np.int64), np.asarray(runs.dst_starts, dtype=np.int64)
        lengths = np.asarray(runs.lengths, dtype=np.int64)
        src, dst = job.src, job.dst
        out = []
        for layer in layers:
            for b, nbytes in enumerate(src.row_bytes):
                s0, d0, k = cut_at_chunks(src, dst, layer, b, *starts, lengths)
                s_addr = int(src.ptrs[layer, b]) + s0 * src.row_strides[b]
                d_addr = int(dst.ptrs[layer, b]) + d0 * dst.row_strides[b]
                dense = src.row_strides[b] == nbytes and dst.row_strides[b] == nbytes
                if dense:
                    out.append(np.stack([d_addr, s_addr, k * nbytes]))
                    continue
                wide = k >= tuning.COPY_ENGINE_2D_MIN_ROWS
                for d, s, h in zip(d_addr[wide].tolist(), s_addr[wide].tolist(), k[wide].tolist()):
                    cudart.memcpy_2d_async(d, dst.row_strides[b], s, src.row_strides[b],
                                           nbytes, h, stream)
                self.add(int(wide.sum()), int(wide.sum()))
                out.append(_rows_of(d_addr[~wide], s_addr[~wide], k[~wide], nbytes,
                                    src.row_strides[b], dst.row_strides[b]))
        return out

    def _copy_job_cpu(self, job: PlannedJob, layers: Sequence[int]) -> None:
        """CPU plan: numpy slice assignments (memcpy per row) over the runs of ``layers``."""
        runs = list(zip(*job.runs()))
        for layer in layers:
            for s_view, d_view in zip(job.src.views[layer], job.dst.views[layer]):
                s_np, d_np = s_view.numpy(), d_view.numpy()
                for s, d, k in runs:
                    d_np[d:d + k] = s_np[s:s + k]
        self.add(len(runs) * len(layers) * job.src.num_buffers, len(runs) * len(layers) * job.src.num_buffers)

    def add(self, copies: int, pieces: int) -> None:
        """Count ``copies`` calls and ``pieces`` moved (safe from any number of threads)."""
        with self._counting:
            self.copies += copies
            self.pieces += pieces


def _rows_of(d_addr: np.ndarray, s_addr: np.ndarray, k: np.ndarray, nbytes: int,
             s_stride: int, d_stride: int) -> np.ndarray:
    """Every row of strided runs as a 1-D piece: ``[3, sum(k)]`` (dst, src, bytes)."""
    total = int(k.sum())
    run = np.repeat(np.arange(len(k)), k)
    within = np.arange(total) - np.repeat(np.cumsum(k) - k, k)
    return np.stack([d_addr[run] + within * d_stride, s_addr[run] + within * s_stride,
                     np.full(total, nbytes, dtype=np.int64)])


def cut_at_chunks(src: RowTable, dst: RowTable, layer: int, b: int, s0: np.ndarray,
                   d0: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut runs so that none crosses a registration chunk start of either side."""
    for by_src in (True, False):
        table, first = (src, s0) if by_src else (dst, d0)
        if table.chunk_starts is None or len(table.chunk_starts) < 2:
            continue
        base, stride = int(table.ptrs[layer, b]), table.row_strides[b]
        edges = table.chunk_starts[1:]
        chunk = np.searchsorted(edges, base + first * stride, side="right")
        last = np.searchsorted(edges, base + (first + k - 1) * stride, side="right")
        if (chunk == last).all():
            continue
        s0, d0, k = _split(s0, d0, k, by_src, base, stride, edges, chunk, last)
    return s0, d0, k


def _split(s0, d0, k, by_src: bool, base: int, stride: int, edges: np.ndarray,
           chunk: np.ndarray, last: np.ndarray):
    """Split each crossing run at the first row after every chunk start it contains."""
    out_s, out_d, out_k = [], [], []
    for i in range(len(k)):
        s, d, n = int(s0[i]), int(d0[i]), int(k[i])
        first = s if by_src else d
        for e in edges[chunk[i]:last[i]].tolist():
            cut = -(-(e - base) // stride) - first  # rows of this run before the edge
            out_s.append(s), out_d.append(d), out_k.append(cut)
            s, d, n, first = s + cut, d + cut, n - cut, first + cut
        out_s.append(s), out_d.append(d), out_k.append(n)
    return (np.asarray(out_s, dtype=np.int64), np.asarray(out_d, dtype=np.int64),
            np.asarray(out_k, dtype=np.int64))
