"""Row transfers between pointer tables: the bottom layer (no knowledge of pools)."""
from __future__ import annotations

from transfer_kernels.api import BACKEND_NAMES, copy_rows, copy_rows_batch, get_backend
from transfer_kernels.auto import AutoBackend
from transfer_kernels.base import CopyBackend
from transfer_kernels.codec import Int8Codec
from transfer_kernels.copy_engine import CopyEngineBackend
from transfer_kernels.fault import FaultyBackend, NullBackend
from transfer_kernels.plan import CopyJob, CopyPlan, PlannedJob, make_plan
from transfer_kernels.staged import StagedBackend
from transfer_kernels.table import RowTable, as_row_bytes
from transfer_kernels.torch_ref import TorchBackend, copy_rows_ref
from transfer_kernels.triton_backend import TritonBackend

__all__ = [
    "BACKEND_NAMES",
    "AutoBackend",
    "CopyBackend",
    "CopyEngineBackend",
    "CopyJob",
    "CopyPlan",
    "FaultyBackend",
    "Int8Codec",
    "NullBackend",
    "PlannedJob",
    "RowTable",
    "StagedBackend",
    "TorchBackend",
    "TritonBackend",
    "as_row_bytes",
    "copy_rows",
    "copy_rows_batch",
    "copy_rows_ref",
    "get_backend",
    "make_plan",
]
