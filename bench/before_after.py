"""Before / after in one run: the host cost of a DeepSeek-V4-Pro load in two checkouts.

Question answered: how much host time did a change save per load, measured on the same
machine in the same minutes? Each round runs, in both checkouts (``--before`` and
``--after``, their own code and their own ``bench/``), in alternating order:

    host_only  bench/load_batch.py --host-only: DeepSeek-V4-Pro page_first, 16 pages as 1
               op and as 16 ops, H2D and D2H, auto / dma / triton / null, trusted and edge
               (warm: a size class seen before)
    first      the first load of a new size class: a cache warmed on 8-page loads, then
               loads of 16, 15, 14, 13 and 12 pages (1 op, 16 ops, D2H), each class new
    controller (--sglang-python) bench/controller.py: loads beside SGLang's controller

and the table gives, per case, the median over rounds of each round's median, before and
after, and their ratio. Noisy machines: more rounds; the order alternates per round.

    python bench/before_after.py --before /path/to/old/checkout [--rounds 5] [--out x.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bounded_input import read_json  # noqa: E402

MODEL = "deepseek-v4-pro"
BACKENDS = ("auto", "dma", "triton", "null")
# the first load of a new size class, run inside each checkout (its own bench/ and code)
FIRST = r"""
import json, sys, torch
torch.set_num_threads(1)
from bench.host_only import host_only, make_backends
from bench.load_cases import LoadBench
out = {}
with host_only():
    for name in sys.argv[1].split(","):
        backend = make_backends([name], False)[name]
        bench = LoadBench("deepseek-v4-pro", None, "page_first", 140, 16, 16, torch.device("cpu"), backend)
        for direction, ops in (("h2d", 1), ("h2d", 16), ("d2h", 1)):
            make = bench.load_args if direction == "h2d" else bench.backup_args
            for _ in range(3):  # another size class: everything but this class warm
                bench.run(direction, make(8, 1 if ops == 1 else 8), True, False)
            for pages in (16, 15, 14, 13, 12):  # each a new size class
                got = bench.run(direction, make(pages, 1 if ops == 1 else pages), True, False)
                out.setdefault(f"{name} {direction} {ops}", []).append(got.times["host_us"])
        bench.close()
print(json.dumps(out))
"""


def _env(tree: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")


def host_only(tree: Path, batches: int, tmp: Path) -> dict[str, float]:
    """Per case, the host-only bench's median host microseconds in ``tree``."""
    out = tmp / "host_only.json"
    cmd = [sys.executable, str(tree / "bench/load_batch.py"), "--host-only", "--models", MODEL,
           "--layouts", "page_first", "--pages", "16", "--ops", "1,16", "--directions", "h2d,d2h",
           "--backends", ",".join(BACKENDS), "--batches", str(batches), "--out", str(out)]
    subprocess.run(cmd, cwd=tree, env=_env(tree), check=True, capture_output=True, timeout=3600)
    rows = read_json(out, "a results file", harness.RESULTS_MAX_BYTES)["rows"]
    return {f"{r['backend']} {r['dir']} {r['ops']} {r['mode']}": r["host_us"] for r in rows}


def first_loads(tree: Path) -> dict[str, float]:
    """Per case, the median host microseconds of first loads of new size classes in ``tree``."""
    got = subprocess.run([sys.executable, "-c", FIRST, ",".join(BACKENDS)], cwd=tree, env=_env(tree),
                         check=True, capture_output=True, text=True, timeout=3600)
    runs = json.loads(got.stdout.strip().splitlines()[-1])
    return {f"first {k}": statistics.median(v) for k, v in runs.items()}


def controller(tree: Path, sglang: str, reps: int, tmp: Path) -> dict[str, float]:
    """bench/controller.py beside SGLang in ``tree``: 16-op and 1-op load medians and the
    ratios ours / SGLang (one round)."""
    out = tmp / "controller.json"
    cmd = [sys.executable, str(tree / "bench/controller.py"), "--sglang-python", sglang, "--rounds", "1",
           "--reps", str(reps), "--out", str(out)]
    subprocess.run(cmd, cwd=tree, env=_env(tree), check=True, capture_output=True, timeout=3600)
    found = {}
    for row in read_json(out, "a results file", harness.RESULTS_MAX_BYTES)["versus_sglang"]["rows"]:
        case = f"controller {row['pages']}p x {row['ops']} ops"
        found[f"{case} sglang us"] = row["sglang_load_p50_us"]
        for label, ours in row["ours"].items():
            found[f"{case} {label} us"] = ours["load_p50_us"]
            found[f"{case} {label} / sglang"] = ours["ratio_ours_over_sglang"]
    return found


def measure(trees: dict[str, Path], rounds: int, batches: int, sglang: str | None,
            reps: int) -> dict[str, dict[str, list[float]]]:
    """Per tree, per case, one value per round (trees alternate, the order flips each round)."""
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    harness.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="before_after_", dir=harness.RESULTS_DIR) as tmp:
        for r in range(rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for name in order:
                got = host_only(trees[name], batches, Path(tmp))
                got.update(first_loads(trees[name]))
                if sglang:
                    got.update(controller(trees[name], sglang, reps, Path(tmp)))
                for case, value in got.items():
                    runs[name].setdefault(case, []).append(value)
                print(f"round {r + 1}/{rounds} {name}: {len(got)} cases", flush=True)
    return runs


def table(runs: dict[str, dict[str, list[float]]]) -> list[dict]:
    """Per case: before and after (median of the rounds) and after / before."""
    rows = []
    for case in runs["before"]:
        if case not in runs["after"]:
            continue
        b, a = statistics.median(runs["before"][case]), statistics.median(runs["after"][case])
        rows.append({"case": case, "before": b, "after": a, "ratio": a / b if b else None,
                     "before_runs": runs["before"][case], "after_runs": runs["after"][case]})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/before_after.py", description=__doc__.split("\n")[0])
    p.add_argument("--before", type=Path, required=True, help="the other checkout (its own code and bench/)")
    p.add_argument("--after", type=Path, default=ROOT, help="default: this checkout")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=20, help="batches per case and round (host_only)")
    p.add_argument("--sglang-python", default=os.environ.get("SGLANG_PYTHON"),
                   help="SGLang's interpreter: also bench/controller.py beside it")
    p.add_argument("--reps", type=int, default=30, help="bench/controller.py --reps")
    p.add_argument("--out", type=Path, default=harness.RESULTS_DIR / "before_after.json")
    args = p.parse_args(argv)
    for flag, tree in (("--before", args.before), ("--after", args.after)):
        if not (tree / "bench" / "load_batch.py").is_file():
            p.error(f"{flag}: {tree} is not a hicache checkout (no bench/load_batch.py)")
    if args.rounds < 1 or args.batches < 1:
        p.error("--rounds, --batches: must be >= 1")
    start = time.time()
    runs = measure({"before": args.before, "after": args.after}, args.rounds, args.batches,
                   args.sglang_python, args.reps)
    rows = table(runs)
    for row in rows:
        print(f"{row['case']:<55} {row['before']:10.1f} {row['after']:10.1f}  x{row['ratio']:.2f}")
    config = {k: str(v) for k, v in vars(args).items()}
    config["minutes"] = round((time.time() - start) / 60, 1)
    import torch
    print(f"wrote {harness.write_json(args.out, rows, config, torch.device('cpu'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
