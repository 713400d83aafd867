"""Radix-tree bookkeeping speed beside SGLang's, on SGLang's own workload (tokens counted once per turn).

Workload (the anchor's, ``bench/sglang_cpu_anchor.py``): 200
conversations x 8 turns; each turn appends 512 random tokens to the conversation so far;
turns interleave (turn 1 of every conversation, then turn 2...). Per turn:
``match_prefix`` of the whole sequence, device slots for the new tokens (not timed),
``insert`` of the whole sequence (which queues the write-through backup) and, with the
host tier, one scheduler step: ``controller.start_writing()`` + ``tree.poll()``. Then
eviction of 10 % of the cached tokens (device -> host), and with the host tier a re-visit
of every conversation that loads its host hit back (``load_back`` + ``start_loading`` +
``poll``). 1,000,000-slot device pool, host tier of ratio 2, write-through.

Counting, as the anchor counts: tokens/s = tokens of every turn's sequence, once per
turn, / (time in match + insert). Our ``match_prefix`` also returns the prefix's device
slots (a concatenation along the path); SGLang's ``match_prefix`` does not, the scheduler
gathers them with ``path_device_indices``, which the anchor times apart and leaves out of
its tokens/s. So two figures: ``mtokens_per_s`` (each side's match + insert, the anchor's
counting: SGLang's side does less work) and ``mtokens_per_s_same_work`` (SGLang's match +
``path_device_indices`` + insert; ours unchanged). "poll per step" is ``start_writing`` +
``poll`` per turn (SGLang: ``check_hicache_events``); "load-back per token" is the
load-back time over the tokens it brought back.

Bookkeeping only on both sides: hicache's copy backend moves nothing (`NullBackend`,
planning still runs), SGLang's copy kernels are stubbed to no-ops by the anchor. One
thread, CPU clock. Rounds alternate sides (ours, then SGLang's in a subprocess with the
interpreter that has SGLang 0.5.23 installed, see the anchor's docstring); medians of the
rounds and their ratios are reported. Both sides run with the anchor's fixed malloc
thresholds (this script re-executes itself with them, as the anchor does).

    python bench/tree.py --anchor-python /path/to/sglang-venv/bin/python   # writes bench/results/local/tree_cpu.json
    python bench/tree.py --rounds 1                                          # hicache only
    python bench/tree.py --hicache-eviction-policy all                       # every eviction policy
    python bench/tree.py --clock cpu ...     # both sides timed by their thread's CPU time (a busy VM)
    python bench/tree.py --before /path/to/old/checkout ...  # that checkout's tree (LRU) each round too

``--before``: a machine's speed drifts from day to day, and not the same for both sides
(on this VM SGLang's step took 110 us on one day and 158 on another), so a ratio to
SGLang taken on another day is no baseline; each round then also runs the other
checkout's tree (this script, that checkout's packages, in a subprocess) and reports
ours over it, paired per round (``gain_over_before``, ``poll_over_before``).

Targets: with the host tier >= 2x SGLang's tokens/s and poll per step <= 50 us; without
it >= SGLang's default Rust core (both figures are reported; the README says which meets what).
"""
from __future__ import annotations

import os
import sys

_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296"}
if __name__ == "__main__" and any(os.environ.get(k) != v for k, v in _MALLOC_ENV.items()):
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_MALLOC_ENV})

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402

from bench.tree_sides import CODE_ENV, anchor_round, before_round  # noqa: E402

# ``--before``'s side: this script run again with the tree of another checkout (its
# hicache, host_pools and transfer_kernels imported from there; this bench/ kept)
if os.environ.get(CODE_ENV):
    sys.path.insert(0, os.environ[CODE_ENV])

import hicache  # noqa: E402
from hicache import HiCacheConfig, build  # noqa: E402

try:
    from hicache.config import EVICTION_POLICIES  # noqa: E402
except ImportError:  # a checkout from before the policies: LRU only
    EVICTION_POLICIES = ("lru",)
from hicache.models import mha  # noqa: E402
from hicache.radix import HiRadixCache  # noqa: E402
from host_pools.memory import HostBudget  # noqa: E402
from transfer_kernels.fault import NullBackend  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ANCHOR = ROOT / "bench" / "sglang_cpu_anchor.py"  # shipped in bench/
CONVERSATIONS, TURNS, TURN_TOKENS, VOCAB, DEVICE_SLOTS = 200, 8, 512, 32000, 1_000_000
CASES = (("host", 64), ("host", 1), ("none", 64), ("none", 1))  # (host tier, page size)
MEAN_TURN_TOKENS = TURN_TOKENS * (TURNS + 1) / 2  # a turn's sequence, on average


