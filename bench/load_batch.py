"""A load as a server issues it: all layers x all pools of a batch, end to end.

Question answered: how close does one load (or backup) batch of a real model come to the
contiguous pinned copy of the same bytes, counting the host's enqueue, and how much do a
load and the model's compute slow each other? DeepSeek-V4-Pro and -Flash (all layers x all
seven pools), an MHA and an MLA model; 1/16/64 pages per batch as 1 or 16 ops; random host
pages into random device pages of the production pinned pools (``bench/load_cases.py``).

Per (model, layout, direction, pages, ops, backend), medians over ``--batches`` batches
alternated across backends:

    host_us / e2e_us   host enqueue; end to end (CUDA: to the last copy's completion)
    layer0_us, gpu_us  time to layer 0; the GPU's own span (gated: the GPU held while the
                       host enqueues)
    frac               oneshot_us / e2e_us: ONE contiguous pinned copy of the same bytes,
                       timed the same way in the same run (host clock, from an idle GPU),
                       over the load's end to end
    gpu_frac           the GPU span's GB/s over the contiguous copy's GPU-timed
                       back-to-back GB/s (``limit_GBps``)
    steady_frac        batches back to back without a sync, over that limit
    cmp_ratio          GB/s while bf16 GEMMs occupy the GPU / alone (``cmp_*`` keys);
    compute_slowdown   how much those GEMMs slowed (CUDA only: ``None`` on CPU)
    bidir_x            loads and backups at once: GB/s of both / the faster one way
                       (CUDA only: ``None`` on CPU)

Per pool (JSON ``per_pool``): the pool's rows of the batch, all layers, in one
transfer-layer call (gated on CUDA).

    python bench/load_batch.py                          # GPU: the whole matrix
    python bench/load_batch.py --quick                  # CPU-sized (default without CUDA)
    python bench/load_batch.py --null                   # host enqueue alone (NullBackend)
    python bench/load_batch.py --host-only              # + every backend's preparation,
                                                        #   device calls left out
    python bench/load_batch.py --calibrate              # measure the auto table (JSON)
    python bench/load_batch.py --models deepseek-v4-pro --pages 16 --backends auto,dma

Writes JSON to ``--out`` (default: ``bench/results/local/load_batch_<device>[_null|_host_only].json``,
git-ignored).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path
from typing import Sequence

import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from bench.load_cases import LoadBench, host_dtype_error, make_backends, open_bench  # noqa: E402
from bench.host_only import host_only  # noqa: E402
from bench.load_extra import (Gemms, bidirectional, limit_gbps, oneshot_us, per_pool,  # noqa: E402
                              steady, under_compute)

MODELS = ("deepseek-v4-pro", "deepseek-v4-flash", "llama-3.1-8b", "deepseek-v3")
BACKENDS = ("auto", "triton", "dma", "copy_engine", "torch", "null")
EXTRAS = ("steady", "per_pool", "compute", "bidir")
LAYOUTS = ("page_first", "layer_first")
COLUMNS = ("model", "layout", "dir", "pages", "ops", "backend", "MB", "host_us", "e2e_us",
           "layer0_us", "gpu_us", "GBps", "frac", "gpu_frac", "steady_frac", "cmp_ratio",
           "compute_slowdown", "bidir_x")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="bench/load_batch.py", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", default=not cuda,
                   help="CPU-sized run (default without CUDA): 8-layer V4-Pro and 2-layer MLA")
    p.add_argument("--null", action="store_true",
                   help="NullBackend behind the controller: host enqueue alone (loads, checked edge and trusted)")
    p.add_argument("--host-only", action="store_true",
                   help="every backend's own (CUDA-path) preparation with the device calls left out "
                        "(bench/host_only.py): the host cost of a load, on any machine")
    p.add_argument("--calibrate", action="store_true",
                   help="measure the auto backend's decision table here and write it (--table-out)")
    p.add_argument("--table-out", type=Path, default=None,
                   help="--calibrate: table path (default bench/results/local/auto_table_<device>.json)")
    p.add_argument("--profile-out", type=Path, default=None,
                   help="--calibrate: the device profile its loads and backups give (bench/device_profile.py; "
                        "default bench/results/local/profile_<device>.json, updated when it exists)")
    p.add_argument("--models", default=None, help="comma list of MODEL[:LAYERS] (default: all four)")
    p.add_argument("--pages", default=None, help="pages per batch (default 1,16,64; quick 1,16)")
    p.add_argument("--ops", default="1,16", help="ops per batch (those dividing the pages)")
    p.add_argument("--backends", default=None, help="default: auto,triton,dma,copy_engine (CPU: auto,"
                                                    "torch,dma,copy_engine)")
    p.add_argument("--layouts", default="page_first,layer_first")
    p.add_argument("--directions", default="h2d,d2h")
    p.add_argument("--batches", type=int, default=None, help="batches per case and backend (default 20; quick 3)")
    p.add_argument("--host-gib", type=float, default=None, help="host pool cap per model (default 8; quick 0.5)")
    p.add_argument("--max-programs", type=int, default=None, help="grid cap of the triton kernels")
    p.add_argument("--group-bytes", type=int, default=None, help="load launch group size (bytes)")
    p.add_argument("--hicache-host-dtype", dest="host_dtype", default="auto", choices=("auto", "int8"),
                   help="host format: auto (the device's) or int8 (loads dequantize, backups quantize; "
                        "bytes are the host format's: compare tokens/s with an auto run)")
    p.add_argument("--no-extra", action="store_true", help="skip steady state, per pool and compute")
    p.add_argument("--extras", default=",".join(EXTRAS),
                   help=f"the extra measurements per row, a comma list of {', '.join(EXTRAS)}")
    p.add_argument("--out", type=Path, default=None, help="JSON path")
    args = p.parse_args(argv)
    args.device = torch.device("cuda" if cuda else "cpu")
    quick_models = "deepseek-v4-pro:8,deepseek-v3:2"
    args.models = [_model(m, p) for m in (args.models or (quick_models if args.quick else ",".join(MODELS))).split(",")]
    args.pages = _ints(args.pages or ("1,16" if args.quick else "1,16,64"), "--pages", p)
    args.ops = _ints(args.ops, "--ops", p)
    _lists(args, p, cuda)
    args.extras = [] if args.no_extra else [x for x in args.extras.split(",") if x]
    if bad := [x for x in args.extras if x not in EXTRAS]:
        p.error(f"--extras: unknown {bad[0]!r}; allowed: {', '.join(EXTRAS)}")
    if args.null or args.host_only:
        args.no_extra, args.extras = True, []
        if args.null:
            args.directions = ["h2d"]
    args.batches = args.batches or (3 if args.quick else 20)
    args.host_gib = args.host_gib or (0.25 if args.quick else 8.0)
    args.out = args.out or harness.RESULTS_DIR / f"load_batch_{harness.device_slug(args.device)}{_suffix(args)}.json"
    return args


def _lists(args: argparse.Namespace, p: argparse.ArgumentParser, cuda: bool) -> None:
    """Modes, backends, layouts and directions checked (one line, exit 2, when wrong)."""
    if args.null + args.host_only + args.calibrate > 1:
        p.error("--null, --host-only, --calibrate: choose one")
    cuda_path = cuda or args.host_only  # --host-only prepares as on CUDA
    default_backends = "auto,triton,dma,copy_engine" if cuda_path else "auto,torch,dma,copy_engine"
    args.backends = ["null"] if args.null else (args.backends or default_backends).split(",")
    args.layouts, args.directions = args.layouts.split(","), args.directions.split(",")
    for flag, got, allowed in (("--backends", args.backends, BACKENDS),
                               ("--layouts", args.layouts, LAYOUTS),
                               ("--directions", args.directions, ("h2d", "d2h"))):
        if bad := [x for x in got if x not in allowed]:
            p.error(f"{flag}: unknown {bad[0]!r}; allowed: {', '.join(allowed)}")
    if why := host_dtype_error(args.host_dtype, args.models, args.calibrate):
        p.error(why)


def _ints(text: str, flag: str, p: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        p.error(f"{flag}: must be a comma list of integers, got {text!r}")
    if min(values) < 1:
        p.error(f"{flag}: values must be >= 1, got {text!r}")
    return values


def _model(spec: str, p: argparse.ArgumentParser) -> tuple[str, int | None]:
    name, _, layers = spec.partition(":")
    if name not in MODELS:
        p.error(f"--models: unknown {name!r}; allowed: {', '.join(MODELS)}")
    if layers and not layers.isdigit():
        p.error(f"--models: layers of {name} must be an integer, got {layers!r}")
    return name, int(layers) if layers else None


def _suffix(args: argparse.Namespace) -> str:
    return "_null" if args.null else "_host_only" if args.host_only else ""


def _summary(case: dict, batches: list, limit_gbps: float | None, oneshot: float | None) -> dict:
    """Medians of one backend's batches of one case."""
    nbytes = sum(batches[0].bytes_by_pool.values())
    row = dict(case, MB=nbytes / 1e6, bytes=nbytes, bytes_by_pool=batches[0].bytes_by_pool,
               limit_GBps=limit_gbps, oneshot_us=oneshot)
    keys = dict.fromkeys(k for b in batches for k in b.times)
    for key in keys:  # a gated sample whose gate was too short has no GPU times
        values = [b.times[key] for b in batches if key in b.times]
        row.update({f"{key[:-3]}_{k}": v for k, v in harness.percentiles(values, "us").items()})
        row[key] = statistics.median(values)
    row["GBps"] = harness.gbps(nbytes, row["e2e_us"] / 1e3)
    row["frac"] = oneshot / row["e2e_us"] if oneshot else None
    if "gpu_us" in row and limit_gbps:
        row["gpu_frac"] = harness.gbps(nbytes, row["gpu_us"] / 1e3) / limit_gbps
    groups = [b.groups for b in batches if b.groups]
    if groups:
        row["group_end_ms"] = [(f, e, statistics.median(g[i][2] for g in groups if len(g) > i))
                               for i, (f, e, _) in enumerate(groups[0])]
    return row


