"""Estimated time to first token: the model against a published table, and per workload and tier.

Two questions, both answered from a device profile (`hicache.cost`), so both are estimates:

    --vllm-blog   vLLM's "KV offloading connector" blog (vllm-project.github.io, post of
                  2025-12-29, shown 2026-01-08): single-request TTFT of Llama-3.1-8B-Instruct
                  on an H100, prompts of 1K-100K tokens (their benchmark's sizes: 1024 and
                  10240 ... 102400), loading the prefix from CPU memory against recomputing it.
                  The blog states the gain as "X2-X22, depending on the prompt size" (its
                  per-size figures are a plot); here: our estimate per size on the h100 profile
                  (vLLM's CPU hit loads every full 16-token block but the one holding the last
                  prompt token, then computes the rest) and its ratio, beside that range.
    --table       `hicache replay` of the shipped trace and the built-in workloads at host
                  ratios 1, 2, 4 (the trace's first ``--trace-requests``) on three tiers: h100
                  with the host only, with a local NVMe file store (the profile's ``file``
                  figures) and with a slow remote store (1 GB/s,
                  2 ms: a profile written here); the slow store also under ``--hicache-load-policy
                  always``. Rows: TTFT p50 / p99 with and without the cache, prefill GPU-seconds
                  saved, requests whose hits the gate recomputed; every replay's mismatches.

    python bench/ttft.py --vllm-blog
    python bench/ttft.py --table [--workloads trace,chat] [--max-requests N]

Results: ``bench/results/local/ttft_vllm_blog.json`` / ``ttft_table_cpu.json`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from hicache.cost import load_profile, make_cost, profile_dict  # noqa: E402

RESULTS = harness.RESULTS_DIR
BLOG = {"source": "vllm-project/vllm-project.github.io _posts/2025-12-29-offloading-connector.md, Figure 1 "
                  "(single request TTFT, Llama-3.1-8B-Instruct, NVIDIA H100): 'loading KV values from the CPU "
                  "reduces TTFT by X2-X22, depending on the prompt size'; prompt sizes from its benchmark "
                  "(kv_offload_benchmark.py: 1K, 10K ... 100K tokens, 1 output token, GPU prefix cache off)",
        "ratio_low": 2.0, "ratio_high": 22.0}
BLOCK = 16  # vLLM's block size in the blog's runs
SLOW_STORE = {"read_gbps": 1.0, "write_gbps": 1.0, "read_latency_s": 0.002, "write_latency_s": 0.002,
              "measured": False, "source": "a slow remote store: 1 GB/s each way, 2 ms (bench/ttft.py --table)"}
WORKLOADS = ("trace", "chat", "shared-prompts", "agents")
COLUMNS = ("workload", "tier", "policy", "ratio", "hit_rate", "ttft_p50_s", "ttft_p99_s", "ttft_nocache_p50_s",
           "ttft_nocache_p99_s", "prefill_gpu_s_saved", "prefill_gpu_s_nocache", "requests_recomputing_hits",
           "mismatches")


def vllm_blog() -> dict:
    """Our h100 estimate of the blog's single-request benchmark, size by size."""
    cost = make_cost(load_profile("h100"), "llama-3.1-8b")
    rows = []
    for k in (1, *range(10, 101, 10)):
        prompt = k * 1024
        loaded = (prompt - 1) // BLOCK * BLOCK
        recompute, hit = cost.prefill.seconds(prompt, 0), cost.seconds(prompt, 0, loaded, loaded)
        rows.append({"prompt_tokens": prompt, "recompute_s": recompute, "cpu_hit_s": hit, "ratio": recompute / hit})
    return {"blog": BLOG, "profile": "h100", "rows": rows}


