"""The state interval's trade-off: snapshot bytes against hit tokens lost to boundaries.

    python bench/state_interval.py [--trace data/mooncake_synthetic_trace.jsonl.xz] [--out JSON]

A linear-attention hybrid's hit must end on a boundary with a state snapshot; a prefill
saves one at the prompt's end and every ``--hicache-state-interval`` tokens past its hit
(`hicache.replay.snapshots`). On a trace this script computes, per interval (page 64):

    infinite       hit rate of an infinite cache under that rule (every page a boundary: the
                   plain infinite bound; the difference is the hit lost to boundaries)
    lru            the ideal prefix-block LRU under the rule at ``--capacity`` tokens
    snapshots      snapshots the prefills save per 1,000 prompt tokens (infinite cache)
    per model      snapshot bytes per prompt token (every snapshot the prefills save, all
                   layers) beside the KV bytes per prompt token, for the four presets

Nothing is replayed: the bounds simulation (`hicache.replay.bounds.snapshot_hits`) is the
replay's rule at its tightest (what `docs/RESULTS.md` checked against DeepSeek-V4's replay).
JSON to bench/results/local/state_interval.json unless ``--out``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.harness import RESULTS_DIR, format_table, write_json  # noqa: E402
from hicache.models import preset  # noqa: E402
from hicache.replay.bounds import TraceBounds, block_ids, snapshot_hits  # noqa: E402
from hicache.replay.snapshots import SnapshotRule  # noqa: E402
from hicache.replay.workload import load_trace  # noqa: E402

TRACE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic_trace.jsonl.xz"
PAGE = 64
INTERVALS = (64, 512, 1024, 2048, 4096, 8192, 16384, 1 << 30)  # the last: the prompt's end only
MODELS = ("qwen3.5-27b", "qwen3.5-35b-a3b", "qwen3-next-80b-a3b", "nemotron-h-8b")


def model_costs() -> dict[str, tuple[int, float]]:
    """Per preset: (bytes of one snapshot, KV bytes per token), all layers, device format."""
    out = {}
    for name in MODELS:
        stack = preset(name)
        out[name] = (sum(stack.snapshot_bytes().values()), stack.row_bytes_per_anchor_page() / stack.page_size)
    return out


def measure(trace: Path, capacity: int) -> list[dict]:
    requests = load_trace(str(trace))
    prompt = sum(r.input_length for r in requests)
    pages = block_ids(requests, PAGE)
    plain = TraceBounds(requests, PAGE).at(capacity)
    costs = model_costs()
    rows = []
    for interval in INTERVALS:
        rule = SnapshotRule(interval, True)
        hits, saved = snapshot_hits(pages, rule, PAGE, None)
        lru = snapshot_hits(pages, rule, PAGE, capacity // PAGE)[0]
        row = {"interval": interval if interval < 1 << 30 else "end only", "infinite": round(hits * PAGE / prompt, 4),
               "lost": round(plain.infinite - hits * PAGE / prompt, 4), "lru": round(lru * PAGE / prompt, 4),
               "snapshots_per_1k": round(1000 * saved / prompt, 3)}
        for name, (snap, kv) in costs.items():
            row[f"{name} state/KV"] = round(saved * snap / prompt / kv, 3)
        rows.append(row)
        print(row, flush=True)
    rows.append({"interval": "plain (every page)", "infinite": round(plain.infinite, 4), "lost": 0.0,
                 "lru": round(plain.lru, 4), "snapshots_per_1k": None})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--capacity", type=int, default=1 << 20, help="tokens of the LRU bound (default %(default)s)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "state_interval.json")
    args = p.parse_args(argv)
    rows = measure(args.trace, args.capacity)
    print(format_table(rows, list(rows[0])))
    costs = {name: {"snapshot_bytes": s, "kv_bytes_per_token": kv} for name, (s, kv) in model_costs().items()}
    config = {"trace": args.trace.name, "page": PAGE, "capacity_tokens": args.capacity, "models": costs}
    print(f"json: {write_json(args.out, rows, config, torch.device('cpu'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
