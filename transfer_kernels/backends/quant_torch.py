"""The pure-torch quantized copy: `quant.reference` over gathered rows (the reference backend of
converting jobs, and the path of every backend that cannot convert on a CPU plan).

D2H: gather the device rows (``index_select``), quantize where they are, move the int8
values and fp32 scales to the host, scatter them (``index_copy_``). H2D: gather the host
rows, move them to the device, dequantize there, scatter. One pass per (job, layer, device
buffer); the bytes are `quant.reference`'s by construction.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from transfer_kernels.backends.base import CopyBackend
from transfer_kernels.quant.codec import Int8Codec
from transfer_kernels.quant.reference import dequantize_int8_ref, quantize_int8_ref
from transfer_kernels.rows import CopyPlan, PlannedJob


class TorchQuantBackend(CopyBackend):
    """``"torch"`` for converting jobs: `quant.reference` per (job, layer, device buffer)."""

    name = "torch_quant"
    converts = True

    def _execute(self, plan: CopyPlan) -> None:
        for job in plan.jobs:
            if job.num_rows:
                convert_job(job, job.layers)

    def _execute_group(self, plan: CopyPlan, group: Sequence[tuple[int, int]]) -> None:
        for j, layer in group:
            convert_job(plan.jobs[j], (layer,))


def convert_job(job: PlannedJob, layers: Iterable[int]) -> None:
    """Quantize or dequantize ``job``'s rows for ``layers`` (its mode says which)."""
    if job.mode == "quantize":
        codec, dev, host = job.dst.codec, job.src, job.dst
        dev_rows, host_rows = job.src_rows, job.dst_rows
    else:
        codec, dev, host = job.src.codec, job.dst, job.src
        dev_rows, host_rows = job.dst_rows, job.src_rows
    dev_idx = dev_rows.to(dev.device, non_blocking=dev.device.type != "cpu")
    host_idx = host_rows.to(host.device, non_blocking=host.device.type != "cpu")
    for layer in layers:
        for b in range(len(codec.elems)):
            d_view = dev.views[layer][b]
            q_view, s_view = host.views[layer][2 * b], host.views[layer][2 * b + 1]
            if job.mode == "quantize":
                _quantize(codec, b, d_view, dev_idx, q_view, s_view, host_idx)
            else:
                _dequantize(codec, b, d_view, dev_idx, q_view, s_view, host_idx)


def _vectors(codec: Int8Codec, b: int, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gathered byte rows ``[n, bytes]`` as ``[n, vectors, vec]`` of ``dtype``."""
    return rows.view(dtype).view(rows.shape[0], codec.elems[b] // codec.vecs[b], codec.vecs[b])


def _quantize(codec: Int8Codec, b: int, d_view: torch.Tensor, dev_idx: torch.Tensor,
              q_view: torch.Tensor, s_view: torch.Tensor, host_idx: torch.Tensor) -> None:
    x = _vectors(codec, b, d_view.index_select(0, dev_idx), codec.dtype)
    q, s = quantize_int8_ref(x)
    n = host_idx.numel()
    # Blocking D2H: the host rows must hold the values once this returns.
    q_view.index_copy_(0, host_idx, q.view(n, -1).view(torch.uint8).to(q_view.device))
    s_view.index_copy_(0, host_idx, s.view(n, -1).view(torch.uint8).to(s_view.device))


def _dequantize(codec: Int8Codec, b: int, d_view: torch.Tensor, dev_idx: torch.Tensor,
                q_view: torch.Tensor, s_view: torch.Tensor, host_idx: torch.Tensor) -> None:
    dev = d_view.device
    q = _vectors(codec, b, q_view.index_select(0, host_idx), torch.int8).to(dev)
    s = s_view.index_select(0, host_idx).view(torch.float32).to(dev)
    x = dequantize_int8_ref(q, s.view(q.shape[:-1]), codec.dtype)
    d_view.index_copy_(0, dev_idx, x.view(dev_idx.numel(), -1).view(torch.uint8))