def run_case(bench: LoadBench, backends: dict, args: argparse.Namespace, base: dict,
             gemms: Gemms | None = None) -> list[dict]:
    """One (direction, pages, ops) on every backend, batches alternated across backends."""
    pages, ops, direction = base["pages"], base["ops"], base["dir"]
    no_device = args.null or args.host_only  # nothing reaches the GPU: no gate, no limit
    modes = [False, True] if no_device else [True]  # trusted: the radix tree's path
    samples: dict[tuple, list] = {}
    for i in range(args.batches + 2):  # the first two warm up
        for name, backend in backends.items():
            bench.ctrl.backend = backend
            for trusted in modes:
                make = bench.load_args if direction == "h2d" else bench.backup_args
                got = [bench.run(direction, make(pages, ops), trusted, gated=False)]
                if args.device.type == "cuda" and not no_device:
                    got.append(bench.run(direction, make(pages, ops), trusted, gated=True))
                if i >= 2:
                    samples.setdefault((name, trusted), []).append(_merge(got))
    nbytes = sum(next(iter(samples.values()))[0].bytes_by_pool.values())
    limit = oneshot = None
    if not no_device:
        limit = limit_gbps(bench.device, nbytes, direction)
        oneshot = oneshot_us(bench.device, nbytes, direction)
    rows = []
    for (name, trusted), batches in samples.items():
        row = _summary(dict(base, backend=name, mode="trusted" if trusted else "edge"), batches,
                       limit, oneshot)
        if args.extras:
            bench.ctrl.backend = backends[name]
            if "steady" in args.extras:
                row.update(steady(bench, direction, pages, ops, limit))
            if "per_pool" in args.extras:
                row["per_pool"] = per_pool(bench, backends[name], direction, pages, ops)
            if "compute" in args.extras:
                row.update(under_compute(bench, gemms, direction, pages, ops))
            if "bidir" in args.extras:
                row.update(bidirectional(bench, pages, ops))
        rows.append(row)
    return rows


