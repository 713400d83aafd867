"""Memory over a long run, per eviction policy: RSS and the policy's structures against requests.

Two owners of a policy, each policy in a fresh process (RSS is the process's own):

    plugin   the vLLM plugin's `HostBlockIndex` (one group of ``--chunks`` host chunks);
             each request looks up 10 chunks: 6 of a hot shared prefix and 4 of a session
             (60 % one of 5,000 returning sessions, else new), then stores what it lacks
             (evicting once full); every 32nd loads its chain (pins)
    tree     `HiRadixCache` (1-layer tiny MHA, 16-token pages, 8,192 device tokens, host
             ratio 2, the null copy backend); the same kind of requests as token ids, 16
             pages each, with eviction when the device is short

Sampled ``--points`` times: RSS (``/proc/self/statm``), the entries the policy keeps
(heap entries of the plugin's order, ghosts, the adaptive policy's mini caches) and the
bytes it reports. ``--before CHECKOUT`` also runs that checkout's plugin index (its own
order code) for lfu, lfuda and adaptive, whose heaps grew with every lookup (issue 37).

    python bench/policy_memory.py                                # 200k plugin requests, 20k tree requests
    python bench/policy_memory.py --before /work/main --out bench/results/policy_memory_cpu.json

JSON to bench/results/local/policy_memory_cpu.json (``--out``), the plot beside it (.png).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(HERE.parent))

from bench import harness  # noqa: E402

CODE_ENV = "HICACHE_MEMORY_BENCH_CODE"  # a worker imports hicache from this checkout instead
if os.environ.get(CODE_ENV):
    sys.path.insert(0, os.environ[CODE_ENV])
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def chains(seed: int, keys_per_request: int = 10):
    """Endless requests as chains of chunk ids: a hot prefix of 6, then 4 of a session."""
    rng = random.Random(seed)
    hot, fresh = list(range(6)), iter(range(10**6, 10**12))
    sessions: list[list[int]] = []
    while True:
        if sessions and rng.random() < 0.6:
            tail = rng.choice(sessions)
        else:
            tail = [next(fresh) for _ in range(keys_per_request - len(hot))]
            sessions.append(tail)
            if len(sessions) > 5000:
                sessions.pop(rng.randrange(len(sessions)))
        yield hot + tail


def plugin_sizes(idx) -> dict:
    order = idx._order[0]
    if hasattr(order, "heap_entries"):  # this checkout's order
        policy = order.policy
        return {"heap_entries": order.heap_entries(), "ghosts": len(policy.history or ()),
                "shadow_entries": getattr(getattr(policy, "shadows", None), "entries", lambda: 0)(),
                "policy_bytes": policy.stats()["memory_bytes"]}
    heaps = sum(len(h) for h in getattr(order, "_heaps", ()))  # a checkout before the bound
    return {"heap_entries": heaps, "ghosts": len(getattr(order, "ghosts", ())), "shadow_entries": 0,
            "policy_bytes": 0}


def plugin_worker(policy: str, requests: int, chunks: int, points: int) -> list[dict]:
    from hicache.integrations.vllm.index import HostBlockIndex, Lookup
    idx = HostBlockIndex(chunks, 1, lambda key: 0, eviction_policy=policy)
    out, every = [], max(1, requests // points)
    for r, chain in zip(range(1, requests + 1), chains(0)):
        idx.touch(chain)
        plan = idx.prepare_store(chain)
        if plan is not None:
            idx.complete_store(plan.keys)
        if r % 32 == 0 and all(idx.lookup(k) is Lookup.HIT for k in chain):
            idx.prepare_load(chain)
            idx.complete_load(chain)
        if r % every == 0:
            out.append({"requests": r, "rss_bytes": rss_bytes(), **plugin_sizes(idx)})
    return out


def tree_worker(policy: str, requests: int, points: int) -> list[dict]:
    import numpy as np
    import torch

    from hicache import HiCacheConfig, build
    from hicache.models import mha
    from hicache.radix import HiRadixCache
    from host_pools.memory import HostBudget
    from transfer_kernels.fault import NullBackend
    page = 16
    stack = mha(1, 1, 4, dtype=torch.uint8, page_size=page, model="tiny-mha")
    config = HiCacheConfig(hicache_ratio=2.0, write_policy="write_through", io_backend="torch", eviction_policy=policy)
    cache = build(stack, 8192, config, device="cpu", budget=HostBudget(1 << 40, None, 0, 1, 1 << 40),
                  backend=NullBackend())
    tree, dev = HiRadixCache(cache, storage=None), cache.device_pools["kv"]
    out, every = [], max(1, requests // points)
    for r, chain in zip(range(1, requests + 1), chains(1, keys_per_request=16)):
        tokens = np.repeat(np.asarray(chain, dtype=np.int64) * 1000, page) + np.tile(np.arange(page), len(chain))
        m = tree.match_prefix(tokens)
        need = tokens.size - m.device_hit_length
        if dev.available() < need:
            tree.evict(need - dev.available())
        tree.insert(tokens, torch.cat([m.device_slots, dev.alloc(need)]))
        cache.controller.start_writing()
        tree.poll()
        if r % every == 0:
            policy_stats = tree.stats()["policy"]
            shadows = getattr(tree._order, "shadows", None)
            out.append({"requests": r, "rss_bytes": rss_bytes(), "ghosts": policy_stats["ghosts"],
                        "shadow_entries": shadows.entries() if shadows is not None else 0,
                        "policy_bytes": policy_stats["memory_bytes"]})
    return out


def worker(args: argparse.Namespace) -> None:
    if args.side == "plugin":
        rows = plugin_worker(args.worker, args.requests, args.chunks, args.points)
    else:
        rows = tree_worker(args.worker, args.tree_requests, args.points)
    print(json.dumps(rows))


def run_one(side: str, policy: str, args: argparse.Namespace, code: Path | None) -> list[dict]:
    env = {**os.environ}
    env.pop(CODE_ENV, None)
    if code is not None:
        env[CODE_ENV] = str(code)
        env["PYTHONPATH"] = str(code)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", policy, "--side", side,
           "--requests", str(args.requests), "--tree-requests", str(args.tree_requests),
           "--chunks", str(args.chunks), "--points", str(args.points)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=7200)
    if proc.returncode:
        raise RuntimeError(f"{side} {policy}: the worker failed: {proc.stderr[-1500:]}")
    label = policy if code is None else f"{policy} (before)"
    return [{"side": side, "policy": label, **row} for row in json.loads(proc.stdout.strip().splitlines()[-1])]


def plot(rows: list[dict], path: Path) -> None:
    """RSS and the policy's entries against requests, per policy, one column per owner."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sides = list(dict.fromkeys(r["side"] for r in rows))
    fig, axes = plt.subplots(2, len(sides), figsize=(6.5 * len(sides), 8), squeeze=False)
    for col, side in enumerate(sides):
        mine = [r for r in rows if r["side"] == side]
        for policy in dict.fromkeys(r["policy"] for r in mine):
            pts = [r for r in mine if r["policy"] == policy]
            x = [r["requests"] for r in pts]
            style = "--" if "before" in policy else "-"
            axes[0][col].plot(x, [r["rss_bytes"] / 2**20 for r in pts], style, label=policy)
            entries = [r.get("heap_entries", 0) + r["ghosts"] + r["shadow_entries"] for r in pts]
            axes[1][col].plot(x, entries, style, label=policy)
        axes[0][col].set(title=f"{side}: process RSS", ylabel="MiB")
        axes[1][col].set(title=f"{side}: entries the policy keeps (heap + ghosts + mini caches)",
                         xlabel="requests", ylabel="entries")
        axes[1][col].set_yscale("log")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hicache-eviction-policy", dest="policies", default="all", help="a list or 'all'")
    p.add_argument("--requests", type=int, default=200_000, help="plugin requests (10 lookups each)")
    p.add_argument("--tree-requests", type=int, default=20_000, help="tree requests")
    p.add_argument("--chunks", type=int, default=4096, help="host chunks of the plugin's group")
    p.add_argument("--points", type=int, default=40, help="samples per run")
    p.add_argument("--before", type=Path, default=None, help="another checkout: its plugin index too "
                                                              "(lfu, lfuda, adaptive)")
    p.add_argument("--sides", default="plugin,tree")
    p.add_argument("--out", default=str(harness.RESULTS_DIR / "policy_memory_cpu.json"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--side", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    policies = harness.eviction_policies(p, args.policies, {"--requests": args.requests, "--tree-requests":
                                         args.tree_requests, "--chunks": args.chunks, "--points": args.points})
    rows: list[dict] = []
    for side in args.sides.split(","):
        for policy in policies:
            rows += run_one(side, policy, args, None)
            print(f"{side:6s} {policy:9s} " + json.dumps(rows[-1]), flush=True)
        if side == "plugin" and args.before is not None:
            for policy in ("lfu", "lfuda", "adaptive"):
                rows += run_one(side, policy, args, args.before.resolve())
                print(f"{side:6s} {policy:9s} before " + json.dumps(rows[-1]), flush=True)
    config = {"plugin": f"{args.requests} requests of 10 lookups, {args.chunks} host chunks",
              "tree": f"{args.tree_requests} requests of 16 pages, 8192 device tokens, host ratio 2",
              "before": str(args.before) if args.before else None}
    out = harness.write_json(Path(args.out), rows, config, harness.torch.device("cpu"))
    png = Path(args.out).with_suffix(".png")
    plot(rows, png)
    print(f"-> {out}\n-> {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
