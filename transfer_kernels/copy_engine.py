"""The ``"copy_engine"`` backend: coalesced runs of rows, one async copy per run.

A job's (src_row, dst_row) pairs are split into *runs* where both advance by 1; a run
of ``k`` rows is the block ``view[a:a+k]`` on each side (views have a uniform row
stride). Per (layer, buffer) each run becomes::

    both blocks dense (k == 1 or row stride == row bytes)   one copy_(non_blocking)
    a strided block, CPU plan                               one copy_ (strided memcpy)
    a strided block, CUDA plan                              one copy_ per row
    any block, CPU plan                                     one numpy slice assignment

The CUDA strided case avoids torch's cross-device copy of a non-contiguous tensor, which
stages through a pageable temporary (synchronous for D2H). On CPU every run is a numpy
slice assignment: a memcpy per row with about a microsecond of overhead, several times
less than a torch ``copy_`` dispatch, and no intra-op thread pool to contend for.
"""
from __future__ import annotations

import torch

from transfer_kernels.base import CopyBackend
from transfer_kernels.plan import CopyPlan, PlannedJob


class CopyEngineBackend(CopyBackend):
    """``"copy_engine"``: DMA copies (``cudaMemcpyAsync``) of coalesced row runs.

    Row indices on a device are copied to the CPU to find the runs, which synchronizes;
    pass CPU index tensors (the controller does).
    """

    name = "copy_engine"

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0  # copy_ calls issued, for benchmarks and tests

    def _execute(self, plan: CopyPlan) -> None:
        on_cuda = plan.device.type == "cuda"
        for job in plan.jobs:
            if job.num_rows and job.layers:
                self.copies += _copy_job(job, on_cuda)


def _copy_job(job: PlannedJob, on_cuda: bool) -> int:
    """Copy one job run by run; returns the number of ``copy_`` calls."""
    src_starts, dst_starts, lengths = job.runs()
    if not on_cuda:
        return _copy_job_cpu(job, list(zip(src_starts, dst_starts, lengths)))
    copies = 0
    for b in range(job.src.num_buffers):
        dense = all(t.row_strides[b] == t.row_bytes[b] for t in (job.src, job.dst))
        per_row = on_cuda and not dense
        for layer in job.layers:
            s_view, d_view = job.src.views[layer][b], job.dst.views[layer][b]
            for s, d, k in zip(src_starts, dst_starts, lengths):
                copies += _copy_run(s_view, d_view, s, d, k, per_row)
    return copies


def _copy_job_cpu(job: PlannedJob, runs: list[tuple[int, int, int]]) -> int:
    """CPU plan: numpy slice assignments (memcpy per row) over the runs."""
    for layer in job.layers:
        for s_view, d_view in zip(job.src.views[layer], job.dst.views[layer]):
            s_np, d_np = s_view.numpy(), d_view.numpy()
            for s, d, k in runs:
                d_np[d:d + k] = s_np[s:s + k]
    return len(runs) * len(job.layers) * job.src.num_buffers


def _copy_run(s_view: torch.Tensor, d_view: torch.Tensor, s: int, d: int, k: int,
              per_row: bool) -> int:
    if k == 1 or not per_row:
        d_view[d:d + k].copy_(s_view[s:s + k], non_blocking=True)
        return 1
    for i in range(k):
        d_view[d + i].copy_(s_view[s + i], non_blocking=True)
    return k
