"""Hit rate vs host ratio on a trace: a thin wrapper around ``hicache replay``; and the cost
of the replay's bounds alone.

    python bench/replay.py                                    # built-in chat workload
    python bench/replay.py --trace data/mooncake_synthetic_trace.jsonl.xz \\
        --model deepseek-v4-flash --layers 4 --hicache-ratio 1,2,4 [--out PNG]
    python bench/replay.py --bounds [--copies 3]              # time the bounds (no replay)
    python bench/replay.py --matrix --policies lru,lfu [--quick] [--resume]   # policies x workloads
    python bench/replay.py --gap                              # why a replay's LRU is below the ideal LRU

Same flags as ``hicache replay``, plus ``--out`` (the plot's path, like ``--plot``); unless
one is given, the plot goes to the git-ignored results folder,
bench/results/local/replay_hit_rate.png (its path is printed), never over the tracked
bench/results/replay_hit_rate.png.

``--bounds`` times `hicache.replay.bounds` on the shipped trace repeated ``--copies``
times (3: a 12k-request trace; each copy with its own block ids, so the copies share
nothing), at pages of 64 and 256 tokens and four capacities: the set-up (naming the
blocks, their runs and next accesses) and each capacity's LRU and Belady, wall-clock
seconds on this machine (one run each: a shared machine makes them noisy). JSON to
bench/results/local/replay_bounds.json.

``--matrix`` replays every workload of the default-policy measurement (the shipped trace
and the ``sessions`` workload at 262,144 device tokens; the built-in chat, shared-prompts
and agents workloads at 32,768) with every ``--policies`` side by side, at ratios 0, 1,
2, 4, on DeepSeek-V4 Flash (2 layers, bf16 host), and the chat, shared-prompts and agents
workloads again on DeepSeek-V3 (1 layer) with ``--hicache-host-dtype int8`` (V4 Flash has
no pool int8 applies to; `SKIP` says why not the others). It prints one row per
(workload, host, ratio): each policy's hit rate, the bounds, each policy's margin over LRU
and the adaptive default's over its best fixed candidate (with the score it ended on);
JSON to bench/results/local/replay_policies.json, the plot (hit rate against ratio per
policy, the bounds dashed) beside it. ``--quick``: 200 requests of each.

``--gap`` explains the distance between a replay's LRU and the ideal LRU bound on the
shipped trace (262,144 device tokens, ratio 0 and 4): the ideal LRU again with, one at a
time, what a server adds: a write-through host that holds copies of device pages (the
distinct capacity is the host's tokens, not device + host), DeepSeek-V4's hybrid rule (a
hit ends where a state snapshot was saved: a prompt's end and its last 512-token boundary;
a snapshot leaves with its page), and a radix tree that evicts whole leaf nodes (runs of
blocks) rather than the pages it needs.
"""
from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.harness import RESULTS_DIR, RESULTS_MAX_BYTES, format_table, write_json  # noqa: E402
from bounded_input import read_json  # noqa: E402
from hicache.cli import main  # noqa: E402

PLOT = RESULTS_DIR / "replay_hit_rate.png"
TRACE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic_trace.jsonl.xz"
CAPACITIES = (262144, 524288, 1048576, 1310720)  # device tokens x (1, 2, 4, 5): ratio 0, 1, 3, 4 of 262,144


def replay_argv(argv: list[str]) -> list[str]:
    """``hicache replay``'s arguments: ``--out X`` becomes ``--plot X``; no plot flag: `PLOT`."""
    out = []
    for a in argv:  # every bench takes --out; for this one it names the plot
        out.append("--plot" if a == "--out" else "--plot=" + a[6:] if a.startswith("--out=") else a)
    if not any(a == "--plot" or a.startswith("--plot=") for a in out):
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)  # the default folder, ours to create
        out += ["--plot", str(PLOT)]
    return ["replay", *out]


def repeated_trace(copies: int) -> list:
    """The shipped trace ``copies`` times over, each copy's block ids shifted past the last's."""
    from hicache.replay.workload import load_trace
    base = load_trace(TRACE)
    shift = 1 + max(h for r in base for h in r.hash_ids)
    return [r._replace(hash_ids=tuple(h + c * shift for h in r.hash_ids)) for c in range(copies) for r in base]


def time_bounds(copies: int) -> list[dict]:
    """One row per (page size, capacity): the bounds and the seconds they took."""
    from hicache.replay.bounds import TraceBounds
    trace = repeated_trace(copies)
    rows = []
    for page in (64, 256):
        t0 = time.perf_counter()
        bounds = TraceBounds(trace, page)
        setup = time.perf_counter() - t0
        for capacity in CAPACITIES:
            t0 = time.perf_counter()
            b = bounds.at(capacity)
            rows.append({"requests": len(trace), "page": page, "capacity_tokens": capacity,
                         "setup_s": round(setup, 3), "capacity_s": round(time.perf_counter() - t0, 3),
                         "ideal_lru": round(b.lru, 4), "belady": round(b.belady, 4), "infinite": round(b.infinite, 4)})
    return rows


