"""``bench/load_batch.py --calibrate``: measure the ``auto`` backend's decision table here.

For every model, layout, direction and page count of the run's arguments, each pool's
rows of a random batch (all layers, one transfer-layer call, as ``per_pool``) are timed on
every candidate backend of this device (CUDA: triton, dma where the job can be staged,
copy_engine; CPU: torch, copy_engine): p50 of the call (CUDA events without a gate: the
host's enqueue and the GPU's copy, whichever is longer), idle and, on CUDA, while bf16
GEMMs run on another stream. The winner of a job minimises its worse relative time
(``max(idle / best idle, under compute / best under compute)``), so that it is never far
from the best fixed backend in either regime.

Each measured job (``transfer_kernels.backends.auto.traits``: device, direction, path, piece and
span bytes, size class) becomes one exact rule (traits met several times take the backend
whose worst relative time over them is least); the seed table's rules follow, for the
traits not measured. The table goes to ``--table-out`` (default
``bench/results/local/auto_table_<device>.json``); load it with ``HICACHE_AUTO_TABLE``.

The same measurements give the device profile's links (`bench.device_profile`): per
direction, each job's best backend idle, fitted as a fixed cost per transfer + bytes / GB/s,
written to ``--profile-out`` (`hicache replay --device-profile FILE` reads it).
"""
from __future__ import annotations

import argparse
import math

import torch

from bench import device_profile, harness
from bench.load_cases import make_backends, open_bench
from bench.load_extra import Gemms, PoolJob, pool_jobs
from hicache.cost import Link
from transfer_kernels import copy_rows, make_plan
from transfer_kernels.backends import auto_table
from transfer_kernels.backends.auto import traits
from transfer_kernels.backends.auto_table import AutoTable, Rule

CANDIDATES = {"cuda": ("triton", "dma", "copy_engine"), "cpu": ("torch", "copy_engine")}
REPS = 10


def run(args: argparse.Namespace) -> list[dict]:
    """Measure, write the table and the measurements; returns the measurement rows."""
    device = args.device
    backends = make_backends(list(CANDIDATES[device.type]), device, args.max_programs)
    gemms = Gemms(device) if device.type == "cuda" else None
    print(f"calibrating auto on {harness.device_name(device)}: models={args.models} "
          f"pages={args.pages} layouts={args.layouts}", flush=True)
    rows = []
    for model, layers in args.models:
        for layout in args.layouts:
            bench = open_bench(args, model, layers, layout, next(iter(backends.values())))
            for direction in args.directions:
                for pages in args.pages:
                    for job in pool_jobs(bench, direction, pages, 1):
                        rows.append(dict(model=model, layout=layout, pages=pages, direction=direction,
                                         **measure(job, backends, device, gemms)))
                        r = rows[-1]
                        print(f"{model} {layout} {direction} {pages}p {r['pool']}: {r['path']} "
                              f"{r['piece_bytes']} B rows, {r['span_bytes']} B spans -> {r['use']}",
                              flush=True)
            bench.close()
    table = table_of(rows, f"calibrated on {harness.device_name(device)} by bench/load_batch.py "
                           f"--calibrate; then the seed: {auto_table.SEED.source}")
    slug = harness.device_slug(device)
    out = table.save(args.table_out or harness.RESULTS_DIR / f"auto_table_{slug}.json")
    config = {k: (str(v) if not isinstance(v, (int, float, bool, list, type(None))) else v)
              for k, v in vars(args).items()}
    print(f"wrote {out} ({len(table.rules)} rules) and "
          f"{harness.write_json(args.out.with_name(args.out.stem + '_calibrate.json'), rows, config, device)}")
    links = profile_links(rows, device)
    if links:
        path = device_profile.profile_path(device, args.profile_out)
        print(f"wrote {device_profile.update(path, 'h100', device, **links)}")
    return rows


def profile_links(rows: list[dict], device: torch.device) -> dict[str, Link]:
    """Per direction measured at two sizes or more: its `Link` (each job's best backend idle)."""
    links = {}
    for direction in ("h2d", "d2h"):
        samples = [(r["MB"] * 1e6, min(r["idle_us"].values()) / 1e6) for r in rows if r["direction"] == direction]
        if len({b for b, _ in samples}) < 2:
            continue
        try:
            gbps, fixed = device_profile.fit(samples)
        except ValueError as e:  # a loaded machine's noise: that direction stays as the profile had it
            print(f"device profile: {direction} left out: {e}")
            continue
        links[direction] = Link(gbps, fixed, 0.0, measured=True, source=(
            f"measured on {harness.device_name(device)} by bench/load_batch.py --calibrate: {len(samples)} jobs of "
            "hicache's loads or backups (each pool's rows, the best backend idle), fitted as a fixed cost + "
            "bytes / GB/s"))
    return links


def measure(job: PoolJob, backends: dict, device: torch.device, gemms: Gemms | None) -> dict:
    """One job on every candidate that can run it: p50 us idle (and under compute)."""
    plan = make_plan([(job.src, job.dst, job.src_rows, job.dst_rows)])
    s = traits(plan.jobs[0], plan)
    names = [n for n in backends if n != "dma" or s.path == "stage"]

    def call(name: str):
        return lambda: copy_rows(job.src, job.dst, job.src_rows, job.dst_rows, backend=backends[name])

    idle = {n: harness.time_fn(call(n), device, warmup=2, reps=REPS).p50_ms * 1e3 for n in names}
    busy = {}
    if gemms is not None:
        for n in names:
            count = math.ceil(3 * (REPS + 2) * idle[n] / 1e3 / gemms.per_gemm_ms) + 2
            gemms.run(count)  # the GEMMs outlast the timed calls
            busy[n] = harness.time_fn(call(n), device, warmup=2, reps=REPS).p50_ms * 1e3
            torch.cuda.synchronize()
    return {"pool": job.pool, "dir": s.dir, "path": s.path, "piece_bytes": s.piece_bytes,
            "span_bytes": s.span_bytes,
            "job_bytes": s.job_bytes, "device": s.device, "MB": job.nbytes / 1e6,
            "idle_us": idle, "busy_us": busy, "use": min(names, key=lambda n: _worst(n, [idle, busy]))}


def _worst(name: str, regimes: list[dict]) -> float:
    """The backend's worst time relative to the best, over the regimes measured."""
    return max((r[name] / min(r.values()) for r in regimes if r), default=0.0)


def table_of(rows: list[dict], source: str) -> AutoTable:
    """One exact rule per measured job traits, then the seed's rules."""
    by_traits: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["device"], r["dir"], r["path"], r["piece_bytes"], r["span_bytes"], r["job_bytes"])
        by_traits.setdefault(key, []).append(r)
    rules = []
    for (device, direction, path, piece, span, job_bytes), group in by_traits.items():
        names = set.intersection(*(set(r["idle_us"]) for r in group))
        regimes = [reg for r in group for reg in (r["idle_us"], r["busy_us"])]
        use = min(sorted(names), key=lambda n: _worst(n, regimes))
        rules.append(Rule(device, use, path=path, dir=direction, min_piece_bytes=piece,
                          max_piece_bytes=piece, min_span_bytes=span, max_span_bytes=span,
                          min_job_bytes=job_bytes, max_job_bytes=job_bytes))
    return AutoTable(tuple(rules) + auto_table.SEED.rules, source=source)
