"""What to copy: row tables, row indices and validated copy plans (the bottom layer)."""
from __future__ import annotations

from transfer_kernels.rows.indices import RowsLike, as_rows, first_duplicate
from transfer_kernels.rows.plan import (CopyJob, CopyPlan, Lane, LaunchGroups, LayersLike,
                                        PlannedJob, exec_device, make_plan)
from transfer_kernels.rows.table import RowTable, as_row_bytes

__all__ = ["CopyJob", "CopyPlan", "Lane", "LaunchGroups", "LayersLike", "PlannedJob", "RowTable", "RowsLike",
           "as_row_bytes", "as_rows", "exec_device", "first_duplicate", "make_plan"]
