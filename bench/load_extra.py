"""The parts of ``bench/load_batch.py`` beyond one batch: the one-shot contiguous copy,
steady state, per-pool transfers, loads under compute (bf16 GEMMs) and in both directions
at once."""
from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import numpy as np
import torch

from bench import harness
from bench.load_cases import LoadBench
from transfer_kernels import RowTable, copy_rows

STEADY_BATCHES = 20
GEMM_N = 8192  # bf16 GEMM of the compute load: every SM, large shared-memory tiles


_MEMCPY: dict[str, harness.Memcpy] = {}


def _memcpy(device: torch.device, nbytes: int) -> harness.Memcpy:
    """The contiguous copy's buffers on ``device``, kept and grown to the largest size."""
    have = _MEMCPY.get(str(device))
    if have is None or have.host.numel() < nbytes:
        _MEMCPY[str(device)] = have = harness.Memcpy(max(nbytes, 1 << 20), device)
    return have


def limit_gbps(device: torch.device, nbytes: int, direction: str) -> float:
    """The contiguous (pinned on CUDA) copy of ``nbytes`` in this run: its p50 GB/s,
    GPU-timed back to back on CUDA."""
    return _memcpy(device, nbytes).gbps(nbytes, direction)


def oneshot_us(device: torch.device, nbytes: int, direction: str, reps: int = 10) -> float:
    """Median end-to-end us of ONE contiguous (pinned on CUDA) copy of ``nbytes``, timed
    like a load: host clock from an idle device to the copy's completion."""
    fn = _memcpy(device, nbytes).fn(nbytes, direction)
    cuda = device.type == "cuda"
    fn()  # warm
    samples = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.current_stream().synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return float(np.median(samples))


def steady(bench: LoadBench, direction: str, pages: int, ops: int, limit_gbps: float) -> dict:
    """Batches back to back without a sync (the scheduler's regime): GB/s and fraction."""
    count = min(STEADY_BATCHES, bench.capacity(pages, ops))
    if count < 2:
        return {}
    nbytes, us = bench.run_many(direction, count, pages, ops)
    gbps = harness.gbps(nbytes, us / 1e3)
    return {"steady_batches": count, "steady_GBps": gbps,
            "steady_frac": gbps / limit_gbps if limit_gbps else None}


class PoolJob(NamedTuple):
    """One pool's rows of a batch, all layers, as one transfer-layer call."""

    pool: str
    src: RowTable
    dst: RowTable
    src_rows: torch.Tensor
    dst_rows: torch.Tensor
    nbytes: int


def pool_jobs(bench: LoadBench, direction: str, pages: int, ops: int) -> list[PoolJob]:
    """Each pool's rows of a random batch of (pages, ops), to random device rows."""
    stack, rng, jobs = bench.stack, bench.rng, []
    slots = {bench.anchor: bench._pick(bench.anchor, pages)}
    if bench.has_swa:
        slots["swa"] = bench._pick("swa", ops)
    for name, host_rows in stack.derive_rows(slots).items():
        dev = bench.cache.device_pools[name]
        dev_rows = torch.from_numpy(rng.choice(dev.num_rows, host_rows.numel(), replace=False))
        host_t, dev_t = bench.ctrl._planners["h2d"].tables[name]
        spec = stack.pool(name)
        nbytes = host_rows.numel() * spec.row_bytes * spec.num_layers
        jobs.append(PoolJob(name, host_t, dev_t, host_rows, dev_rows, nbytes) if direction == "h2d"
                    else PoolJob(name, dev_t, host_t, dev_rows, host_rows, nbytes))
    return jobs


def per_pool(bench: LoadBench, backend: Any, direction: str, pages: int, ops: int) -> list[dict]:
    """Each pool's rows of such a batch, all layers, in one transfer-layer call (gated on
    CUDA: the GPU's time), beside the contiguous copy of the same bytes."""
    rows, cuda = [], bench.device.type == "cuda"
    for job in pool_jobs(bench, direction, pages, ops):
        t = harness.time_fn(lambda: copy_rows(job.src, job.dst, job.src_rows, job.dst_rows, backend=backend),
                            bench.device, warmup=2, reps=10, gate_cycles=bench.gate_cycles if cuda else 0)
        limit = limit_gbps(bench.device, job.nbytes, direction)
        gbps = harness.gbps(job.nbytes, t.p50_ms)
        spec = bench.stack.pool(job.pool)
        rows.append({"pool": job.pool, "row_bytes": spec.row_bytes, "layers": spec.num_layers,
                     "rows": job.src_rows.numel(), "MB": job.nbytes / 1e6, "p50_us": t.p50_ms * 1e3,
                     "GBps": gbps, "frac": gbps / limit, "limit_GBps": limit})
    return rows


