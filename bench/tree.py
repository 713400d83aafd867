"""Radix-tree bookkeeping speed: how many tokens per second pass through match + insert?

Workload: 200 conversations x 8 turns; each turn appends 512 new tokens to the
conversation so far; turns of all conversations interleave (turn 1 of every
conversation, then turn 2...). Per turn: ``match_prefix`` of the whole sequence, device
slots for the new tokens (evicting when short), ``insert`` of the whole sequence (which
queues the write-through backup), ``controller.start_writing()`` and one ``tree.poll()``.

Bookkeeping only: the stack is a 1-layer MHA with 8-byte rows per token and the copy
backend is `NullBackend`, which moves nothing (the controller's planning still runs).
Page 64, write-through, host tier twice the device.

    python bench/tree.py                      # writes bench/results/tree_cpu.json
    python bench/tree.py --device-tokens 262144   # a smaller device: eviction in the loop

Targets on the 2-core CPU: >= 15 M tokens/s through match + insert, poll <= 50 us.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from hicache import HiCacheConfig, build  # noqa: E402
from hicache.models import mha  # noqa: E402
from hicache.radix import HiRadixCache  # noqa: E402
from host_pools.memory import HostBudget  # noqa: E402
from transfer_kernels import CopyBackend  # noqa: E402


class NullBackend(CopyBackend):
    """A copy backend that copies nothing (bookkeeping benchmarks)."""

    name = "null"

    def _execute(self, plan) -> None:
        return None


def build_tree(device_tokens: int, page_size: int) -> HiRadixCache:
    stack = mha(1, 1, 4, dtype=torch.uint8, page_size=page_size, model="tiny-mha")
    config = HiCacheConfig(hicache_ratio=2.0, write_policy="write_through", io_backend="torch")
    budget = HostBudget(1 << 40, None, 0, 1, 1 << 40)
    cache = build(stack, device_tokens, config, device="cpu", budget=budget, backend=NullBackend())
    return HiRadixCache(cache)


def step(tree: HiRadixCache, seq: np.ndarray, clock: dict) -> None:
    """One turn: match, device slots for the new tokens, insert, launch, poll (each timed)."""
    dev, ctrl, n = tree.device_pool, tree.ctrl, seq.size
    t0 = time.perf_counter()
    m = tree.match_prefix(seq)
    t1 = time.perf_counter()
    need = n - m.device_hit_length
    tree.inc_lock_ref(m.last_device_node)
    new = dev.alloc(need)
    if new is None:
        clock["evicted_tokens"] += tree.evict(need - dev.available())
        new = dev.alloc(need)
    t2 = time.perf_counter()
    tree.insert(seq, torch.cat([m.device_slots, new]))
    t3 = time.perf_counter()
    tree.dec_lock_ref(m.last_device_node)
    ctrl.start_writing()
    t4 = time.perf_counter()
    tree.poll()
    t5 = time.perf_counter()
    for key, dt in (("match", t1 - t0), ("alloc_evict", t2 - t1), ("insert", t3 - t2),
                    ("launch", t4 - t3), ("poll", t5 - t4)):
        clock[key] += dt


def one_pass(args: argparse.Namespace) -> dict:
    """The whole workload on a fresh tree; per-call means in microseconds."""
    tree = build_tree(args.device_tokens, args.page_size)
    rng = np.random.default_rng(0)
    convs = rng.integers(0, 1 << 31, (args.conversations, args.turns * args.turn_tokens), dtype=np.int64)
    clock = dict.fromkeys(("match", "alloc_evict", "insert", "launch", "poll", "evicted_tokens"), 0.0)
    steps = tokens = 0
    t_start = time.perf_counter()
    for turn in range(1, args.turns + 1):  # turn t of every conversation, then turn t + 1
        for c in range(args.conversations):
            step(tree, convs[c, :turn * args.turn_tokens], clock)
            tokens += 2 * turn * args.turn_tokens  # through match and through insert
            steps += 1
    total = time.perf_counter() - t_start
    tree.check_integrity()
    row = {"steps": steps, "tokens_match_insert": tokens, "total_s": total,
           "mtokens_per_s": tokens / (clock["match"] + clock["insert"]) / 1e6,
           "evicted_tokens": int(clock.pop("evicted_tokens")), "backups": tree.counters["backups"],
           "host_used_tokens": tree.host_pool.allocator.used()}
    row.update({f"{k}_us": v / steps * 1e6 for k, v in clock.items()})
    return row


def run(args: argparse.Namespace) -> tuple[dict, list[float]]:
    """Best of ``args.repeats`` passes (the machine is shared: the best pass is the least disturbed)."""
    passes = [one_pass(args) for _ in range(args.repeats)]
    return max(passes, key=lambda r: r["mtokens_per_s"]), [r["mtokens_per_s"] for r in passes]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=200)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--turn-tokens", type=int, default=512)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--device-tokens", type=int, default=1 << 20,
                   help="device anchor tokens (default 1M: the whole workload fits, no eviction)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="passes; the best one is reported (default 3)")
    p.add_argument("--out", default=str(harness.RESULTS_DIR / "tree_cpu.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    row, all_passes = run(args)
    row["mtokens_per_s_all_passes"] = all_passes
    config = {k: v for k, v in vars(args).items() if k != "out"}
    config.update(backend="null (moves nothing)", stack="mha 1 layer, 1 head, head_dim 4, uint8",
                  write_policy="write_through", hicache_ratio=2.0)
    harness.write_json(Path(args.out), [row], config, torch.device("cpu"))
    cols = ["steps", "total_s", "match_us", "insert_us", "poll_us", "launch_us", "alloc_evict_us",
            "mtokens_per_s"]
    print(harness.format_table([row], cols))
    print(f"CPU, bookkeeping only; target >= 15 M tokens/s and poll <= 50 us -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