def build_tree(page_size: int, host_tier: bool, device_slots: int = DEVICE_SLOTS,
               eviction_policy: str = "lru", load_gate=None) -> HiRadixCache:
    """A 1-layer MHA stack with 8-byte token rows, host tier of ratio 2, write-through
    (``load_gate``: the cost policy's gate, `hicache.cost.LoadGate`; None: load all found)."""
    stack = mha(1, 1, 4, dtype=torch.uint8, page_size=page_size, model="tiny-mha")
    policy = {"eviction_policy": eviction_policy} if len(EVICTION_POLICIES) > 1 else {}  # a checkout without them: LRU
    config = HiCacheConfig(hicache_ratio=2.0, write_policy="write_through", io_backend="torch", **policy)
    budget = HostBudget(1 << 40, None, 0, 1, 1 << 40)
    cache = build(stack, device_slots, config, device="cpu", budget=budget, backend=NullBackend())
    gate = {} if load_gate is None else {"load_gate": load_gate}  # a checkout from before the gate: none
    return HiRadixCache(cache, host_tier=host_tier, storage=None, **gate)


def conversations(seed: int = 0) -> np.ndarray:
    """The anchor's token ids: one row of ``TURNS * TURN_TOKENS`` ids per conversation."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, VOCAB, size=TURNS * TURN_TOKENS, dtype=np.int64)
                     for _ in range(CONVERSATIONS)])


CLOCKS = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}  # bench/sglang_anchor.py's


def one_pass(convs: np.ndarray, page_size: int, host_tier: bool, eviction_policy: str = "lru",
             clock: str = "wall") -> dict:
    """The whole workload on a fresh tree; times in microseconds (``clock``: `CLOCKS`)."""
    tree = build_tree(page_size, host_tier, eviction_policy=eviction_policy)
    dev, ctrl = tree.device_pool, tree.ctrl
    ns = CLOCKS[clock]
    match_ns = insert_ns = step_ns = tokens = steps = 0
    num_convs, turns = convs.shape[0], convs.shape[1] // TURN_TOKENS
    gc.collect()
    for turn in range(1, turns + 1):  # turn t of every conversation, then turn t + 1
        n = turn * TURN_TOKENS
        for c in range(num_convs):
            seq = convs[c, :n]
            t0 = ns()
            m = tree.match_prefix(seq)
            t1 = ns()
            new = dev.alloc(n - m.device_hit_length)
            slots = torch.cat((m.device_slots, new))
            t2 = ns()
            tree.insert(seq, slots)
            t3 = ns()
            if host_tier:  # one scheduler step: launch the queued backups, take the acks
                ctrl.start_writing()
                tree.poll()
            t4 = ns()
            match_ns += t1 - t0
            insert_ns += t3 - t2
            step_ns += t4 - t3
            tokens += n
            steps += 1
    tree.wait()
    cached = dev.num_tokens - dev.available()
    gc.collect()
    t0 = ns()
    evicted = tree.evict(cached // 10)
    evict_us = (ns() - t0) / 1e3
    lb_ns = lb_tokens = load_backs = 0
    if host_tier:  # re-visit every conversation: a host hit is loaded back
        for c in range(num_convs):
            m = tree.match_prefix(convs[c])
            if m.host_hit_length <= 0:
                continue
            t0 = ns()
            got = tree.load_back(m.last_host_node)
            ctrl.start_loading()
            tree.poll()
            lb_ns += ns() - t0
            assert got is not None and got["kv"].numel() == m.host_hit_length
            lb_tokens += m.host_hit_length
            load_backs += 1
    tree.check_integrity()
    seconds = (match_ns + insert_ns) / 1e9
    return {"tokens_counted_once": tokens, "mtokens_per_s": tokens / seconds / 1e6,
            "mtokens_per_s_same_work": tokens / seconds / 1e6,
            "match_us": match_ns / steps / 1e3, "insert_us": insert_ns / steps / 1e3,
            "poll_step_us": step_ns / steps / 1e3 if host_tier else None,
            "evicted_tokens": evicted, "evict_us": evict_us, "load_backs": load_backs,
            "load_back_us_per_token": lb_ns / lb_tokens / 1e3 if lb_tokens else None,
            "backups": tree.counters["backups"]}


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


KEYS = ("mtokens_per_s", "mtokens_per_s_same_work", "match_us", "insert_us", "poll_step_us", "evict_us",
        "load_back_us_per_token")


def run_rounds(args: argparse.Namespace, cases: list) -> tuple[dict, dict, dict, str | None]:
    """``args.rounds`` rounds: every case of ours under every eviction policy, then (with
    ``--before``) the other checkout's and (with an anchor interpreter) SGLang's. Ours are
    keyed (policy, case), the other sides' by case."""
    convs = conversations()
    ours: dict = {(p, c): [] for p in args.policies for c in cases}
    theirs: dict = {c: [] for c in cases}
    befores: dict = {c: [] for c in cases}
    version = None
    for r in range(args.rounds):
        for policy, case in ours:
            ours[policy, case].append(one_pass(convs, case[1], case[0] == "host", policy, args.clock))
        if args.before:
            got = before_round(args.before, args.pages, args.clock)
            for case in cases:
                befores[case].append(got[case])
        if args.anchor_python:
            got = anchor_round(args.anchor_python, Path(args.anchor), args.pages, args.clock, MEAN_TURN_TOKENS)
            version = got.pop("sglang")
            for case in cases:
                theirs[case].append(got[case])
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    return ours, theirs, befores, version


