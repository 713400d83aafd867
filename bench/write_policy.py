"""Write policy and storage admission, chosen by measurement: replays side by side.

    python bench/write_policy.py                  # write policy x workload x ratio x storage on/off
    python bench/write_policy.py --quick          # 200 requests of each workload (a smoke run)
    python bench/write_policy.py --admission      # storage admission: bytes written against hits
    python bench/write_policy.py --resume         # keep the rows the JSON has, run the rest

The write-policy matrix replays every workload of the eviction-policy table
(`bench/replay.py --matrix`: the shipped trace at 262,144 device tokens, the built-in chat,
shared-prompts and agents workloads at 32,768; DeepSeek-V4 Flash, 2 layers, bf16 host) under
each of ``write_through``, ``write_through_selective`` and ``write_back`` at host ratios 1,
2 and 4, once with the host alone and once with a file storage tier below it (a fresh
store per replay under the git-ignored results folder, capped at `STORE_GB`, removed
after). Every page that comes back is checked byte for byte by the replay itself; a
mismatch stops the bench. JSON: bench/results/local/write_policy.json (``--out`` names
another path).

``--admission`` replays `make run`'s workload (DeepSeek-V4 Flash, 4 layers, the chat
workload, 1 GB store) and the shipped trace (2 layers, 262,144 device tokens) with a file
store under every ``--hicache-storage-admission`` rule of `ADMISSIONS`: per run the hit
rate, the storage hit rate, GB written to storage and bytes written per storage-hit token.
JSON: bench/results/local/storage_admission.json.

The eviction and write policies are the defaults (``hicache replay``'s) but where the
matrix sets the write policy. Each replay runs in this
process, one after another (a shared machine: no two at once).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.harness import RESULTS_DIR, format_table, write_json  # noqa: E402
from hicache.cli import main  # noqa: E402

TRACE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic_trace.jsonl.xz"
WORKLOADS = {"trace": ["--trace", str(TRACE), "--device-tokens", "262144"],
             "chat": ["--workload", "chat"], "shared-prompts": ["--workload", "shared-prompts"],
             "agents": ["--workload", "agents"]}
MODEL = ["--model", "deepseek-v4-flash", "--layers", "2"]
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
STORE_GB = {"trace": 2.0}  # the file store's cap per replay (default 1 GB, as `make run`)
HEADROOM_GIB = 0.25  # host memory left free: several jobs share this VM's memory
# `make run`'s replay (scripts/run.sh) and the shipped trace, for the admission rules
ADMISSION_RUNS = {"make run": ["--workload", "chat", "--model", "deepseek-v4-flash", "--layers", "4"],
                  "trace": ["--trace", str(TRACE), "--device-tokens", "262144", *MODEL]}
# --hicache-storage-admission per workload (1 = every page); the trace's replays take ~10x longer
ADMISSIONS = {"make run": (1, 2, 3, 4), "trace": (1, 2, 3)}


def replay(argv: list[str], store_gb: float | None) -> list[dict]:
    """One ``hicache replay --json`` in this process (with a fresh capped file store when
    ``store_gb``); its runs with a host tier. Raises RuntimeError on a nonzero exit."""
    store = None
    if store_gb:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        store = tempfile.mkdtemp(prefix="write-policy-store.", dir=RESULTS_DIR)
        argv = [*argv, "--hicache-storage-backend", "file", "--hicache-storage-dir", store,
                "--hicache-storage-capacity", str(store_gb)]
    out = io.StringIO()
    full = ["replay", *argv, "--hicache-host-headroom", str(HEADROOM_GIB), "--json", "--no-progress"]
    try:
        with contextlib.redirect_stdout(out):
            code = main(full)
    finally:
        if store is not None:
            shutil.rmtree(store, ignore_errors=True)
    if code != 0:
        raise RuntimeError(f"hicache {' '.join(full)}: exit status {code}")
    runs = json.loads(out.getvalue())["runs"]
    if any(r["mismatches"] for r in runs):
        raise RuntimeError(f"hicache {' '.join(full)}: byte mismatches")
    return [r for r in runs if r["hicache_ratio"] > 0]


def _hits(r: dict) -> dict:
    return {"hit": round(r["hit_rate"], 4), "host_hit": round(r["host_hit_rate"], 4),
            "storage_hit": round(r["storage_hit_rate"], 4), "gb_d2h": round(r["bytes_d2h"] / 1e9, 3),
            "gb_storage_written": round(r["bytes_storage_written"] / 1e9, 3)}


def matrix_rows(name: str, storage: bool, quick: bool) -> list[dict]:
    """One workload with or without storage: a row per ratio, every write policy side by side."""
    t0, by = time.perf_counter(), {}
    for policy in WRITE_POLICIES:
        argv = [*WORKLOADS[name], *MODEL, "--hicache-ratio", "1,2,4", "--hicache-write-policy", policy,
                *(["--max-requests", "200"] if quick else [])]
        by[policy] = replay(argv, STORE_GB.get(name, 1.0) if storage else None)
    rows = []
    for i, first in enumerate(by["write_through"]):
        row = {"workload": name, "storage": "file" if storage else "none", "ratio": first["hicache_ratio"]}
        for policy in WRITE_POLICIES:
            row |= {f"{policy}:{k}": v for k, v in _hits(by[policy][i]).items()}
        row["write_back-write_through"] = round(by["write_back"][i]["hit_rate"] - first["hit_rate"], 4)
        rows.append(row | {"wall_s": round(time.perf_counter() - t0, 1)})
    return rows


def admission_rows(name: str, rule: int, quick: bool) -> list[dict]:
    """One admission rule on one workload, a row per ratio."""
    argv = [*ADMISSION_RUNS[name], "--hicache-ratio", "1,2,4", "--hicache-storage-admission", str(rule),
            *(["--max-requests", "200"] if quick else [])]
    t0 = time.perf_counter()
    runs = replay(argv, STORE_GB.get(name, 1.0))
    rows = []
    for r in runs:
        written, hit_tokens = r["bytes_storage_written"], r["storage_hit_rate"] * r["tokens_total"]
        rows.append({"workload": name, "admission": rule, "ratio": r["hicache_ratio"], **_hits(r),
                     "bytes_per_storage_hit_token": round(written / hit_tokens, 1) if hit_tokens else None,
                     "wall_s": round(time.perf_counter() - t0, 1)})
    return rows


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--admission", action="store_true", help="storage admission rules instead of the write policies")
    p.add_argument("--quick", action="store_true", help="200 requests of each workload (a smoke run)")
    p.add_argument("--resume", action="store_true", help="keep the rows the JSON has, run the rest")
    p.add_argument("--out", type=Path, default=None, help="the JSON (default: under bench/results/local/)")
    return p.parse_args(argv)


def run(argv: list[str]) -> int:
    args = parse(argv)
    admission, quick = args.admission, args.quick
    out = args.out or RESULTS_DIR / ("storage_admission.json" if admission else "write_policy.json")
    rows = json.loads(out.read_text())["rows"] if args.resume and out.exists() else []
    if admission:
        cases = [(n, r) for n in ADMISSION_RUNS for r in ADMISSIONS[n]]
        done = {(r["workload"], r["admission"]) for r in rows}
        step = admission_rows
    else:
        cases = list(itertools.product(WORKLOADS, (False, True)))
        done = {(r["workload"], r["storage"] == "file") for r in rows}
        step = matrix_rows
    config = {"quick": quick, "model": "deepseek-v4-flash", "store_gb": STORE_GB, "host_headroom_gib": HEADROOM_GIB}
    for case in cases:
        if case in done:
            continue
        rows += step(*case, quick)
        print(format_table(rows[-3:], list(rows[-1])), flush=True)
        write_json(out, rows, config, torch.device("cpu"))
    print(format_table(rows, list(rows[0])))
    print(f"json: {write_json(out, rows, config, torch.device('cpu'))}")
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
