"""Hit rate at equal host bytes: the bf16 host tier vs the int8 one, on a request trace.

    python bench/host_dtype_replay.py --trace path/to/mooncake_trace.jsonl

The same ``--hicache-size`` (host GB) is given to a device-only run, a bf16 host tier
(``--hicache-host-dtype auto``) and an int8 one; the int8 tier's host rows are int8 plus one
fp32 scale per token and head, so the same bytes hold ~1.9x the tokens (head_dim 128: 132
bytes per token and head instead of 256) and more of the trace's prefixes come back from the
host (the host mirrors the device: only host capacity beyond the device's adds hits). Every
run goes through `hicache replay`'s machinery (tree, controller, real copies on CPU, every
loaded page checked against what its prefix must hold).

The hit rate depends on token capacity only, so the model is one MHA layer of ``--kv-heads``
heads of ``--head-dim`` (the bytes per token of each head are a real model's; fewer layers
and heads only make the replay faster). Writes JSON and a PNG under ``bench/results/local/``
unless ``--out`` names the JSON.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.harness import RESULTS_DIR, format_table, write_json  # noqa: E402
from hicache.build import build  # noqa: E402
from hicache.config import HiCacheConfig  # noqa: E402
from hicache.models.dense import mha  # noqa: E402
from hicache.replay.report import json_row  # noqa: E402
from hicache.replay.run import Replayer  # noqa: E402
from hicache.replay.workload import load_trace  # noqa: E402

RUNS = (("device only", None), ("bf16 host", "auto"), ("int8 host", "int8"))


def replay(stack, requests, device_tokens: int, host_gb: float, host_dtype: str | None) -> dict:
    """One run: ``host_dtype`` ``None`` is the device-only baseline (no host tier)."""
    config = (HiCacheConfig(hicache_ratio=1e-12) if host_dtype is None  # no host rows at all
              else HiCacheConfig(hicache_size_gb=host_gb, io_backend="torch", host_dtype=host_dtype))
    cache = build(stack, device_tokens, config, device="cpu")
    try:
        host_tokens = cache.host_group.pools[stack.anchor.name].num_tokens if host_dtype else 0
        replayer = Replayer(cache, 0.0 if host_dtype is None else 1.0)
        try:
            st = replayer.run(requests)
        finally:
            replayer.close()
        return {**json_row(st), "host_tokens": host_tokens, "wall_s": round(st.wall_s, 1)}
    finally:
        cache.close()


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Device and host hit rates per run, stacked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [r["run"] for r in rows]
    dev = [r["device_hit_rate"] for r in rows]
    host = [r["host_hit_rate"] for r in rows]
    ax.bar(names, dev, label="device hits")
    ax.bar(names, host, bottom=dev, label="host hits")
    for i, r in enumerate(rows):
        ax.text(i, r["hit_rate"], f"{r['hit_rate']:.3f}", ha="center", va="bottom")
    ax.set_ylabel("prompt tokens served from cache")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, required=True, help="Mooncake JSONL trace")
    p.add_argument("--device-tokens", type=int, default=262144, help="device tokens (default %(default)s)")
    p.add_argument("--hicache-size", dest="host_gb", type=float, default=1.0,
                   help="host GB (1e9 bytes) of both host tiers (default %(default)s)")
    p.add_argument("--head-dim", type=int, default=128, help="(default %(default)s: Llama/Qwen-class)")
    p.add_argument("--kv-heads", type=int, default=1, help="(default %(default)s)")
    p.add_argument("--max-requests", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "host_dtype_replay.json")
    args = p.parse_args(argv)
    if not args.trace.is_file():
        p.error(f"--trace: no file at {args.trace}")
    for name in ("device_tokens", "head_dim", "kv_heads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1")
    if not args.host_gb > 0:
        p.error("--hicache-size: must be > 0 GB")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    requests = load_trace(str(args.trace), args.max_requests)
    stack = mha(1, args.kv_heads, args.head_dim, torch.bfloat16, page_size=64, model="host-dtype-replay")
    t0 = time.perf_counter()
    rows = [{"run": name, **replay(stack, requests, args.device_tokens, args.host_gb, dtype)}
            for name, dtype in RUNS]
    config = {k: str(v) for k, v in vars(args).items()} | {
        "requests": len(requests), "seconds": round(time.perf_counter() - t0, 1)}
    write_json(args.out, rows, config, torch.device("cpu"))
    title = (f"{args.trace.name}, {len(requests)} requests\n{args.device_tokens} device tokens, "
             f"{args.host_gb:g} GB host, {args.kv_heads} x {args.head_dim} bf16 KV per layer")
    plot(rows, args.out.with_suffix(".png"), title)
    print(format_table(rows, ("run", "host_tokens", "host_capacity_bytes", "hit_rate", "device_hit_rate",
                              "host_hit_rate", "mismatches", "wall_s")))
    print(f"{args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
