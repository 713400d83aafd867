"""The path of a warm load, traced: from ``start_loading`` to the last launch of a 21-group
DeepSeek-V4-Pro ``auto`` load, how many library calls (Python functions of ``hicache``,
``transfer_kernels`` and ``host_pools``) and how many library files it crosses.

``auto`` decides as on a GPU (the seed table's CUDA rules applied to the CPU tables: the
page_first pools staged by DMA, the rest to the kernel), the DMA is the CPU stand-in (a
memmove per piece) and the pre-bound launcher's ``launch`` is a counter: the host path is
the CUDA path's up to the kernel's own launch, which is counted as one more library call
(``copy_kernel.py:launch``) per launch group. Comprehensions and generator expressions are
not counted (Python 3.12 inlines the former). On CUDA each group's DMA adds its runtime
calls (``cudart``: the batched copy, an event record and a stream wait).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from bench.host_only import cuda_rules_on_cpu
from hicache import HiCacheConfig, build, slot_arrays
from hicache.models import preset
from host_pools.memory import HostBudget
from transfer_kernels import AutoBackend, TritonBackend, tuning
from transfer_kernels.backends import auto_table
from transfer_kernels.backends.triton import kernel_module

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = tuple(f"{ROOT / d}/" for d in ("hicache", "transfer_kernels", "host_pools"))
BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)
PAGES = 16
# The budget, with the C modules: 8 files, 25 + 4 calls per group (109 at 21 groups). With
# their Python forms (HICACHE_NO_C=1, or no compiler): slot_arrays' numpy rows, one file and
# one call per row class more (9 files, 111 calls).
MAX_FILES, MAX_CALLS, PER_GROUP = (8, 25, 4) if slot_arrays.COMPILED else (9, 27, 4)


@pytest.fixture(scope="module")
def cache():
    stack = preset("deepseek-v4-pro")
    tokens = 2 * PAGES * stack.page_size
    config = HiCacheConfig(mem_layout="page_first", hicache_ratio=1.0,
                           swa_full_tokens_ratio=2 * PAGES * 128 / tokens)
    backend = AutoBackend(triton=TritonBackend(tuning.TRITON_MAX_PROGRAMS),
                          table=cuda_rules_on_cpu(auto_table.SEED))
    cache = build(stack, tokens, config, device="cpu", budget=BIG, backend=backend)
    host = cache.host_group.pools
    kv, swa = host["kv"].alloc(PAGES * stack.page_size), host["swa"].alloc(128)
    cache.controller.mark_host_written(kv, {"swa": swa})
    yield cache, kv, swa
    cache.close()


def _load(cache, kv, swa, trace: list | None) -> None:
    ctrl = cache.controller
    got = ctrl.load(kv, {"swa": swa}, trusted=True)
    assert got is not None
    if trace is None:
        assert ctrl.start_loading() is not None
    else:
        sys.setprofile(_profiler(trace))
        try:
            ctrl.start_loading()
        finally:
            sys.setprofile(None)
    assert [a.success for a in ctrl.poll()] == [True]
    for name, slots in got.items():
        cache.device_pools[name].free(slots)


def _profiler(trace: list):
    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(LIBRARY) and not code.co_name.startswith("<"):
                trace.append((code.co_filename[len(str(ROOT)) + 1:], code.co_name))
    return profile


def test_a_warm_auto_load_is_short(cache, monkeypatch):
    launches: list[int] = []
    trace: list = []

    def launch(launcher, group: int) -> None:  # the kernel launch: counted, not run
        launches.append(group)
        trace.append(("launch", group))
    monkeypatch.setattr(kernel_module().BoundLaunches, "launch", launch)
    _load(*cache, None)  # the size class's first load: laid out once
    launches.clear()
    trace.clear()
    _load(*cache, trace)
    groups = len(launches)
    assert groups == 21 and launches == list(range(groups))
    last = max(i for i, (f, _) in enumerate(trace) if f == "launch")
    path = [("transfer_kernels/cuda/copy_kernel.py", "launch") if hop[0] == "launch" else hop
            for hop in trace[:last + 1]]
    files = sorted({f for f, _ in path})
    report = "\n".join(f"{f}:{fn}" for f, fn in path)
    assert len(files) <= MAX_FILES, f"{len(files)} files: {files}\n{report}"
    assert len(path) <= MAX_CALLS + PER_GROUP * groups, f"{len(path)} calls\n{report}"