def _merge(got: list):
    """An ungated batch's host and end-to-end times with its gated twin's GPU times."""
    if len(got) == 1:
        return got[0]
    plain, gated = got
    times = dict(plain.times)
    times.update({k: v for k, v in gated.times.items() if k.startswith("gpu")})
    return plain._replace(times=times, groups=gated.groups)


def cases(args: argparse.Namespace) -> list[tuple[int, int]]:
    return [(pages, ops) for pages in args.pages for ops in args.ops if ops <= pages and pages % ops == 0]


def run(argv: Sequence[str] | None = None) -> list[dict]:
    """Run the benchmark; returns the rows (also written as JSON to ``--out``)."""
    args = parse_args(argv)
    if args.calibrate:
        from bench import calibrate
        return calibrate.run(args)
    if args.device.type == "cpu":
        torch.set_num_threads(1)  # copies and limits without thread-pool contention
    label = harness.device_name(args.device) + (" (CPU: copies run synchronously)" if args.device.type == "cpu" else "")
    print(f"load_batch on {label}: models={args.models} pages={args.pages} ops={args.ops} "
          f"backends={args.backends} layouts={args.layouts} batches={args.batches}"
          f"{' host-only (device calls left out)' if args.host_only else ''}", flush=True)
    gemms = Gemms(args.device) if args.device.type == "cuda" and "compute" in args.extras else None
    rows = []
    with host_only() if args.host_only else contextlib.nullcontext():
        for model, layers in args.models:
            for layout in args.layouts:
                rows += _model_rows(args, model, layers, layout, gemms)
    config = {k: (str(v) if isinstance(v, (Path, torch.device)) else v) for k, v in vars(args).items()}
    config["not_applicable"] = (None if args.device.type == "cuda" else
                                "cmp_* and compute_slowdown (no GPU to share), bidir_* (copies run "
                                "one after another on CPU): null")
    print(f"wrote {harness.write_json(args.out, rows, config, args.device)}")
    return rows


def _model_rows(args: argparse.Namespace, model: str, layers: int | None, layout: str,
                gemms: Gemms | None) -> list[dict]:
    backends = make_backends(args.backends, args.device, args.max_programs, args.host_only)
    bench = open_bench(args, model, layers, layout, next(iter(backends.values())))
    rows = []
    for direction in args.directions:
        for pages, ops in cases(args):
            base = dict(model=f"{model}:{bench.stack.num_model_layers}", layout=layout, dir=direction,
                        pages=pages, ops=ops, host_dtype=args.host_dtype)
            got = run_case(bench, backends, args, base, gemms)
            modes = ("mode",) if args.null or args.host_only else ()
            print(harness.format_table(got, COLUMNS + modes), flush=True)
            rows += got
    bench.close()
    return rows


if __name__ == "__main__":
    run()
