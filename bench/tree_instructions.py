"""Instructions per turn of the radix tree's phases (valgrind's callgrind), beside SGLang
0.5.23's and another checkout's: `bench/tree.py`'s workload, counted instead of timed.

On a shared VM one pass of `bench/tree.py` moves +-30 % from minute to minute, so a cut of
5-10 % cannot be seen in its times without many rounds. An instruction count does not
move: the same code on the same inputs executes the same instructions. It is a proxy for
time, not time: a memory copy counts one instruction per byte here (``rep movsb``) and a
cache miss counts nothing, so compare counts with counts, and times with times.

Each (side, page size, policy, phase) is one run of the workload's first
``--conversations`` conversations x 8 turns under ``valgrind --tool=callgrind``, started
uninstrumented and collecting only inside that phase (through `callgrind_toggle`, a small
C helper in ``bench/native/`` compiled on first use with the system compiler and
valgrind's headers). Phases, per turn, as `bench/tree.py` times them:

    match    match_prefix                       (SGLang: match_prefix)
    path     -                                  (SGLang: path_device_indices, which our
                                                 match includes: "same work" adds it)
    insert   insert, which queues the backup    (SGLang: insert)
    step     start_writing + poll               (SGLang: check_hicache_events)
    decide   ours only: the load-or-recompute decision of ``--hicache-load-policy cost``
             (``load_target`` on the match, then the gate's ``end`` weighing the turn's whole prefix
             as if it were on the host: what a request with a host hit pays), Llama-3.1-8B
             on the h100 profile; ``decide_share`` = decide / (match + insert + step)

Ours and ``--before`` run 1 layer MHA with the host tier (ratio 2, write-through, the null
backend); SGLang's side its UnifiedRadixCache + HiCache with stubbed copy kernels (the
anchor's ``run_hicache_workload`` setup). Counts are per turn (instructions / turns).

    python bench/tree_instructions.py                                  # ours, pages 64 and 1, LRU
    python bench/tree_instructions.py --anchor-python ~/sglang-venv/bin/python --before ../old
    python bench/tree_instructions.py --hicache-eviction-policy all

Needs valgrind (with its headers: Debian ``valgrind``) and a C compiler; says so and stops
without them. Results: bench/results/local/tree_instructions_cpu.json (``--out``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.tree_sides import CODE_ENV  # noqa: E402

HELPER_SOURCE = HERE / "native" / "callgrind_toggle.c"
PHASES = {"ours": ("match", "insert", "step", "decide"), "before": ("match", "insert", "step"),
          "sglang": ("match", "path", "insert", "step")}
TURNS = 8  # the workload's turns per conversation (bench/tree.py's TURNS)
# the anchor (SGLang's side) re-executes itself unless malloc runs with these (bench/tree.py's too)
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296"}
HELPER_BUILD = """import sysconfig, sys
print(sysconfig.get_paths()["include"]); print(sysconfig.get_config_var("EXT_SUFFIX"))"""


class Unavailable(RuntimeError):
    """valgrind, its headers or a C compiler is missing (the message says which)."""


def helper_for(python: str, build_dir: Path) -> Path:
    """The directory holding `callgrind_toggle` built for ``python`` (built once per interpreter)."""
    if shutil.which("valgrind") is None:
        raise Unavailable("valgrind is not installed (Debian: apt-get install valgrind)")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise Unavailable("no C compiler (cc or gcc) to build bench/native/callgrind_toggle.c")
    include, suffix = subprocess.run([python, "-c", HELPER_BUILD], capture_output=True, text=True,
                                     check=True).stdout.split()
    out = build_dir / hashlib.sha1(f"{include}{suffix}".encode()).hexdigest()[:12]  # one per Python build
    target = out / f"callgrind_toggle{suffix}"
    if not target.exists():
        out.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(HELPER_SOURCE), "-o", str(target)],
                              capture_output=True, text=True)
        if proc.returncode:
            raise Unavailable(f"could not build the callgrind helper (valgrind's headers missing?): "
                              f"{proc.stderr.strip()[-500:]}")
    return out


def summary(dump: Path) -> int:
    """Instructions a callgrind dump file collected (its ``summary:`` line)."""
    for line in dump.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise ValueError(f"{dump}: no 'summary:' line (not a callgrind dump)")


def count(side: str, python: str, helper: Path, phase: str, page: int, policy: str, conversations: int,
          code: Path | None, work: Path) -> float:
    """Instructions per turn of ``phase``: one run of this script's worker under callgrind."""
    tag = f"{side}-{page}-{policy}-{phase}"
    out = work / f"{tag}.out"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
           f"--callgrind-out-file={out}", python, str(Path(__file__).resolve()), "--worker", side,
           "--phase", phase, "--page", str(page), "--worker-policy", policy, "--conversations", str(conversations),
           "--helper", str(helper)]
    env = {**os.environ, **MALLOC_ENV}
    env.pop(CODE_ENV, None)
    if code is not None:
        env[CODE_ENV] = str(code)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    dumps = sorted(work.glob(f"{tag}.out.*"))
    if proc.returncode or not dumps:
        raise RuntimeError(f"{tag}: the counted run failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
    ran = json.loads(proc.stdout.strip().splitlines()[-1])["code"]
    expected = code if code is not None else (ROOT if side == "ours" else None)
    if expected is not None and Path(ran) != expected:
        raise RuntimeError(f"{tag}: imported hicache from {ran}, not {expected}")
    return summary(dumps[0]) / (conversations * TURNS)


def worker(args: argparse.Namespace) -> None:
    """The counted run (under valgrind): the workload, collecting inside ``args.phase`` only."""
    sys.path.insert(0, args.helper)
    import callgrind_toggle as cg  # noqa: E402  (built by helper_for)
    run = _sglang_turns if args.worker == "sglang" else _ours_turns
    turn, done = run(args.page, args.worker_policy, args.conversations)
    cg.start()
    for phases in turn:  # each turn yields before each of its phases, then once at its end
        name = next(phases)
        while name is not None:
            on = name == args.phase
            if on:
                cg.toggle()
            name = next(phases)
            if on:
                cg.toggle()
    cg.dump("done")
    print(json.dumps({"code": done()}), flush=True)
    os._exit(0)  # SGLang's controller threads would hold the exit up


def _ours_turns(page: int, policy: str, conversations: int):
    """(turns, code path): each turn a generator yielding the name of its next phase
    before running it, and None at its end."""
    import gc

    import torch

    from bench import tree as T  # CODE_ENV set: the other checkout's hicache (bench/tree.py reads it)
    import hicache

    convs = T.conversations()[:conversations]
    gate = None
    if not os.environ.get(CODE_ENV):  # this checkout: the cost policy's gate (--before has none)
        from hicache.cost import LiveBacklog, LoadGate, load_profile, make_cost
        h100 = load_profile("h100")
        gate = LoadGate(make_cost(h100, "llama-3.1-8b"), page)
    tree = T.build_tree(page, True, eviction_policy=policy, load_gate=gate)
    if gate is not None:  # a server's backlog: the tree's controller's queued loads
        gate.backlog = LiveBacklog(tree.ctrl, None, h100.h2d, None)
    dev, ctrl = tree.device_pool, tree.ctrl
    gc.disable()  # a collection lands in whichever phase it falls: not counted in any

    def one(seq, n):
        yield "match"
        m = tree.match_prefix(seq)
        if gate is not None:
            yield "decide"
            tree.load_target(seq, m)
            gate.end(n, 0, m.last_host_node.end)  # the decision of a request whose prefix is on the host
        yield "alloc"
        slots = torch.cat((m.device_slots, dev.alloc(n - m.device_hit_length)))
        yield "insert"
        tree.insert(seq, slots)
        yield "step"
        ctrl.start_writing()
        tree.poll()
        yield None

    turns = (one(convs[c, :t * T.TURN_TOKENS], t * T.TURN_TOKENS)
             for t in range(1, T.TURNS + 1) for c in range(len(convs)))
    return turns, lambda: str(Path(hicache.__file__).resolve().parents[1])


def _sglang_turns(page: int, policy: str, conversations: int):
    """SGLang 0.5.23's side (the anchor's hicache workload), as `_ours_turns`."""
    import gc
    from array import array

    import torch

    import bench.sglang_cpu_anchor as A  # first: it stubs what SGLang imports and a CPU lacks
    from sglang.srt.runtime_context import get_context

    A._install_hicache_cpu_stubs()
    server_args = get_context().override_server_args(**A.HICACHE_SERVER_ARGS).install()
    convs = A.make_conversations(0)[:conversations]
    cache, alloc = A.make_hicache_tree(page, server_args)
    gc.disable()

    def one(toks, n):
        key_m, key_i = A.RadixKey(toks), A.RadixKey(toks)
        yield "match"
        res = cache.match_prefix(A.MatchPrefixParams(key=key_m))
        yield "path"
        prefix = cache.path_device_indices(res.last_device_node)[:res.device_prefix_len]
        yield "alloc"
        value = torch.cat((prefix, alloc.alloc(n - res.device_prefix_len)))
        yield "insert"
        cache.insert(A.InsertParams(key=key_i, value=value, prev_prefix_len=res.device_prefix_len))
        yield "step"
        cache.check_hicache_events()
        yield None

    turns = (one(array("q", convs[c][:(t + 1) * A.TURN_TOK]), (t + 1) * A.TURN_TOK)
             for t in range(A.N_TURN) for c in range(len(convs)))
    return turns, lambda: "sglang"


def rows_of(counts: dict) -> list[dict]:
    """Per (side, page, policy): its phases' counts, the anchor's "same work" sum, and ours
    over the other sides (fewer instructions: a ratio above 1 is ours ahead)."""
    rows = {}
    for (side, page, policy, phase), n in counts.items():
        rows.setdefault((side, page, policy), {"side": side, "page_size": page, "eviction_policy": policy})[phase] = n
    out = list(rows.values())
    for row in out:
        row["match_insert"] = row["match"] + row["insert"]
        row["same_work"] = row["match_insert"] + row.get("path", 0)
        if "decide" in row:
            row["decide_share"] = row["decide"] / (row["match_insert"] + row["step"])
    for row in out:
        if row["side"] != "ours":
            continue
        for other in out:
            if other["page_size"] == row["page_size"] and other["side"] != "ours":
                name = other["side"]
                row[f"{name}_over_ours_match_insert"] = other["match_insert"] / row["match_insert"]
                row[f"{name}_over_ours_same_work"] = other["same_work"] / row["same_work"]
                row[f"{name}_over_ours_step"] = other["step"] / row["step"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, nargs="+", default=[64, 1], choices=(64, 1))
    p.add_argument("--hicache-eviction-policy", dest="policy", default="lru",
                   help="a policy, a comma-separated list or 'all' (ours; --before runs LRU)")
    p.add_argument("--conversations", type=int, default=50, help="of the workload's 200 (default 50)")
    p.add_argument("--anchor-python", default=os.environ.get("SGLANG_PYTHON"),
                   help="interpreter with SGLang 0.5.23 (default $SGLANG_PYTHON): count its side too")
    p.add_argument("--before", type=Path, default=None, help="another checkout: count its tree (LRU) too")
    p.add_argument("--jobs", type=int, default=2, help="counted runs at once (default 2)")
    p.add_argument("--out", default=str(harness.RESULTS_DIR / "tree_instructions_cpu.json"))
    for hidden in ("--worker", "--phase", "--worker-policy", "--helper"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--page", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    policies = harness.eviction_policies(p, args.policy, {"--conversations": args.conversations,
                                                           "--jobs": args.jobs})
    if args.before is not None and not (args.before / "hicache").is_dir():
        p.error(f"--before: {args.before} is not a checkout (no hicache/ in it)")
    runs = [("ours", sys.executable, None, page, policy) for page in args.pages for policy in policies]
    if args.before is not None:
        runs += [("before", sys.executable, args.before.resolve(), page, "lru") for page in args.pages]
    if args.anchor_python:
        runs += [("sglang", args.anchor_python, None, page, "lru") for page in args.pages]
    harness.RESULTS_DIR.mkdir(parents=True, exist_ok=True)  # the dumps' scratch (removed), beside the results
    with tempfile.TemporaryDirectory(prefix="callgrind-", dir=harness.RESULTS_DIR) as tmp:
        work = Path(tmp)
        try:
            helpers = {py: helper_for(py, work / "helper") for py in {r[1] for r in runs}}
        except (Unavailable, subprocess.CalledProcessError) as exc:
            print(f"tree_instructions: {exc}", file=sys.stderr)
            return 2
        jobs = [(side, py, code, page, policy, phase) for side, py, code, page, policy in runs
                for phase in PHASES[side]]
        with ThreadPoolExecutor(args.jobs) as pool:
            got = pool.map(lambda j: count(j[0], j[1], helpers[j[1]], j[5], j[3], j[4], args.conversations,
                                           j[2], work), jobs)
            counts = {(j[0], j[3], j[4], j[5]): n for j, n in zip(jobs, got)}
    rows = rows_of(counts)
    config = {"workload": f"bench/tree.py's, first {args.conversations} conversations x {TURNS} turns",
              "counting": "instructions collected inside the phase / turns (valgrind callgrind)",
              "before": str(args.before) if args.before else None, "sglang_python": args.anchor_python}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"config": config, "rows": rows}, indent=1))
    for row in rows:
        phases = " ".join(f"{k} {row[k] / 1e3:.1f}k" for k in ("match", "path", "insert", "step", "decide") if k in row)
        ratios = " ".join(f"{k} {v:.2f}" for k, v in row.items() if "_over_ours_" in k)
        print(f"{row['side']:7s} page {row['page_size']:2d} {row['eviction_policy']:8s} {phases}  {ratios}")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
