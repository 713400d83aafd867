"""Tuning sweep of the triton backend: grid cap (SM budget) x tile bytes x warps, on real pool rows.

Question answered: which ``TRITON_MAX_PROGRAMS`` / ``TRITON_TILE_BYTES`` / warps give the best
H2D and D2H GB/s (as a fraction of the contiguous pinned-copy limit) for small, medium and
large rows, and what each variant costs on the SM (registers, shared memory, spills)?
Runs ``bench.h2d`` (GPU-gated timing) once per setting and writes one JSON with every row,
plus the compiled kernels' resources (``transfer_kernels.cuda.inspect``; on the GPU also
the loaded kernels' ``n_regs`` / ``n_spills``).

    python bench/triton_grid.py [--programs 16,32,64,132] [--tiles 8192,32768]
                                [--warps 0,16] [--max-rows 256] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import h2d, harness  # noqa: E402
from transfer_kernels import TritonBackend  # noqa: E402
from transfer_kernels.cuda import inspect as triton_inspect  # noqa: E402
from transfer_kernels.backends.triton import kernel_module  # noqa: E402


def _resources(tiles: list[int], warps: list[int]) -> list[dict]:
    """Offline compile report per (tile, warps, alignment), and what the driver loaded."""
    out = []
    for tile in tiles:
        for w in warps:
            backend = TritonBackend(tile_bytes=tile, num_warps=w or None)
            for align in (16, 8, 4, 1):
                out.append(dict(triton_inspect.report(backend.vpt, align, backend.num_warps), tile=tile))
    for key, kernel in kernel_module().compiled_variants().items():
        out.append({"loaded": list(key), "n_regs": kernel.n_regs, "n_spills": kernel.n_spills,
                    "shared": kernel.metadata.shared})
    return out


def run(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--programs", default="16,32,64,132")
    p.add_argument("--tiles", default="8192,32768")
    p.add_argument("--warps", default="0,16", help="0: the default for the tile")
    p.add_argument("--pools", default="llama31_8b_kv,v4_c4_kv,v4_c4_indexer,v4_c128_kv")
    p.add_argument("--max-rows", default="256")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: bench/results/local/)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA device (the interpreter's timings mean nothing)")
    device = torch.device("cuda")
    tiles, warps = [int(t) for t in args.tiles.split(",")], [int(w) for w in args.warps.split(",")]
    rows = []
    harness.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=harness.RESULTS_DIR) as tmp:  # the sweep's per-setting JSON
        for programs in args.programs.split(","):
            for tile in tiles:
                for w in warps:
                    extra = ["--triton-warps", str(w)] if w else []
                    got = h2d.run(["--pools", args.pools, "--backends", "triton", "--layouts", "page_first",
                                   "--max-rows", args.max_rows, "--reps", "10", "--no-plot",
                                   "--triton-programs", programs, "--tile-bytes", str(tile),
                                   "--out", f"{tmp}/h2d.json", *extra])
                    rows += [dict(r, programs=int(programs), tile=tile, warps=w) for r in got]
    out = args.out or harness.RESULTS_DIR / f"triton_grid_{harness.device_slug(device)}.json"
    resources = _resources(tiles, warps)
    harness.write_json(out, rows + [{"resources": resources}], vars(args) | {"out": str(out)}, device)
    best = {}
    for r in rows:
        if r["backend"] == "triton" and r["rows"] == int(args.max_rows):
            key = (r["pool"], r["dir"])
            if key not in best or r["GBps"] > best[key]["GBps"]:
                best[key] = r
    for (pool, d), r in sorted(best.items()):
        print(f"best {pool:16} {d}: programs={r['programs']} tile={r['tile']} warps={r['warps'] or 'default'} "
              f"{r['GBps']:.1f} GB/s ({r['frac_limit']:.2f} of the limit)")
    for r in resources:
        print(json.dumps(r))
    print(json.dumps({"wrote": str(out)}))
    return out


if __name__ == "__main__":
    run()
