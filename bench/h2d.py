"""Row-transfer throughput: H2D per layer and D2H of all layers, every backend, real pool rows.

Question answered: how many GB/s does each transfer backend reach for the row sizes of
real pools, as a function of the number of scattered rows per call, and what fraction of
the physical limit (one contiguous pinned copy of the same bytes) is that?

    python -m bench.h2d                       # GPU defaults: all pools, 1..1024 rows
    python -m bench.h2d --quick               # CPU-sized run (default without CUDA)
    python -m bench.h2d --pools v4_swa,dsa --max-rows 256 --layers 2

On CUDA each sample is the GPU's time alone: a sleep holds the GPU while the host
validates, prepares and enqueues the call (``--per-call`` times the call's wall time
instead, which is host-bound below ~2 MB per call). A whole batch as a server issues it
is ``bench/load_batch.py``. Writes ``bench/results/local/h2d_<device>.json`` (or ``--out``) and
a PNG plot next to it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple, Sequence

import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from transfer_kernels import (AutoBackend, RowTable, TritonBackend, copy_rows,  # noqa: E402
                              get_backend, tuning)


class PoolGeometry(NamedTuple):
    """Row bytes per buffer of one pool (one row = one transfer unit)."""

    buffers: tuple[tuple[str, int], ...]  # (role, row bytes)
    note: str


# The pool families (until hicache.models provides the stacks). Rows hold 64 tokens
# where the pool is paged; DeepSeek-V4 rows are given directly in bytes.
POOLS: dict[str, PoolGeometry] = {
    "llama31_8b_kv": PoolGeometry((("k", 64 * 8 * 128 * 2), ("v", 64 * 8 * 128 * 2)),
                                  "64 tok x 8 kv heads x 128 x bf16, k and v"),
    "mla_dsv3": PoolGeometry((("kv", 64 * 576 * 2),), "64 tok x 576 bf16"),
    "dsa": PoolGeometry((("kv", 64 * 656), ("indexer", 64 * 128), ("indexer_scale", 64 * 4)),
                        "64 tok x (656 B fp8 MLA + 128 B indexer + 4 B fp32 scale)"),
    "v4_swa": PoolGeometry((("kv", 74880),), "DeepSeek-V4 sliding window"),
    "v4_c4_kv": PoolGeometry((("kv", 37440),), "DeepSeek-V4 4x-compressed KV"),
    "v4_c4_indexer": PoolGeometry((("indexer", 8448),), "DeepSeek-V4 c4 indexer"),
    "v4_c128_kv": PoolGeometry((("kv", 1728),), "DeepSeek-V4 128x-compressed KV"),
    "v4_c4_state": PoolGeometry((("state", 65536),), "DeepSeek-V4 c4 compressor state"),
    "v4_c4_indexer_state": PoolGeometry((("state", 16384),), "DeepSeek-V4 indexer state"),
}
COLUMNS = ("pool", "layout", "dir", "rows", "backend", "MB", "p50_ms", "GBps", "frac_limit")
GATE_CYCLES = 4_000_000  # ~2 ms of GPU sleep before each sample: longer than one call's host work


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    on_cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="hicache bench h2d", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", default=not on_cuda,
                   help="small sweep (default without CUDA): <= 64 rows, 2 layers, 5 reps")
    p.add_argument("--pools", default=None, help=f"comma list of {','.join(POOLS)}")
    p.add_argument("--max-rows", type=int, default=None, help="largest batch (rows per call)")
    p.add_argument("--layers", type=int, default=None, help="layers per pool")
    p.add_argument("--backends", default=None,
                   help="comma list; default: every backend that runs here (triton only on CUDA)")
    p.add_argument("--layouts", default="page_first,layer_first")
    p.add_argument("--directions", default="h2d,d2h")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--triton-programs", type=int, default=None,
                   help="grid cap of the triton backend (default: tuning.TRITON_MAX_PROGRAMS)")
    p.add_argument("--tile-bytes", type=int, default=None,
                   help="tile of the triton backend (default: tuning.TRITON_TILE_BYTES)")
    p.add_argument("--triton-warps", type=int, default=None,
                   help="warps per program of the triton backend (default: from the tile)")
    p.add_argument("--per-call", action="store_true",
                   help="CUDA: time each call's wall time, host preparation included (not gated)")
    p.add_argument("--out", type=Path, default=None, help="JSON path (PNG next to it)")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.device = torch.device("cuda" if on_cuda else "cpu")
    args.pools = args.pools.split(",") if args.pools else list(POOLS)
    unknown = [name for name in args.pools if name not in POOLS]
    if unknown:
        p.error(f"--pools: unknown {unknown}; allowed: {', '.join(POOLS)}")
    args.max_rows = args.max_rows or (64 if args.quick else 1024)
    args.layers = args.layers or (2 if args.quick else 4)
    args.reps = args.reps or (5 if args.quick else 20)
    default_backends = "torch,copy_engine,auto" + (",triton,dma" if on_cuda else "")
    args.backends = (args.backends or default_backends).split(",")
    args.layouts, args.directions = args.layouts.split(","), args.directions.split(",")
    args.batch_sizes = [n for n in (1, 4, 16, 64, 256, 1024) if n < args.max_rows]
    args.batch_sizes.append(args.max_rows)
    return args


class Sides(NamedTuple):
    host: RowTable
    device: RowTable


def build_sides(geom: PoolGeometry, layout: str, num_rows: int, num_layers: int,
                device: torch.device, gen: torch.Generator) -> Sides:
    """A random host buffer in ``layout`` (pinned on CUDA) and per-layer device tensors."""
    sizes = [n for _, n in geom.buffers]
    row = sum(sizes)
    shape = (num_rows, num_layers, row) if layout == "page_first" else (num_layers, num_rows, row)
    host = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
    if device.type == "cuda":
        host = host.pin_memory()
    offs = [sum(sizes[:b]) for b in range(len(sizes))]
    host_views = [[(host[:, l] if layout == "page_first" else host[l])[:, o:o + n]
                   for o, n in zip(offs, sizes)] for l in range(num_layers)]
    dev_views = [[torch.randint(0, 256, (num_rows, n), dtype=torch.uint8, generator=gen)
                  .to(device) for n in sizes] for _ in range(num_layers)]
    return Sides(RowTable.from_views(host_views, "host"), RowTable.from_views(dev_views, "device"))


def measure(args: argparse.Namespace, sides: Sides, name: str, layout: str, direction: str,
            num_rows: int, memcpy: harness.Memcpy, gen: torch.Generator) -> list[dict]:
    """All backends plus the memcpy limit for one (pool, layout, direction, batch)."""
    pool_rows = sides.host.num_rows
    src_rows = torch.randperm(pool_rows, generator=gen)[:num_rows]
    dst_rows = torch.randperm(pool_rows, generator=gen)[:num_rows]
    src, dst = (sides.host, sides.device) if direction == "h2d" else (sides.device, sides.host)
    layers = [0] if direction == "h2d" else None  # loads per layer, backups all layers
    num_bytes = num_rows * sum(src.row_bytes) * (1 if layers else src.num_layers)
    base = dict(pool=name, layout=layout, dir=direction, rows=num_rows,
                MB=num_bytes / 1e6, bytes=num_bytes,
                timing="per-call wall" if args.per_call or args.device.type != "cuda" else "gpu (gated)")
    limit = harness.time_fn(memcpy.fn(num_bytes, direction), args.device, reps=args.reps)
    rows = [dict(base, backend="memcpy", **limit._asdict())]
    gate = 0 if args.per_call or args.device.type != "cuda" else GATE_CYCLES
    for backend in args.backends:
        impl = make_backend(backend, args)
        t = harness.time_fn(lambda: copy_rows(src, dst, src_rows, dst_rows, layers, impl),
                            args.device, warmup=2, reps=args.reps, gate_cycles=gate)
        rows.append(dict(base, backend=backend, **t._asdict()))
    for r in rows:
        r["GBps"] = harness.gbps(num_bytes, r["p50_ms"])
        r["frac_limit"] = r["GBps"] / rows[0]["GBps"]
    return rows


def make_backend(name: str, args: argparse.Namespace):
    """A fresh backend; the triton one (alone or inside auto) with the CLI's grid and tile."""
    if args.triton_programs is None and args.tile_bytes is None and args.triton_warps is None:
        return get_backend(name)
    triton = TritonBackend(args.triton_programs, args.tile_bytes or tuning.TRITON_TILE_BYTES,
                           args.triton_warps)
    if name == "triton":
        return triton
    return AutoBackend(triton=triton) if name == "auto" else get_backend(name)


