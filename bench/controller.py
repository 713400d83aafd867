"""Host cost of the controller: write+start_writing and load+start_loading (enqueue time).

DeepSeek-V4 Pro (61 layers, 7 pools), 1 / 16 / 256 pages per batch, as 1 or 16 merged
operations, each queued through the server's checked edge (``edge``) and through the
radix tree's ``trusted=True`` entry (``trusted``); queueing and launching are also timed
apart. Then the radix tree's step: one 512-token backup (8 pages of 64) on a 1-layer
tiny MHA stack, ``write`` + ``start_writing`` + ``poll`` (the acks) per step.
``--backend`` picks what runs behind the controller:

    null     validates every plan, moves no bytes: the controller's own bookkeeping
    triton   the real backend's launch preparation (descriptors, indices staged in one
             copy, one launch per layer). On CUDA the kernels really launch and the time is
             the host time to enqueue them; on CPU the kernel call itself is stubbed out
             (the interpreter would run the copies), so the time is preparation only.

    python bench/controller.py [--backend triton] [--reps 50] [--layers 61]
    python bench/controller.py --sglang-python /path/to/sglang-venv/bin/python [--rounds 3]

Beside SGLang 0.5.23 (``--sglang-python``, default ``$SGLANG_PYTHON``; none: hicache only):
load + start_loading of 1 page as 1 op, 16 pages as 16 ops and 16 pages as 1 op, in rounds
that alternate sides (ours, then ``bench/sglang_controller.py`` in SGLang's interpreter),
medians of the rounds' p50s and the ratios ours / SGLang. Ours runs on two stacks: the
DeepSeek-V4 Pro one above (7 pools, 256-token pages: more work per load than SGLang's) and
SGLang's geometry (61-layer MHA, 1 head, head_dim 1, bf16, page 64, 65,536 device slots,
host ratio 2, write-through), each through ``edge`` (the server's checked call) and
``trusted`` (the radix tree's). Counted on our side: slot checks (edge only), device slot
allocation, the op queued; at ``start_loading`` the batch planned, indices staged and one
(stubbed on CPU) launch per layer, or with ``--backend null`` the plans validated and
nothing launched. SGLang's side (its script's docstring has the detail): device slot
allocation and the op queued, no argument checked; at ``start_loading`` the ops merged and
61 per-layer calls into its host pool whose copy kernel is a no-op stub. Neither side moves
bytes or launches a real kernel; acks are taken untimed. Both sides: same CPU, one torch
thread, the anchor's fixed malloc thresholds (this script re-executes itself with
them, as the anchor does).

Targets on the 2-core CPU VM (null backend): 16-op load enqueued <= 0.5 ms, 1-op load
< 0.3 ms; tree step: write <= 15 us, start_writing + poll <= 25 us.
"""
from __future__ import annotations

import os
import sys

_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296"}
if __name__ == "__main__" and any(os.environ.get(k) != v for k, v in _MALLOC_ENV.items()):
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_MALLOC_ENV})

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hicache import HiCacheConfig, build  # noqa: E402
from hicache.models import mha, preset  # noqa: E402
from bench import harness  # noqa: E402
from host_pools.memory import HostBudget  # noqa: E402
from transfer_kernels import TritonBackend  # noqa: E402
from transfer_kernels.fault import NullBackend  # noqa: E402
from transfer_kernels.backends.triton import kernel_module  # noqa: E402

CASES = [(1, 1), (16, 1), (16, 16), (256, 1), (256, 16)]  # (pages per batch, merged ops)
SGLANG_CASES = ((1, 1), (16, 16), (16, 1))  # the cases bench/sglang_controller.py times
RESULTS = str(harness.RESULTS_DIR)
SGLANG_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_controller.py")


def _ops(cache, pages: int, num_ops: int) -> list[tuple[torch.Tensor, dict | None]]:
    """Device slots of ``num_ops`` ops of ``pages // num_ops`` anchor pages each, plus one
    ``swa`` state (128 tokens) per op when the stack has that pool."""
    per, pools = pages // num_ops, cache.device_pools
    anchor = cache.stack.anchor.name
    out = []
    for _ in range(num_ops):
        slots = pools[anchor].alloc(per * cache.stack.page_size)
        out.append((slots, {"swa": pools["swa"].alloc(128)} if "swa" in pools else None))
    return out


def _release(cache, pools, ops) -> None:
    """Free each op's slots (anchor, extra) back to ``pools`` (device or host pools)."""
    for slots, extra in ops:
        pools[cache.stack.anchor.name].free(slots)
        for name, s in (extra or {}).items():
            pools[name].free(s)


