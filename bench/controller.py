"""Host cost of the controller: write+start_writing and load+start_loading (enqueue time).

DeepSeek-V4 Pro (61 layers, 7 pools), 1 / 16 / 256 pages per batch, as 1 or 16 merged
operations. ``--backend`` picks what runs behind the controller:

    null     validates every plan, moves no bytes: the controller's own bookkeeping
    triton   the real backend's launch preparation (descriptors, indices staged in one
             copy, one launch per layer). On CUDA the kernels really launch and the time is
             the host time to enqueue them; on CPU the kernel call itself is stubbed out
             (the interpreter would run the copies), so the time is preparation only.

    python bench/controller.py [--backend triton] [--reps 50] [--layers 61]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hicache import HiCacheConfig, build  # noqa: E402
from hicache.models import preset  # noqa: E402
from bench import harness  # noqa: E402
from host_pools.memory import HostBudget  # noqa: E402
from transfer_kernels import TritonBackend  # noqa: E402
from transfer_kernels.fault import NullBackend  # noqa: E402
from transfer_kernels.triton_backend import kernel_module  # noqa: E402

CASES = [(1, 1), (16, 1), (16, 16), (256, 1), (256, 16)]  # (pages per batch, merged ops)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _ops(cache, pages: int, num_ops: int) -> list[tuple[torch.Tensor, dict]]:
    per = pages // num_ops
    out = []
    for _ in range(num_ops):
        kv = cache.device_pools["kv"].alloc(per * 256)
        out.append((kv, {"swa": cache.device_pools["swa"].alloc(128)}))
    return out


def _release(cache, ops) -> None:
    for kv, extra in ops:
        cache.device_pools["kv"].free(kv)
        cache.device_pools["swa"].free(extra["swa"])


def _time_write(cache, pages: int, num_ops: int) -> tuple[float, list[dict]]:
    ctrl, ops = cache.controller, _ops(cache, pages, num_ops)
    t0 = time.perf_counter_ns()
    hosts = [ctrl.write(kv, extra) for kv, extra in ops]
    ctrl.start_writing()
    dt = time.perf_counter_ns() - t0
    _sync(cache)
    assert all(a.success for a in ctrl.poll())
    _release(cache, ops)
    return dt / 1e3, hosts


def _time_load(cache, hosts: list[dict]) -> float:
    ctrl = cache.controller
    t0 = time.perf_counter_ns()
    devs = [ctrl.load(h["kv"], {"swa": h["swa"]}) for h in hosts]
    ctrl.start_loading()
    dt = time.perf_counter_ns() - t0
    _sync(cache)
    assert all(a.success for a in ctrl.poll())
    _release(cache, [(d["kv"], {"swa": d["swa"]}) for d in devs])
    for h in hosts:
        cache.host_group.pools["kv"].free(h["kv"])
        cache.host_group.pools["swa"].free(h["swa"])
    return dt / 1e3


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


def run(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=None, help="cut DeepSeek-V4 Pro to N layers")
    ap.add_argument("--backend", choices=("null", "triton"), default="triton")
    ap.add_argument("--device", choices=("cpu", "cuda"),
                    default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    stack = preset("deepseek-v4-pro", args.layers)
    budget = HostBudget(1 << 40, None, 0, 1, 1 << 40)
    cache = build(stack, 260 * 256, HiCacheConfig(hicache_ratio=1.0, swa_full_tokens_ratio=0.1),
                  device=args.device, budget=budget, backend=_backend(args.backend, args.device))
    dev = torch.device(args.device)
    print(f"controller bench on {harness.device_name(dev)}, backend {args.backend}"
          f"{' (kernel call stubbed on CPU)' if args.backend == 'triton' and args.device == 'cpu' else ''}")
    rows = []
    print(f"{'pages':>6}{'ops':>5}{'write p50 us':>14}{'load p50 us':>13}{'us/layer launch':>17}")
    for pages, num_ops in CASES:
        w, l = [], []
        for _ in range(args.reps + 3):  # first 3 are warm-up
            dt, hosts = _time_write(cache, pages, num_ops)
            w.append(dt)
            l.append(_time_load(cache, hosts))
        w, l = w[3:], l[3:]
        per_layer = float(np.median(l)) / stack.num_model_layers
        rows.append({"pages": pages, "ops": num_ops, "write": _pct(w), "load": _pct(l),
                     "load_us_per_layer_launch": round(per_layer, 2)})
        print(f"{pages:>6}{num_ops:>5}{np.median(w):>14.0f}{np.median(l):>13.0f}{per_layer:>17.1f}")
    out = {"bench": "controller", "device": f"{harness.device_name(dev)} ({os.cpu_count()} cores)",
           "backend": args.backend, "kernel_call_stubbed": args.backend == "triton" and args.device == "cpu",
           "model": stack.model, "layers": stack.num_model_layers,
           "pools": len(stack.pools), "versions": {"python": platform.python_version(),
                                                   "torch": torch.__version__},
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": rows}
    os.makedirs(RESULTS, exist_ok=True)
    suffix = "" if args.backend == "triton" else f"_{args.backend}"
    path = os.path.join(RESULTS, f"controller_{harness.device_slug(dev)}{suffix}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
