"""A whole load through ``Launches.run``: every group, each followed by its event record,
byte-exact and counted as launching the groups one by one is (every backend, both
directions, CPU). ``run`` is the loop a load makes (and a CUDA graph would replace)."""
from __future__ import annotations

import pytest
import torch

from bench.host_only import cuda_rules_on_cpu
from tests.transfer_kernels.pools import assert_copied, make_pool, random_map, snapshot
from transfer_kernels import (AutoBackend, CopyEngineBackend, CopyJob, StagedBackend, TorchBackend,
                              TritonBackend, make_plan, runtime)
from transfer_kernels.backends import auto_table

MIXED = [((8,), torch.bfloat16), ((3, 4), torch.float32), ((5,), torch.uint8)]
BACKENDS = {
    "torch": TorchBackend, "copy_engine": CopyEngineBackend, "triton": TritonBackend,
    "dma": lambda: StagedBackend(TritonBackend()), "dma-torch": lambda: StagedBackend(TorchBackend()),
    "auto": AutoBackend, "auto-as-on-cuda": lambda: AutoBackend(table=cuda_rules_on_cpu(auto_table.SEED)),
}


def _plan(gen, direction):
    pools = [make_pool(gen, 3, 12, MIXED, "page_first", device="cpu", pin=False),
             make_pool(gen, 3, 9, [((40,), torch.uint8)], "layer_first", device="cpu", pin=False)]
    jobs = []
    for p in pools:
        src, dst = (p.host_table, p.device_table) if direction == "h2d" else (p.device_table, p.host_table)
        jobs.append(CopyJob(src, dst, *random_map(gen, p.num_rows, p.num_rows, 4)))
    return make_plan(jobs)


@pytest.mark.parametrize("name", list(BACKENDS))
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_run_copies_every_group_and_records_after_each(gen, monkeypatch, name, direction):
    groups = (((0, 0), (1, 0)), ((0, 1),), ((1, 1), (0, 2), (1, 2)))
    records = []
    monkeypatch.setattr(runtime, "record", lambda event, stream: records.append((event, stream)))
    counts = []
    for how in ("one by one", "run"):
        plan = _plan(gen, direction)
        backend = BACKENDS[name]()
        befores = [(snapshot(j.src), snapshot(j.dst)) for j in plan.jobs]
        launches = backend.prepare(plan, groups)
        if how == "run":
            launches.run(["e0", "e1", "e2"], "s")
            assert records == [("e0", "s"), ("e1", "s"), ("e2", "s")]
        else:
            for g in range(launches.num_groups):
                launches.launch(g)
        for job, (src, dst) in zip(plan.jobs, befores):
            assert_copied(job.src, job.dst, src, dst, job.src_rows, job.dst_rows)
        counts.append(backend.launches)
    assert counts[0] == counts[1] > 0
