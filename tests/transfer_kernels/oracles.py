"""Test-only oracles of the transfer layer: the plan an internal caller would build
without checks, and a table's (base, row stride) descriptor on a device."""
from __future__ import annotations

from typing import Iterable

import torch

from transfer_kernels import CopyJob, CopyPlan, PlannedJob, RowTable


def trusted_plan(jobs: Iterable[CopyJob], device: torch.device) -> CopyPlan:
    """The plan of ``jobs`` WITHOUT any check, every layer of each job: what
    ``make_plan`` would build for rows the caller already validated (each job's
    ``layers`` must be ``None``)."""
    return CopyPlan(jobs=tuple(PlannedJob(j.src, j.dst, j.src_rows, j.dst_rows,
                                          tuple(range(j.src.num_layers))) for j in jobs),
                    device=device)


def device_desc(table: RowTable, device: torch.device) -> torch.Tensor:
    """The ``[num_layers, num_buffers, 2]`` int64 (base, row stride) table of ``table`` on
    ``device``, built once per table and device (synchronously)."""
    def build(t: RowTable) -> torch.Tensor:
        strides = torch.tensor(t.row_strides, dtype=torch.int64).expand_as(t.ptrs)
        desc = torch.stack([t.ptrs, strides], dim=-1).contiguous().to(device)
        if desc.device.type == "cuda":
            torch.cuda.synchronize(desc.device)
        return desc
    return table.derived(f"test.desc.{torch.device(device)}", build)
