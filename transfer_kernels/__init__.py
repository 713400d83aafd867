"""Row transfers between pointer tables: the bottom layer (no knowledge of pools).

    api.py / fault.py   the entry points (copy_rows, copy_rows_batch, get_backend) and
                        the test backends (FaultyBackend, NullBackend)
    backends/           every way rows move, behind one interface (CopyBackend)
    cuda/               the CUDA runtime calls and the Triton kernels
    rows/               what to copy: row tables, row indices, validated plans
    quant/              the int8 host format: reference bytes and codec
"""
from __future__ import annotations

from transfer_kernels.api import BACKEND_NAMES, copy_rows, copy_rows_batch, get_backend
from transfer_kernels.backends.auto import AutoBackend
from transfer_kernels.backends.base import CopyBackend
from transfer_kernels.backends.launches import Launches
from transfer_kernels.backends.copy_engine import CopyEngineBackend
from transfer_kernels.backends.staged import StagedBackend
from transfer_kernels.backends.torch_ref import TorchBackend, copy_rows_ref
from transfer_kernels.backends.triton import TritonBackend
from transfer_kernels.cuda import runtime
from transfer_kernels.fault import FaultyBackend, NullBackend
from transfer_kernels.quant.codec import Int8Codec
from transfer_kernels.rows import CopyJob, CopyPlan, PlannedJob, RowTable, as_row_bytes, make_plan

__all__ = [
    "BACKEND_NAMES",
    "AutoBackend",
    "CopyBackend",
    "CopyEngineBackend",
    "CopyJob",
    "CopyPlan",
    "FaultyBackend",
    "Int8Codec",
    "Launches",
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
    "runtime",
]
