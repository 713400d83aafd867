"""The reference side of `bench/tree.py`: SGLang's trees on the same workload, one round.

Runs parts c (``UnifiedRadixCache`` with its default Rust core, no host tier) and d
(``UnifiedRadixCache.init_hicache``: SGLang's HiCache, copy kernels stubbed to no-ops) of
the anchor script (``bench/sglang_cpu_anchor.py``, which documents how
to install SGLang 0.5.23 without its GPU dependencies), once each, and prints their rows
as one JSON object on the last line of stdout. Run it with the interpreter that has SGLang:

    $SGLANG_PY bench/sglang_anchor.py --anchor bench/sglang_cpu_anchor.py --pages 64 1

`bench/tree.py --anchor-python $SGLANG_PY` calls it between its own rounds. Nothing of
SGLang is copied here: the anchor imports the installed package and this script calls
the anchor's functions.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time

# The clock both sides of bench/tree.py time with: wall (perf_counter) or this thread's CPU
# time (not counting the time a busy machine keeps the thread waiting for a core).
CLOCKS = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}


def load_anchor(path: str):
    """Import the anchor script as a module (it installs its stubs and imports SGLang;
    on first import it re-executes this process with its malloc settings)."""
    spec = importlib.util.spec_from_file_location("sglang_cpu_anchor", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchor", required=True, help="path of sglang_cpu_anchor.py")
    ap.add_argument("--pages", type=int, nargs="+", default=[64, 1])
    ap.add_argument("--clock", choices=CLOCKS, default="wall",
                    help="wall: perf_counter (the anchor's own); cpu: this thread's CPU time")
    args = ap.parse_args()
    anchor = load_anchor(args.anchor)
    anchor.ns = CLOCKS[args.clock]  # every timing of the anchor reads its module's ns()
    trees = anchor.run_c(["UnifiedRadixCache[rust]"], args.pages, 1, 0)
    hicache = anchor.run_d(args.pages, 1, 0)
    if not hicache.get("ran"):
        print(json.dumps({"error": hicache.get("error", "part d did not run")}))
        return 1
    out = {"sglang": anchor.sglang.__version__, "no_host_tier": trees, "host_tier": hicache["rows"]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