def sweep(args: argparse.Namespace) -> list[dict]:
    """Every configured (pool, layout, direction, batch size); prints as it goes."""
    gen = torch.Generator().manual_seed(0)
    pool_rows = 2 * args.max_rows  # scattered rows drawn from a pool twice the batch
    max_bytes = max(args.max_rows * sum(n for _, n in POOLS[p].buffers) * args.layers
                    for p in args.pools)
    memcpy = harness.Memcpy(max_bytes, args.device)
    print(harness.format_table([], COLUMNS))
    results = []
    for name in args.pools:
        for layout in args.layouts:
            sides = build_sides(POOLS[name], layout, pool_rows, args.layers, args.device, gen)
            for direction in args.directions:
                for n in args.batch_sizes:
                    rows = measure(args, sides, name, layout, direction, n, memcpy, gen)
                    print(harness.format_table(rows, COLUMNS).split("\n", 1)[1], flush=True)
                    results += rows
    return results


def plot(rows: list[dict], pools: Sequence[str], path: Path) -> Path | None:
    """GB/s vs rows per call, one panel per (pool, direction); None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not importable; skipping the plot")
        return None
    dirs = sorted({r["dir"] for r in rows})
    fig, axes = plt.subplots(len(pools), len(dirs), figsize=(5 * len(dirs), 2.6 * len(pools)),
                             squeeze=False)
    for (i, pool), (j, d) in ((a, b) for a in enumerate(pools) for b in enumerate(dirs)):
        ax = axes[i][j]
        for key in sorted({(r["backend"], r["layout"]) for r in rows}):
            pts = [(r["rows"], r["GBps"]) for r in rows
                   if r["pool"] == pool and r["dir"] == d and (r["backend"], r["layout"]) == key]
            if pts:
                ax.plot(*zip(*pts), marker="o", ls="-" if key[1] == "page_first" else "--",
                        label=f"{key[0]} {key[1]}")
        ax.set(xscale="log", title=f"{pool} {d}", xlabel="rows per call", ylabel="GB/s")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(argv: Sequence[str] | None = None) -> list[dict]:
    """Run the benchmark (the CLI ``hicache bench h2d`` delegates here).

    Args:
        argv: command-line arguments without the program name; ``None`` reads sys.argv.

    Returns:
        The result rows (also written as JSON, and plotted when matplotlib imports).
    """
    args = parse_args(argv)
    label = "CPU (memcpy; triton not timed)" if args.device.type == "cpu" \
        else harness.device_name(args.device)
    print(f"h2d benchmark on {label}: pools={args.pools} layers={args.layers} "
          f"rows={args.batch_sizes} backends={args.backends}")
    if args.device.type == "cuda":
        # A side stream, as the controller uses (the batched copy refuses the legacy one).
        with torch.cuda.stream(torch.cuda.Stream(args.device)):
            rows = sweep(args)
    else:
        rows = sweep(args)
    out = args.out or harness.RESULTS_DIR / f"h2d_{harness.device_slug(args.device)}.json"
    config = {k: (str(v) if isinstance(v, (Path, torch.device)) else v)
              for k, v in vars(args).items()}
    config["pool_geometry"] = {p: POOLS[p]._asdict() for p in args.pools}
    print(f"wrote {harness.write_json(out, rows, config, args.device)}")
    if not args.no_plot and (png := plot(rows, args.pools, out.with_suffix(".png"))):
        print(f"wrote {png}")
    return rows


if __name__ == "__main__":
    run()
