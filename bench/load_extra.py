"""The parts of ``bench/load_batch.py`` beyond one batch: steady state, per-pool transfers
and the interference of loads with a compute-bound kernel."""
from __future__ import annotations

import argparse
import math
from typing import Any, Callable

import numpy as np
import torch

from bench import harness
from bench.load_cases import LoadBench
from transfer_kernels import copy_rows

STEADY_BATCHES = 20
GEMM_N = 8192  # bf16 GEMM of the compute load: every SM, large shared-memory tiles


_MEMCPY: dict[str, harness.Memcpy] = {}


def limit_gbps(device: torch.device, nbytes: int, direction: str) -> float:
    """The contiguous (pinned on CUDA) copy of ``nbytes`` in this run: its p50 GB/s; the
    buffers are kept and grown to the largest size asked for."""
    have = _MEMCPY.get(str(device))
    if have is None or have.host.numel() < nbytes:
        _MEMCPY[str(device)] = have = harness.Memcpy(max(nbytes, 1 << 20), device)
    return have.gbps(nbytes, direction)


def steady(bench: LoadBench, direction: str, pages: int, ops: int, limit_gbps: float) -> dict:
    """Batches back to back without a sync (the scheduler's regime): GB/s and fraction."""
    count = min(STEADY_BATCHES, bench.capacity(pages, ops))
    if count < 2:
        return {}
    nbytes, us = bench.run_many(direction, count, pages, ops)
    gbps = harness.gbps(nbytes, us / 1e3)
    return {"steady_batches": count, "steady_GBps": gbps,
            "steady_frac": gbps / limit_gbps if limit_gbps else None}


def per_pool(bench: LoadBench, backend: Any, direction: str, pages: int, ops: int) -> list[dict]:
    """Each pool's rows of such a batch, all layers, in one transfer-layer call (gated on
    CUDA: the GPU's time), beside the contiguous copy of the same bytes."""
    stack, rng, rows = bench.stack, bench.rng, []
    slots = {bench.anchor: bench._pick(bench.anchor, pages)}
    if bench.has_swa:
        slots["swa"] = bench._pick("swa", ops)
    host_rows = stack.derive_rows(slots)
    cuda = bench.device.type == "cuda"
    for name, src_rows in host_rows.items():
        dev = bench.cache.device_pools[name]
        dev_rows = torch.from_numpy(rng.choice(dev.num_rows, src_rows.numel(), replace=False))
        host_t, dev_t = bench.ctrl._routes["h2d"][name]
        src, dst, s_rows, d_rows = ((host_t, dev_t, src_rows, dev_rows) if direction == "h2d"
                                    else (dev_t, host_t, dev_rows, src_rows))
        spec = stack.pool(name)
        nbytes = src_rows.numel() * spec.row_bytes * spec.num_layers
        t = harness.time_fn(lambda: copy_rows(src, dst, s_rows, d_rows, backend=backend),
                            bench.device, warmup=2, reps=10, gate_cycles=bench.gate_cycles if cuda else 0)
        limit = limit_gbps(bench.device, nbytes, direction)
        gbps = harness.gbps(nbytes, t.p50_ms)
        rows.append({"pool": name, "row_bytes": spec.row_bytes, "layers": spec.num_layers,
                     "rows": src_rows.numel(), "MB": nbytes / 1e6, "p50_us": t.p50_ms * 1e3,
                     "GBps": gbps, "frac": gbps / limit, "limit_GBps": limit})
    return rows


def interference(args: argparse.Namespace, make_backends: Callable) -> list[dict]:
    """bf16 GEMMs on a model stream while 16-page batches of the first model run back to
    back: each side's time alone and together (CUDA only)."""
    model, layers = args.models[0]
    backends = make_backends([b for b in args.backends if b != "null"], args.device, args.max_programs)
    bench = LoadBench(model, layers, "page_first", 256, 16, 1, args.device, next(iter(backends.values())))
    a = torch.randn(GEMM_N, GEMM_N, device=args.device, dtype=torch.bfloat16)
    b, c = torch.randn_like(a), torch.empty_like(a)
    stream = torch.cuda.Stream(args.device)

    def gemms(n: int) -> tuple[Any, Any]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        with torch.cuda.stream(stream):
            for _ in range(n):
                torch.mm(a, b, out=c)
        end.record(stream)
        return start, end

    rows = []
    for name, backend in backends.items():
        bench.ctrl.backend = backend
        for direction in args.directions:
            rows.append(_interfere(bench, gemms, name, direction, f"{model}:{bench.stack.num_model_layers}"))
            print(harness.format_table([rows[-1]], list(rows[-1])), flush=True)
    bench.close()
    return rows


def _interfere(bench: LoadBench, gemms: Callable, name: str, direction: str, model: str) -> dict:
    """Rounds of back-to-back batches while ``n`` GEMMs run, until the GEMMs end."""
    count = max(2, min(STEADY_BATCHES, bench.capacity(16, 1)))
    bench.run_many(direction, count, 16, 1)  # warm
    nbytes, round_us = bench.run_many(direction, count, 16, 1)
    gemms(2)
    s, e = gemms(3)
    torch.cuda.synchronize()
    per_gemm_ms = s.elapsed_time(e) / 3
    n = max(10, math.ceil(max(20.0, 5 * round_us / 1e3) / per_gemm_ms))
    s, e = gemms(n)
    torch.cuda.synchronize()
    compute_alone_ms = s.elapsed_time(e)
    s, e = gemms(n)
    moved, spent, rounds = 0, 0.0, 0
    while not e.query() or rounds == 0:  # loads for as long as the GEMMs run
        got, us = bench.run_many(direction, count, 16, 1, idle_first=False)
        moved, spent, rounds = moved + got, spent + us, rounds + 1
    torch.cuda.synchronize()
    compute_together_ms = s.elapsed_time(e)
    alone_gbps, together_gbps = harness.gbps(nbytes, round_us / 1e3), harness.gbps(moved, spent / 1e3)
    return {"model": model, "dir": direction, "pages": 16, "ops": 1, "backend": name,
            "batches_per_round": count, "rounds_together": rounds, "MB": nbytes / 1e6, "gemms": n,
            "compute_alone_ms": compute_alone_ms, "compute_together_ms": compute_together_ms,
            "load_alone_GBps": alone_gbps, "load_together_GBps": together_gbps,
            "compute_slowdown": compute_together_ms / compute_alone_ms - 1,
            "load_slowdown": alone_gbps / together_gbps - 1}
