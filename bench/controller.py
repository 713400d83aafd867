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

Targets on the 2-core CPU VM (null backend): 16-op load enqueued <= 0.5 ms, 1-op load
< 0.3 ms; tree step: write <= 15 us, start_writing + poll <= 25 us.
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
from hicache.models import mha, preset  # noqa: E402
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


def _time_write(cache, pages: int, num_ops: int, trusted: bool) -> tuple[tuple[float, float], list[dict]]:
    """(queue, launch) microseconds of ``num_ops`` writes; the host slots they got."""
    ctrl, ops = cache.controller, _ops(cache, pages, num_ops)
    t0 = time.perf_counter_ns()
    hosts = [ctrl.write(kv, extra, trusted=trusted) for kv, extra in ops]
    t1 = time.perf_counter_ns()
    ctrl.start_writing()
    t2 = time.perf_counter_ns()
    _sync(cache)
    assert all(a.success for a in ctrl.poll())
    _release(cache, ops)
    return ((t1 - t0) / 1e3, (t2 - t1) / 1e3), hosts


def _time_load(cache, hosts: list[dict], trusted: bool) -> tuple[float, float]:
    """(queue, launch) microseconds of loading ``hosts`` back; frees everything after."""
    ctrl = cache.controller
    t0 = time.perf_counter_ns()
    devs = [ctrl.load(h["kv"], {"swa": h["swa"]}, trusted=trusted) for h in hosts]
    t1 = time.perf_counter_ns()
    ctrl.start_loading()
    t2 = time.perf_counter_ns()
    _sync(cache)
    assert all(a.success for a in ctrl.poll())
    _release(cache, [(d["kv"], {"swa": d["swa"]}) for d in devs])
    for h in hosts:
        cache.host_group.pools["kv"].free(h["kv"])
        cache.host_group.pools["swa"].free(h["swa"])
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
    print(f"{'pages':>6}{'ops':>5}{'mode':>9}{'write p50 us':>14}{'load p50 us':>13}"
          f"{'(queue + start)':>18}{'us/layer':>10}")
    for pages, num_ops in CASES:
        for trusted in (False, True):
            row = _case(cache, pages, num_ops, trusted, args.reps, stack.num_model_layers)
            rows.append(row)
            split = f"{row['load_queue']['p50_us']:.0f} + {row['start_loading']['p50_us']:.0f}"
            print(f"{pages:>6}{num_ops:>5}{row['mode']:>9}{row['write']['p50_us']:>14.0f}"
                  f"{row['load']['p50_us']:>13.0f}{split:>18}{row['load_us_per_layer_launch']:>10.1f}")
    tree = [_tree_step(_backend(args.backend, args.device), args.device, 20 * args.reps, trusted)
            for trusted in (False, True)]
    print("tree step (1-layer tiny MHA, 512 tokens, page 64), p50 us:")
    for t in tree:
        print(f"  {t['mode']:>8}: write {t['write']['p50_us']:.1f}  start_writing "
              f"{t['start_writing']['p50_us']:.1f}  poll {t['poll']['p50_us']:.1f}  "
              f"start_writing+poll {t['start_writing_plus_poll']['p50_us']:.1f}")
    out = {"bench": "controller", "device": f"{harness.device_name(dev)} ({os.cpu_count()} cores)",
           "backend": args.backend, "kernel_call_stubbed": args.backend == "triton" and args.device == "cpu",
           "model": stack.model, "layers": stack.num_model_layers,
           "pools": len(stack.pools), "versions": {"python": platform.python_version(),
                                                   "torch": torch.__version__},
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": rows, "tree_step": tree}
    os.makedirs(RESULTS, exist_ok=True)
    suffix = "" if args.backend == "triton" else f"_{args.backend}"
    path = os.path.join(RESULTS, f"controller_{harness.device_slug(dev)}{suffix}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
