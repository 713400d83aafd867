"""``bench/load_batch.py --host-only``: every backend's own preparation, device calls left out.

On a machine without a GPU the CUDA backends cannot run, and their CPU stand-ins do the
copies themselves (numpy, the Triton interpreter), which hides what the host spends to
*prepare* a load. Inside :func:`host_only` the transfer layer runs its CUDA-path
preparation on CPU tables and stops at the launch boundary:

    triton       layout, program tables and index staging (``prepare``) as on CUDA, with
                 the CUDA grid cap; the kernel launch is a no-op
    dma          staging tables and DMA pieces (``prepare``); the DMA call gets its address
                 arrays built as on CUDA and is not issued; the scatter is the triton no-op
    copy_engine  the CUDA path's run analysis and piece arrays (2-D copies included), with
                 a runtime shim whose copy calls do nothing
    torch        nothing is left: its index_select / index_copy_ calls are the device work
    auto         its decision (the seed table's CUDA rules, applied to CPU tables) and the
                 inner backends above

With ``--hicache-host-dtype int8`` the converting jobs take the CUDA path's route too
(``auto``: staged or the fused quant kernel; ``copy_engine``: the fused kernel; torch's
reference conversion is device work, left out like torch's copies).

Kernel launches are left out at the pre-bound launchers' ``launch`` (``runtime.launch``
still runs, and the launcher is still built); the other device calls are patched at their
backend's boundary for the duration of the ``with``.
What is measured is Python/numpy host work; the CUDA runtime's own cost per call (H100:
a triton launch 22.6 us, ``cudaMemcpyBatchAsync`` of 16 pieces 34 us) is not included.
"""
from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace
from typing import Iterator, Sequence

import numpy as np

from transfer_kernels import (AutoBackend, CopyEngineBackend, NullBackend, StagedBackend, TorchBackend,
                              TritonBackend, tuning)
from transfer_kernels.backends import auto, auto_table
from transfer_kernels.cuda.runtime import DmaQueue
from transfer_kernels.backends.quant_torch import TorchQuantBackend
from transfer_kernels.backends.quant_triton import TritonQuantBackend
from transfer_kernels.rows import PlannedJob

_converting = auto.converting


def _nothing(*args, **kwargs) -> None:
    """A device call left out."""


NULL_RUNTIME = SimpleNamespace(memcpy_async=_nothing, memcpy_2d_async=_nothing,
                               memcpy_batch_async=_nothing, batch_available=lambda: True)


def _copy_engine_host(self: CopyEngineBackend, parts: list[tuple[PlannedJob, Sequence[int]]],
                      device) -> None:
    """The CUDA branch of ``CopyEngineBackend._copy`` up to the runtime call."""
    pieces: list[np.ndarray] = []
    for job, layers in parts:
        pieces += self._copy_job_cuda(job, layers, 1, NULL_RUNTIME)
    if pieces:
        dst, src, size = np.concatenate(pieces, axis=1)
        self.pieces += len(size)
        NULL_RUNTIME.memcpy_batch_async(dst, src, size, 1)
        self.copies += 1


def cuda_rules_on_cpu(table: auto_table.AutoTable) -> auto_table.AutoTable:
    """``table``'s CUDA rules, applied to CPU plans (what ``auto`` would decide on a GPU)."""
    rules = tuple(dataclasses.replace(r, device="cpu") for r in table.rules if r.device == "cuda")
    return auto_table.AutoTable(rules, source=f"cuda rules of: {table.source}")


def make_backends(names: list[str], cuda: bool = False) -> dict:
    """Fresh backends as the CUDA path builds them: the CUDA grid cap, and ``auto`` with
    the CUDA rules of its table (on CPU tables unless ``cuda``)."""
    def triton() -> TritonBackend:
        return TritonBackend(tuning.TRITON_MAX_PROGRAMS)

    table = auto_table.from_env()
    table = table if cuda else cuda_rules_on_cpu(table)
    factories = {"triton": triton, "copy_engine": CopyEngineBackend, "torch": TorchBackend,
                 "null": NullBackend, "dma": lambda: StagedBackend(triton()),
                 "auto": lambda: AutoBackend(triton=triton(), table=table)}
    return {n: factories[n]() for n in names}


def _null_issue(self: DmaQueue, ring, pieces: np.ndarray, caller: int) -> None:
    """``DmaQueue.issue`` with its pieces already built by the load: counted, no call made."""
    self.copies += 1
    self.pieces += pieces.shape[1]
    self.records += 1
    self.waits += 1


def _converting_as_on_cuda(name: str, s: auto_table.JobTraits) -> auto.Decision:
    """``auto.converting`` as on a GPU (CPU tables stand in for the CUDA path's)."""
    return _converting(name, s._replace(device="cuda"))


def _fused_quant(self: CopyEngineBackend, device) -> TritonQuantBackend:
    """The copy engine's converting jobs on a GPU: the fused kernel (CUDA grid cap)."""
    return TritonQuantBackend(tuning.TRITON_MAX_PROGRAMS)


def _patches() -> list[tuple[object, str, object]]:
    """(owner, attribute, replacement) of every device call of the transfer layer."""
    from transfer_kernels.backends.quant_triton import BoundQuant
    from transfer_kernels.backends.triton import kernel_module
    patches = [(kernel_module().BoundLaunches, "launch", _nothing),  # every kernel launch
               (BoundQuant, "launch", _nothing),
               (CopyEngineBackend, "_copy", _copy_engine_host),
               (TorchBackend, "_execute", _nothing), (TorchBackend, "_execute_group", _nothing),
               (TorchQuantBackend, "_execute", _nothing), (TorchQuantBackend, "_execute_group", _nothing),
               (auto, "converting", _converting_as_on_cuda),
               (CopyEngineBackend, "_make_quant_backend", _fused_quant)]
    patches.append((DmaQueue, "issue", _null_issue))  # the staged backend's DMA call
    return patches


@contextlib.contextmanager
def host_only() -> Iterator[None]:
    """Leave every device call of the transfer layer out (module docstring)."""
    patches = _patches()
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
