"""The reference copy: ``index_select`` / ``index_copy_`` per (layer, buffer).

:func:`copy_rows_ref` is THE reference that the tests and benchmarks import; the
``"torch"`` backend is the same function over a plan.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from transfer_kernels.backends.base import CopyBackend
from transfer_kernels.backends.quant_torch import TorchQuantBackend
from transfer_kernels.rows import CopyPlan


def copy_rows_ref(src_views: Sequence[Sequence[torch.Tensor]],
                  dst_views: Sequence[Sequence[torch.Tensor]],
                  src_rows: torch.Tensor, dst_rows: torch.Tensor,
                  layers: Iterable[int] | None = None) -> None:
    """``dst_views[l][b][dst_rows[i]] = src_views[l][b][src_rows[i]]`` for each layer, buffer.

    Mutates ``dst_views`` in place. Does no validation beyond what torch does. May
    synchronize when the destination is host memory and the source is on a device.

    Args:
        src_views: ``[layer][buffer]`` tensors, rows along dim 0 (any dtype/shape).
        dst_views: same nesting and row shapes as ``src_views``.
        src_rows: 1-D int64 source row indices (any device).
        dst_rows: 1-D int64 destination row indices, same length.
        layers: layers to copy; ``None`` means all.
    """
    if layers is None:
        layers = range(len(src_views))
    idx_cache: dict[tuple[torch.device, int], torch.Tensor] = {}
    for layer in layers:
        for s, d in zip(src_views[layer], dst_views[layer]):
            s_idx = _on(src_rows, s.device, idx_cache, 0)
            d_idx = _on(dst_rows, d.device, idx_cache, 1)
            # Blocking into host memory: a non-blocking D2H result must not be read early.
            rows = s.index_select(0, s_idx).to(d.device, non_blocking=d.device.type != "cpu")
            d.index_copy_(0, d_idx, rows)


def _on(rows: torch.Tensor, device: torch.device, cache: dict, slot: int) -> torch.Tensor:
    key = (device, slot)
    if key not in cache:
        cache[key] = rows.to(device, non_blocking=device.type != "cpu")
    return cache[key]


class TorchBackend(CopyBackend):
    """``"torch"``: the reference, two indexing ops per (job, layer, buffer)."""

    name = "torch"

    def _execute(self, plan: CopyPlan) -> None:
        for job in plan.jobs:
            if job.num_rows:
                copy_rows_ref(job.src.views, job.dst.views, job.src_rows, job.dst_rows,
                              job.layers)

    def _execute_group(self, plan: CopyPlan, group: Sequence[tuple[int, int]]) -> None:
        layers: dict[int, list[int]] = {}
        for j, layer in group:  # each job's rows moved to the device once per launch
            layers.setdefault(j, []).append(layer)
        for j, ls in layers.items():
            job = plan.jobs[j]
            copy_rows_ref(job.src.views, job.dst.views, job.src_rows, job.dst_rows, ls)

    def _make_quant_backend(self, device: torch.device) -> CopyBackend:
        """The reference's converting jobs run the reference too (`quant_torch`)."""
        return TorchQuantBackend()