def _time_write(cache, pages: int, num_ops: int, trusted: bool) -> tuple[tuple[float, float], list[dict]]:
    """(queue, launch) microseconds of ``num_ops`` writes; the host slots they got."""
    ctrl, ops = cache.controller, _ops(cache, pages, num_ops)
    t0 = time.perf_counter_ns()
    hosts = [ctrl.write(slots, extra, trusted=trusted) for slots, extra in ops]
    t1 = time.perf_counter_ns()
    ctrl.start_writing()
    t2 = time.perf_counter_ns()
    _sync(cache)
    assert all(a.success for a in ctrl.poll())
    _release(cache, cache.device_pools, ops)
    return ((t1 - t0) / 1e3, (t2 - t1) / 1e3), hosts


def _split(cache, slots: dict) -> tuple[torch.Tensor, dict | None]:
    """A controller result keyed by pool as (anchor slots, extra or None)."""
    anchor = cache.stack.anchor.name
    return slots[anchor], {n: s for n, s in slots.items() if n != anchor} or None


def _time_load(cache, hosts: list[dict], trusted: bool) -> tuple[float, float]:
    """(queue, launch) microseconds of loading ``hosts`` back; frees everything after."""
    ctrl, srcs = cache.controller, [_split(cache, h) for h in hosts]
    t0 = time.perf_counter_ns()
    devs = [ctrl.load(slots, extra, trusted=trusted) for slots, extra in srcs]
    t1 = time.perf_counter_ns()
    ctrl.start_loading()
    t2 = time.perf_counter_ns()
    _sync(cache)
    assert all(a.success for a in ctrl.poll())
    _release(cache, cache.device_pools, [_split(cache, d) for d in devs])
    _release(cache, cache.host_group.pools, srcs)
    return (t1 - t0) / 1e3, (t2 - t1) / 1e3


def _case(cache, pages: int, num_ops: int, trusted: bool, reps: int, num_layers: int) -> dict:
    w, l = [], []
    for _ in range(reps + 3):  # first 3 are warm-up
        dt, hosts = _time_write(cache, pages, num_ops, trusted)
        w.append(dt)
        l.append(_time_load(cache, hosts, trusted))
    w, l = np.asarray(w[3:]), np.asarray(l[3:])
    load = l.sum(axis=1)
    return {"pages": pages, "ops": num_ops, "mode": "trusted" if trusted else "edge",
            "write": _pct(w.sum(axis=1)), "write_queue": _pct(w[:, 0]), "start_writing": _pct(w[:, 1]),
            "load": _pct(load), "load_queue": _pct(l[:, 0]), "start_loading": _pct(l[:, 1]),
            "load_us_per_layer_launch": round(float(np.median(load)) / num_layers, 2)}


def _sglang_geometry(num_layers: int, backend, device: str):
    """SGLang's side's cache on our side: MHA, 1 head, head_dim 1, bf16, page 64, 65,536
    device slots, host ratio 2, write-through."""
    stack = mha(num_layers, 1, 1, dtype=torch.bfloat16, page_size=64, model=f"mha-{num_layers}")
    config = HiCacheConfig(hicache_ratio=2.0, write_policy="write_through")
    budget = HostBudget(1 << 40, None, 0, 1, 1 << 40)
    return build(stack, 1 << 16, config, device=device, budget=budget, backend=backend)


def _our_loads(caches: dict, reps: int) -> dict:
    """One round of ours: load p50 (us) per (stack, mode, pages, ops)."""
    out = {}
    for label, cache in caches.items():
        for pages, num_ops in SGLANG_CASES:
            for trusted in (False, True):
                row = _case(cache, pages, num_ops, trusted, reps, cache.stack.num_model_layers)
                out[(label, row["mode"], pages, num_ops)] = row["load"]["p50_us"]
    return out