def summary_row(case: tuple, ours: list[dict], theirs: list[dict], policy: str = "lru",
                before: list[dict] | None = None) -> dict:
    """Medians of one case's rounds, SGLang's and ``--before``'s beside them, and the ratios
    (``gain_over_before``: ours over the before checkout's tokens/s, paired per round)."""
    row = {"eviction_policy": policy, "host_tier": case[0] == "host", "page_size": case[1]}
    for key in KEYS:
        row[key] = _median(ours, key)
        if theirs:
            row[f"sglang_{key}"] = _median(theirs, key)
    if theirs:
        row["sglang_device_indices_us"] = _median(theirs, "device_indices_us")
        row["speedup_tokens_per_s"] = row["mtokens_per_s"] / row["sglang_mtokens_per_s"]
        row["speedup_same_work"] = row["mtokens_per_s_same_work"] / row["sglang_mtokens_per_s_same_work"]
        paired = [a["mtokens_per_s"] / b["mtokens_per_s"] for a, b in zip(ours, theirs)]
        row["speedup_per_round"] = paired  # each of our passes over SGLang's next to it
        row["speedup_per_round_min_median_max"] = [min(paired), statistics.median(paired), max(paired)]
    if before:  # the --before checkout's tree (LRU), each round beside ours
        for key in ("mtokens_per_s", "poll_step_us"):
            row[f"before_{key}"] = _median(before, key)
        row["gain_over_before_per_round"] = [a["mtokens_per_s"] / b["mtokens_per_s"] for a, b in zip(ours, before)]
        row["gain_over_before"] = statistics.median(row["gain_over_before_per_round"])
        if row["poll_step_us"] is not None:
            row["poll_over_before"] = statistics.median(
                [a["poll_step_us"] / b["poll_step_us"] for a, b in zip(ours, before)])
        if theirs:
            row["before_speedup_tokens_per_s"] = row["before_mtokens_per_s"] / row["sglang_mtokens_per_s"]
    row["rounds"], row["sglang_rounds"], row["before_rounds"] = ours, theirs, before
    return row