MATRIX_WORKLOADS = {"trace": ["--trace", str(TRACE), "--device-tokens", "262144"],
                    "chat": ["--workload", "chat"], "shared-prompts": ["--workload", "shared-prompts"],
                    "agents": ["--workload", "agents"],
                    "sessions": ["--workload", "sessions", "--device-tokens", "262144"]}
MATRIX_HOSTS = {"bf16": ["--model", "deepseek-v4-flash", "--layers", "2"],
                "int8": ["--model", "deepseek-v3", "--layers", "1", "--hicache-host-dtype", "int8"]}
# The trace through the int8 host takes hours on a CPU (the torch quantization of ~60 M tokens per run),
# and at a given ratio an int8 host holds as many tokens as a bf16 one: the same hits. The chat,
# shared-prompts and agents workloads only (sessions: 12 M prompt tokens per run, as the trace).
SKIP = {("trace", "int8"), ("sessions", "int8")}
from hicache.radix.policies.adaptive import CANDIDATES  # noqa: E402  (the adaptive default's)
HEADROOM_GIB = 0.25  # host memory left free: the CPU VM this ran on had about 1 GiB available


def matrix_pair(name: str, host: str, policies: str, quick: bool) -> list[dict]:
    """One (workload, host) replayed with every policy side by side; a row per ratio."""
    import contextlib
    import io
    import json
    out = io.StringIO()
    argv = ["replay", *MATRIX_WORKLOADS[name], *MATRIX_HOSTS[host], "--hicache-ratio", "1,2,4",
            "--hicache-eviction-policy", policies, "--hicache-host-headroom", str(HEADROOM_GIB), "--json",
            "--no-progress", *(["--max-requests", "200"] if quick else [])]
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit status {code}")
    runs, rows = json.loads(out.getvalue())["runs"], []
    for ratio in dict.fromkeys(r["hicache_ratio"] for r in runs):
        mine = {r["eviction_policy"]: r for r in runs if r["hicache_ratio"] == ratio}
        first = next(iter(mine.values()))
        row = {"workload": name, "host": host, "ratio": ratio, "capacity_tokens": first["capacity_tokens"]}
        row |= {p: round(r["hit_rate"], 4) for p, r in mine.items()}
        row |= {"ideal_lru": round(first["bound_lru"], 4), "belady": round(first["bound_belady"], 4),
                "infinite": round(first["bound_infinite"], 4)}
        row |= {f"{p}-lru": round(r["hit_rate"] - mine["lru"]["hit_rate"], 4) for p, r in mine.items()
                if p != "lru" and "lru" in mine}
        fixed = [mine[c]["hit_rate"] for c in CANDIDATES if c in mine]
        if "adaptive" in mine:  # the default against its best fixed candidate, and which one it ran at the end
            adaptive = mine["adaptive"]
            row |= {"adaptive-best": round(adaptive["hit_rate"] - max(fixed), 4) if fixed else None,
                    "adaptive_live": adaptive["live_score"], "adaptive_switches": adaptive["score_switches"]}
        rows.append(row | {"wall_s": round(time.perf_counter() - t0, 1)})
    return rows


def matrix_main(argv: list[str]) -> int:
    """``--matrix``: every pair in turn, the JSON rewritten after each; ``--resume`` skips the
    pairs the JSON already has (a run refused for memory on a shared machine: run it again)."""
    policies = argv[argv.index("--policies") + 1] if "--policies" in argv else "lru"
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else RESULTS_DIR / "replay_policies.json"
    rows = read_json(out, "a results file", RESULTS_MAX_BYTES)["rows"] if "--resume" in argv and out.exists() else []
    done = {(r["workload"], r["host"]) for r in rows}
    config = {"policies": policies, "quick": "--quick" in argv, "host_headroom_gib": HEADROOM_GIB}
    for name, host in itertools.product(MATRIX_WORKLOADS, MATRIX_HOSTS):
        if (name, host) in SKIP or (name, host) in done:
            continue
        rows += matrix_pair(name, host, policies, "--quick" in argv)
        print(format_table(rows[-4:], list(rows[-1])), flush=True)  # this pair's ratios as they come
        write_json(out, rows, config, torch.device("cpu"))
    print(format_table(rows, list(rows[0])))
    print(f"json: {write_json(out, rows, config, torch.device('cpu'))}")
    print(f"plot: {plot_matrix(rows, out.with_suffix('.png'))}")
    return 0