def _sglang_loads(python: str, num_layers: int, reps: int) -> tuple[dict, dict]:
    """One round of SGLang's side in its interpreter: ({(pages, ops): load p50 us}, setup)."""
    cmd = [python, SGLANG_SCRIPT, "--layers", str(num_layers), "--reps", str(reps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"{SGLANG_SCRIPT} failed (exit {proc.returncode}): "
                           f"{proc.stderr[-2000:]}{proc.stdout[-500:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = data.pop("rows")
    return {(r["pages"], r["ops"]): r["load"]["p50_us"] for r in rows}, data


def _versus_sglang(python: str, caches: dict, num_layers: int, rounds: int, reps: int) -> dict:
    """Alternating rounds (ours, SGLang, ours, ...); medians of the rounds' p50s, ratios."""
    ours, theirs, setup = [], [], None
    for r in range(rounds):
        ours.append(_our_loads(caches, reps))
        got, setup = _sglang_loads(python, num_layers, reps)
        theirs.append(got)
        print(f"  round {r + 1}/{rounds} done", flush=True)
    rows = []
    for pages, num_ops in SGLANG_CASES:
        sglang = statistics.median(t[(pages, num_ops)] for t in theirs)
        row = {"pages": pages, "ops": num_ops, "sglang_load_p50_us": sglang,
               "sglang_rounds": [t[(pages, num_ops)] for t in theirs], "ours": {}}
        for label in caches:
            for mode in ("edge", "trusted"):
                runs = [o[(label, mode, pages, num_ops)] for o in ours]
                row["ours"][f"{label} {mode}"] = {
                    "load_p50_us": statistics.median(runs), "rounds": runs,
                    "ratio_ours_over_sglang": round(statistics.median(runs) / sglang, 3)}
        rows.append(row)
    return {"sglang": setup.pop("sglang"), "rounds": rounds, "alternating": True,
            "sglang_setup": setup, "rows": rows}


def _print_versus(cmp: dict, backend: str) -> None:
    labels = list(cmp["rows"][0]["ours"])
    ours = ("triton launch preparation, kernel call stubbed" if backend == "triton"
            else "NullBackend: plans validated, no per-layer launch")
    print(f"load + start_loading p50 us beside SGLang {cmp['sglang']} ({cmp['sglang_setup']['layers']} "
          f"layers; SGLang: per-layer loop, copy kernel stubbed; ours: {ours}), medians of "
          f"{cmp['rounds']} alternating rounds; (ours / SGLang):")
    print(f"{'pages':>6}{'ops':>5}{'SGLang':>9}" + "".join(f"{lab:>26}" for lab in labels))
    for row in cmp["rows"]:
        cells = "".join(f"{o['load_p50_us']:>17.0f} ({o['ratio_ours_over_sglang']:.2f})"
                        for o in row["ours"].values())
        print(f"{row['pages']:>6}{row['ops']:>5}{row['sglang_load_p50_us']:>9.0f}{cells}")


def _tree_step(backend, device: str, reps: int, trusted: bool) -> dict:
    """The radix tree's per-step controller calls: write 512 tokens, start_writing, poll."""
    stack = mha(1, 1, 4, dtype=torch.uint8, page_size=64, model="tiny-mha")
    config = HiCacheConfig(hicache_ratio=2.0, write_policy="write_through", io_backend="torch")
    budget = HostBudget(1 << 40, None, 0, 1, 1 << 40)
    cache = build(stack, 1 << 16, config, device=device, budget=budget, backend=backend)
    ctrl, host = cache.controller, cache.host_group.pools[stack.anchor.name]
    slots = cache.device_pools[stack.anchor.name].alloc(512)
    samples = []
    for _ in range(reps + 50):
        t0 = time.perf_counter_ns()
        dst = ctrl.write(slots, None, trusted=trusted)
        t1 = time.perf_counter_ns()
        ctrl.start_writing()
        t2 = time.perf_counter_ns()
        acks = ctrl.poll()
        t3 = time.perf_counter_ns()
        _sync(cache)
        acks += ctrl.poll()  # on CUDA the ack may come a poll later (CPU: always the first)
        assert [a.success for a in acks] == [True]
        host.free(dst[stack.anchor.name])
        samples.append(((t1 - t0) / 1e3, (t2 - t1) / 1e3, (t3 - t2) / 1e3))
    t = np.asarray(samples[50:])
    return {"mode": "trusted" if trusted else "edge", "tokens": 512, "page_size": 64,
            "write": _pct(t[:, 0]), "start_writing": _pct(t[:, 1]), "poll": _pct(t[:, 2]),
            "start_writing_plus_poll": _pct(t[:, 1] + t[:, 2])}


def _sync(cache) -> None:
    if cache.controller.device.type == "cuda":
        torch.cuda.synchronize()


def _backend(name: str, device: str):
    if name == "null":
        return NullBackend()
    if device == "cpu":  # preparation only: the interpreter would really copy
        kernel_module().launch_copy_rows = lambda *args, **kw: None
    return TritonBackend()


def _pct(xs: list[float]) -> dict:
    return {f"p{q}_us": round(float(np.percentile(xs, q)), 1) for q in (20, 50, 80)}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=None, help="cut DeepSeek-V4 Pro to N layers")
    ap.add_argument("--backend", choices=("null", "triton"), default="triton")
    ap.add_argument("--device", choices=("cpu", "cuda"),
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sglang-python", default=None,
                    help="interpreter with SGLang 0.5.23 (default $SGLANG_PYTHON on the CPU; "
                         "none: hicache only)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds beside SGLang (>= 1)")
    ap.add_argument("--out", default=None,
                    help="JSON path (default: bench/results/local/controller_<device>[_<backend>].json)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    if args.sglang_python and args.device != "cpu":
        ap.error("--sglang-python: SGLang's side runs on the CPU only; use --device cpu")
    if args.sglang_python is None and args.device == "cpu":
        args.sglang_python = os.environ.get("SGLANG_PYTHON") or None
    if args.sglang_python and not os.access(args.sglang_python, os.X_OK):
        ap.error(f"--sglang-python: {args.sglang_python!r} is not an executable file")
    if args.rounds < 1:
        ap.error(f"--rounds: must be >= 1, got {args.rounds}")
    return args


def _controller_rows(cache, args: argparse.Namespace, layers: int) -> list[dict]:
    """Every (pages, ops) case, checked edge and trusted, printed as they come."""
    rows = []
    print(f"{'pages':>6}{'ops':>5}{'mode':>9}{'write p50 us':>14}{'load p50 us':>13}"
          f"{'(queue + start)':>18}{'us/layer':>10}")
    for pages, num_ops in CASES:
        for trusted in (False, True):
            row = _case(cache, pages, num_ops, trusted, args.reps, layers)
            rows.append(row)
            split = f"{row['load_queue']['p50_us']:.0f} + {row['start_loading']['p50_us']:.0f}"
            print(f"{pages:>6}{num_ops:>5}{row['mode']:>9}{row['write']['p50_us']:>14.0f}"
                  f"{row['load']['p50_us']:>13.0f}{split:>18}{row['load_us_per_layer_launch']:>10.1f}")
    return rows


def _tree_steps(args: argparse.Namespace) -> list[dict]:
    """The radix tree's per-step write + start_writing + poll, checked edge and trusted."""
    tree = [_tree_step(_backend(args.backend, args.device), args.device, 20 * args.reps, trusted)
            for trusted in (False, True)]
    print("tree step (1-layer tiny MHA, 512 tokens, page 64), p50 us:")
    for t in tree:
        print(f"  {t['mode']:>8}: write {t['write']['p50_us']:.1f}  start_writing "
              f"{t['start_writing']['p50_us']:.1f}  poll {t['poll']['p50_us']:.1f}  "
              f"start_writing+poll {t['start_writing_plus_poll']['p50_us']:.1f}")
    return tree


def run(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    torch.set_num_threads(1)
    stack = preset("deepseek-v4-pro", args.layers)
    budget = HostBudget(1 << 40, None, 0, 1, 1 << 40)
    cache = build(stack, 260 * 256, HiCacheConfig(hicache_ratio=1.0, swa_full_tokens_ratio=0.1),
                  device=args.device, budget=budget, backend=_backend(args.backend, args.device))
    dev = torch.device(args.device)
    print(f"controller bench on {harness.device_name(dev)}, backend {args.backend}"
          f"{' (kernel call stubbed on CPU)' if args.backend == 'triton' and args.device == 'cpu' else ''}")
    rows = _controller_rows(cache, args, stack.num_model_layers)
    out = {"bench": "controller", "device": f"{harness.device_name(dev)} ({os.cpu_count()} cores)",
           "backend": args.backend, "kernel_call_stubbed": args.backend == "triton" and args.device == "cpu",
           "model": stack.model, "layers": stack.num_model_layers,
           "pools": len(stack.pools), "versions": {"python": platform.python_version(),
                                                   "torch": torch.__version__},
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch_threads": 1,
           "malloc_env": {k: os.environ.get(k) for k in _MALLOC_ENV}, "rows": rows,
           "tree_step": _tree_steps(args)}
    if args.sglang_python:
        mha_cache = _sglang_geometry(stack.num_model_layers, _backend(args.backend, args.device),
                                     args.device)
        caches = {stack.model: cache, mha_cache.stack.model: mha_cache}
        out["versus_sglang"] = _versus_sglang(args.sglang_python, caches, stack.num_model_layers,
                                              args.rounds, args.reps)
        _print_versus(out["versus_sglang"], args.backend)
    suffix = "" if args.backend == "triton" else f"_{args.backend}"
    path = args.out or os.path.join(RESULTS, f"controller_{harness.device_slug(dev)}{suffix}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