class Gemms:
    """bf16 GEMMs on a model stream (CUDA): the compute a load competes with."""

    def __init__(self, device: torch.device) -> None:
        self.a = torch.randn(GEMM_N, GEMM_N, device=device, dtype=torch.bfloat16)
        self.b, self.c = torch.randn_like(self.a), torch.empty_like(self.a)
        self.stream = torch.cuda.Stream(device)
        self.run(2)
        s, e = self.run(3)
        torch.cuda.synchronize()
        self.per_gemm_ms = s.elapsed_time(e) / 3

    def run(self, n: int) -> tuple[Any, Any]:
        """Enqueue ``n`` GEMMs; their (start, end) events."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(self.stream)
        with torch.cuda.stream(self.stream):
            for _ in range(n):
                torch.mm(self.a, self.b, out=self.c)
        end.record(self.stream)
        return start, end


NOT_ON_CPU = {"cmp_alone_GBps": None, "cmp_together_GBps": None, "cmp_ratio": None,
              "compute_slowdown": None}


def under_compute(bench: LoadBench, gemms: Gemms | None, direction: str, pages: int,
                  ops: int) -> dict:
    """Batches of (pages, ops) back to back while GEMMs run, until the GEMMs end: the
    load's GB/s alone and together (``cmp_ratio`` = together / alone) and how much the
    GEMMs slowed. ``None`` values without CUDA (no GPU to share: not applicable)."""
    count = min(STEADY_BATCHES, bench.capacity(pages, ops))
    if gemms is None or count < 1:
        return dict(NOT_ON_CPU)
    bench.run_many(direction, count, pages, ops)  # warm
    nbytes, round_us = bench.run_many(direction, count, pages, ops)
    n = max(10, math.ceil(max(20.0, 5 * round_us / 1e3) / gemms.per_gemm_ms))
    s, e = gemms.run(n)
    torch.cuda.synchronize()
    compute_alone_ms = s.elapsed_time(e)
    s, e = gemms.run(n)
    moved, spent, rounds = 0, 0.0, 0
    while not e.query() or rounds == 0:  # loads for as long as the GEMMs run
        got, us = bench.run_many(direction, count, pages, ops, idle_first=False)
        moved, spent, rounds = moved + got, spent + us, rounds + 1
    torch.cuda.synchronize()
    alone, together = harness.gbps(nbytes, round_us / 1e3), harness.gbps(moved, spent / 1e3)
    return {"cmp_alone_GBps": alone, "cmp_together_GBps": together, "cmp_ratio": together / alone,
            "compute_slowdown": s.elapsed_time(e) / compute_alone_ms - 1,
            "cmp_gemms": n, "cmp_rounds": rounds, "cmp_batches_per_round": count}


def bidirectional(bench: LoadBench, pages: int, ops: int) -> dict:
    """Loads and backups of (pages, ops) at once against each alone (same count, back to
    back): ``bidir_x`` = GB/s of both together / the faster one-way GB/s. ``None`` values
    without CUDA (the CPU runs copies one after another: not applicable)."""
    count = min(STEADY_BATCHES, bench.capacity(pages, ops) // 2)
    if bench.device.type != "cuda" or count < 1:
        return {"bidir_GBps": None, "bidir_x": None}
    bench.run_both(count, pages, ops)  # warm
    one_way = [harness.gbps(*_per_ms(bench.run_many(d, count, pages, ops))) for d in ("h2d", "d2h")]
    both = harness.gbps(*_per_ms(bench.run_both(count, pages, ops)))
    return {"bidir_GBps": both, "bidir_x": both / max(one_way), "bidir_h2d_GBps": one_way[0],
            "bidir_d2h_GBps": one_way[1], "bidir_batches": count}


def _per_ms(got: tuple[int, float]) -> tuple[int, float]:
    return got[0], got[1] / 1e3