def plot_matrix(rows: list[dict], path: Path) -> Path:
    """Hit rate against ratio per policy, one panel per (workload, host), the three bounds dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pairs = list(dict.fromkeys((r["workload"], r["host"]) for r in rows))
    cols = 3
    fig, axes = plt.subplots(-(-len(pairs) // cols), cols, figsize=(5.2 * cols, 3.9 * -(-len(pairs) // cols)),
                             squeeze=False)
    skip = {"workload", "host", "ratio", "capacity_tokens", "ideal_lru", "belady", "infinite", "wall_s",
            "adaptive-best", "adaptive_live", "adaptive_switches"}
    for ax, (name, host) in zip(axes.flat, pairs):
        mine = sorted((r for r in rows if (r["workload"], r["host"]) == (name, host)), key=lambda r: r["ratio"])
        x = [r["ratio"] for r in mine]
        for policy in [k for k in mine[0] if k not in skip and "-lru" not in k]:
            ax.plot(x, [r[policy] for r in mine], marker="o", markersize=3,
                    linewidth=2.2 if policy == "adaptive" else 1, label=policy)
        for key, label, style in (("ideal_lru", "ideal LRU", ":"), ("belady", "Belady", "--"),
                                  ("infinite", "infinite", "-.")):
            ax.plot(x, [r[key] for r in mine], linestyle=style, color="gray", label=label)
        ax.set(title=f"{name}, {host} host", xlabel="--hicache-ratio (0 = device only)", ylabel="hit rate")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(pairs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def constrained_lru(requests: list, page: int, capacity: int, snapshots: bool, whole_nodes: bool) -> float:
    """The ideal prefix-block LRU (`hicache.replay.bounds`) with a server's constraints (``--gap``)."""
    from collections import OrderedDict

    from hicache.replay.bounds import TraceBounds, block_ids
    tb = TraceBounds(requests, page)
    node = dict(zip(np.concatenate(block_ids(requests, page)).tolist(), np.repeat(tb.runs, tb.weights).tolist()))
    order: OrderedDict[int, None] = OrderedDict()  # pages, oldest first
    saved: set[int] = set()  # pages a state snapshot ends at
    hits = 0
    for keys in block_ids(requests, page):
        ids = keys.tolist()
        run = next((i for i, k in enumerate(ids) if k not in order), len(ids))
        while snapshots and run and ids[run - 1] not in saved:  # V4: back to the last snapshot
            run -= 1
        hits += run
        if ids:  # the prompt's end, and its last 512-token boundary past the hit
            end = len(ids) * page
            saved.update([ids[-1]] + ([ids[(end - end % 512) // page - 1]] if run * page < end - end % 512 else []))
        for k in reversed(ids):
            order[k] = None
            order.move_to_end(k)
        while len(order) > capacity:
            gone, _ = order.popitem(last=False)
            saved.discard(gone)
            while whole_nodes and order and node[next(iter(order))] == node[gone]:  # the rest of its node
                saved.discard(order.popitem(last=False)[0])
    return hits * page / tb.prompt_tokens


def gap_main() -> int:
    from hicache.replay.workload import load_trace
    trace, device = load_trace(TRACE), 262144
    rows = []
    for page, ratio in itertools.product((256, 64), (0, 4)):
        total, host = device * (1 + ratio), device * ratio
        row = {"page": page, "ratio": ratio, "ideal_lru": round(constrained_lru(trace, page, total // page, False, False), 4)}
        if ratio:
            row["host_only"] = round(constrained_lru(trace, page, host // page, False, False), 4)
        cap = (host or device) // page
        row |= {"+snapshots": round(constrained_lru(trace, page, cap, True, False), 4),
                "+whole_nodes": round(constrained_lru(trace, page, cap, False, True), 4)}
        rows.append(row)
        print(row, flush=True)
    print(format_table(rows, ["page", "ratio", "ideal_lru", "host_only", "+snapshots", "+whole_nodes"]))
    return 0


def bounds_main(argv: list[str]) -> int:
    copies = int(argv[argv.index("--copies") + 1]) if "--copies" in argv else 3
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else RESULTS_DIR / "replay_bounds.json"
    rows = time_bounds(copies)
    print(format_table(rows, list(rows[0])))
    print(f"json: {write_json(out, rows, {'trace': TRACE.name, 'copies': copies}, torch.device('cpu'))}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(bounds_main(args) if "--bounds" in args else matrix_main(args) if "--matrix" in args
             else gap_main() if "--gap" in args else main(replay_argv(args)))