def report(rows: list[dict], args: argparse.Namespace, version: str | None) -> None:
    """JSON under bench/results and the table (with SGLang's columns and per-round ratios)."""
    config = {"workload": f"{CONVERSATIONS} conv x {TURNS} turns x {TURN_TOKENS} new tokens, interleaved",
              "device_slots": DEVICE_SLOTS, "hicache_ratio": 2.0, "write_policy": "write_through",
              "eviction_policies": args.policies,
              "backend": "null (moves nothing)", "stack": "mha 1 layer, 1 head, head_dim 4, uint8",
              "counting": "tokens of each turn's sequence once per turn / (match + insert time)",
              "rounds": args.rounds, "alternating": bool(args.anchor_python), "sglang": version,
              "malloc_env": _MALLOC_ENV, "torch_threads": 1, "clock": args.clock,
              "before": _checkout_label(args.before)}
    harness.write_json(Path(args.out), rows, config, torch.device("cpu"))
    cols = ["eviction_policy", "host_tier", "page_size", "mtokens_per_s", "match_us", "insert_us", "poll_step_us",
            "evict_us", "load_back_us_per_token"]
    if version:
        cols += ["sglang_mtokens_per_s", "sglang_mtokens_per_s_same_work", "sglang_poll_step_us",
                 "sglang_load_back_us_per_token", "speedup_tokens_per_s", "speedup_same_work"]
    if args.before:
        cols += ["before_mtokens_per_s", "before_poll_step_us", "gain_over_before", "poll_over_before"]
    print(harness.format_table(rows, cols))
    for row in rows if version else ():
        lo, mid, hi = row["speedup_per_round_min_median_max"]
        print(f"{row['eviction_policy']:8} host tier {row['host_tier']!s:5} page {row['page_size']:2}: "
              "tokens/s ratio per round "
              f"(ours / SGLang's next to it) min {lo:.2f} median {mid:.2f} max {hi:.2f}")
    for row in rows if args.before else ():
        poll = (f", poll {row['poll_over_before']:.2f}x before's" if row.get("poll_over_before") is not None else "")
        vs = (f" (before: {row['before_speedup_tokens_per_s']:.2f}x SGLang)" if version else "")
        print(f"{row['eviction_policy']:8} host tier {row['host_tier']!s:5} page {row['page_size']:2}: "
              f"tokens/s {row['gain_over_before']:.2f}x the before checkout's (median of paired rounds){vs}{poll}")
    print(f"CPU ({args.clock} clock), bookkeeping only, tokens counted once per turn, medians of {args.rounds} round(s)"
          f"{f', alternating with SGLang {version}' if version else ' (no SGLang side: --anchor-python)'}"
          f" -> {args.out}")


def _checkout_label(path: Path | None) -> str | None:
    """``--before``'s checkout as the JSON names it: its path and commit."""
    if path is None:
        return None
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"{path} ({head.stdout.strip() or 'not a git checkout'}), lru"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds per side, alternating (default 3)")
    p.add_argument("--anchor-python", default=os.environ.get("SGLANG_PYTHON"),
                   help="interpreter with SGLang 0.5.23 (default $SGLANG_PYTHON; none: hicache only)")
    p.add_argument("--anchor", default=str(DEFAULT_ANCHOR), help="path of sglang_cpu_anchor.py")
    p.add_argument("--pages", type=int, nargs="+", default=[64, 1], choices=(64, 1))
    p.add_argument("--hicache-eviction-policy", dest="eviction_policy", default="lru",
                   help=f"eviction policies to run, comma-separated, or all ({', '.join(EVICTION_POLICIES)}; "
                        "default lru)")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                   help="what both sides time with: wall (perf_counter, default) or cpu (the timing "
                        "thread's CPU time: a machine shared with other jobs delays it less)")
    p.add_argument("--before", type=Path, default=None,
                   help="another checkout (e.g. an older commit's worktree): its tree (LRU) runs each round "
                        "beside ours, and the ratios to it are reported")
    p.add_argument("--emit-json", action="store_true", help=argparse.SUPPRESS)  # --before's side
    p.add_argument("--out", default=str(harness.RESULTS_DIR / "tree_cpu.json"))
    args = p.parse_args(argv)
    args.policies = list(EVICTION_POLICIES) if args.eviction_policy == "all" else args.eviction_policy.split(",")
    bad = [x for x in args.policies if x not in EVICTION_POLICIES]
    if bad:
        p.error(f"--hicache-eviction-policy: {bad[0]!r} is not one of {', '.join(EVICTION_POLICIES)} (or all)")
    if args.anchor_python and not Path(args.anchor).is_file():
        p.error(f"--anchor: {args.anchor} is not a file")
    if args.before is not None and not (args.before / "hicache" / "__init__.py").is_file():
        p.error(f"--before: {args.before} is not a hicache checkout (no hicache/__init__.py)")
    torch.set_num_threads(1)
    cases = [c for c in CASES if c[1] in args.pages]
    if args.emit_json:  # one round of this checkout's side, as JSON (``before_round`` reads it)
        convs = conversations()
        got = [[c[0], c[1], one_pass(convs, c[1], c[0] == "host", args.policies[0], args.clock)] for c in cases]
        print(json.dumps({"code": str(Path(hicache.__file__).resolve().parents[1]), "cases": got}))
        return 0
    ours, theirs, befores, version = run_rounds(args, cases)
    report([summary_row(c, ours[p, c], theirs[c], p, befores[c])
            for p in args.policies for c in cases], args, version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