def tiers(folder: Path) -> dict[str, list[str]]:
    """The replay flags of each tier (the slow store's profile written into ``folder``); each
    call's stores are fresh folders, so no replay starts warm from another's pages."""
    doc = profile_dict(load_profile("h100"))
    doc["storage"]["file"] = SLOW_STORE
    slow = folder / "h100_slow_store.json"
    slow.write_text(json.dumps(doc))

    def store(name: str) -> list[str]:
        return ["--hicache-storage-backend", "file", "--hicache-storage-dir", tempfile.mkdtemp(prefix=name, dir=folder),
                "--hicache-storage-capacity", "8", "--hicache-storage-prefetch-policy", "wait_complete"]
    return {"host only": ["--device-profile", "h100"], "local NVMe": ["--device-profile", "h100", *store("nvme")],
            "slow remote": ["--device-profile", str(slow), *store("slow")]}


def replay(workload: str, flags: list[str], args: argparse.Namespace) -> list[dict]:
    # the trace's prompts are long: 262,144 device tokens, as the eviction matrix replays it (bench/replay.py)
    what = ["--trace", str(ROOT / "data" / "mooncake_synthetic_trace.jsonl.xz"), "--device-tokens", "262144"] \
        if workload == "trace" else ["--workload", workload]
    count = args.trace_requests if workload == "trace" else args.max_requests
    limit = ["--max-requests", str(count)] if count else []
    cmd = [sys.executable, "-m", "hicache.cli", "replay", "--json", "--no-progress", "--allow-device-only", *what,
           "--model", args.model, "--layers", str(args.layers), "--hicache-ratio", "1,2,4", *limit, *flags,
           "--hicache-host-headroom", "0.25"]  # a shared VM: the replay's pools are small, the default headroom not
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if run.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {run.returncode}: {run.stderr[-2000:]}")
    return json.loads(run.stdout)["runs"]


def table(args: argparse.Namespace, out: Path) -> dict:
    """Every (workload, tier, policy)'s replay; the document is rewritten after each, so a run
    stopped part way keeps what finished."""
    doc = {"model": args.model, "layers_replayed": args.layers, "max_requests": args.max_requests,
           "trace_requests": args.trace_requests, "slow_store": SLOW_STORE, "rows": []}
    with tempfile.TemporaryDirectory(prefix="ttft-", dir=RESULTS) as tmp:
        for workload in args.workloads:
            for tier in ("host only", "local NVMe", "slow remote"):
                for policy in ("cost", "always") if tier == "slow remote" else ("cost",):
                    t0 = time.perf_counter()
                    for r in replay(workload, [*tiers(Path(tmp))[tier], "--hicache-load-policy", policy], args):
                        doc["rows"].append({"workload": workload, "tier": tier, "policy": policy,
                                            "ratio": r["hicache_ratio"], **{k: r[k] for k in COLUMNS[4:]}})
                    print(f"{workload} / {tier} / {policy}: {time.perf_counter() - t0:.0f} s", flush=True)
                    write(out, doc)
    return doc


def write(out: Path, doc: dict) -> None:
    out.write_text(json.dumps({**doc, "date": time.strftime("%Y-%m-%d"),
                               "device": "CPU VM (estimates from the profile)"}, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/ttft.py", description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--vllm-blog", action="store_true", help="our estimate of vLLM's published single-request TTFT")
    mode.add_argument("--table", action="store_true", help="estimated TTFT per workload, tier and ratio")
    p.add_argument("--model", default="deepseek-v4-flash")
    p.add_argument("--layers", type=int, default=4, help="layers replayed (the estimate is of the whole model)")
    p.add_argument("--workloads", type=lambda s: s.split(","), default=list(WORKLOADS))
    p.add_argument("--max-requests", type=int, default=None, help="of each built-in workload (default: all)")
    p.add_argument("--trace-requests", type=int, default=400, help="of the shipped trace (default %(default)s)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if bad := [w for w in args.workloads if w not in WORKLOADS]:
        p.error(f"--workloads: unknown {bad[0]!r}; allowed: {', '.join(WORKLOADS)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / ("ttft_vllm_blog.json" if args.vllm_blog else "ttft_table_cpu.json")
    doc = vllm_blog() if args.vllm_blog else table(args, out)
    write(out, doc)
    for r in doc["rows"]:
        print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
