"""Tuning sweep of the triton backend: grid cap (SM budget) x tile bytes, on real pool rows.

Question answered: which ``TRITON_MAX_PROGRAMS`` / ``TRITON_TILE_BYTES`` give the best
H2D and D2H GB/s (as a fraction of the contiguous pinned-copy limit) for small, medium
and large rows? Runs ``bench.h2d`` once per setting and writes one JSON with every row.

    python bench/triton_grid.py [--programs 16,32,64,132] [--tiles 8192,16384]
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


def run(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--programs", default="16,32,64,132")
    p.add_argument("--tiles", default="8192,16384")
    p.add_argument("--pools", default="llama31_8b_kv,v4_c4_kv,v4_c128_kv")
    p.add_argument("--max-rows", default="1024")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA device (the interpreter's timings mean nothing)")
    device = torch.device("cuda")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for programs in args.programs.split(","):
            for tile in args.tiles.split(","):
                got = h2d.run(["--pools", args.pools, "--backends", "triton", "--layouts", "page_first",
                               "--max-rows", args.max_rows, "--reps", "10", "--no-plot",
                               "--triton-programs", programs, "--tile-bytes", tile,
                               "--out", f"{tmp}/h2d.json"])
                rows += [dict(r, programs=int(programs), tile=int(tile)) for r in got]
    out = args.out or harness.RESULTS_DIR / f"triton_grid_{harness.device_slug(device)}.json"
    harness.write_json(out, rows, vars(args) | {"out": str(out)}, device)
    best = {}
    for r in rows:
        if r["backend"] == "triton" and r["rows"] == int(args.max_rows):
            key = (r["pool"], r["dir"])
            if key not in best or r["GBps"] > best[key]["GBps"]:
                best[key] = r
    for (pool, d), r in sorted(best.items()):
        print(f"best {pool:16} {d}: programs={r['programs']} tile={r['tile']} "
              f"{r['GBps']:.1f} GB/s ({r['frac_limit']:.2f} of the limit)")
    print(json.dumps({"wrote": str(out)}))
    return out


if __name__ == "__main__":
    run()
