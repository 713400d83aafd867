"""The reference side of `bench/controller.py`: SGLang 0.5.23's HiCache controller, load enqueue time.

Builds what SGLang builds for HiCache (``UnifiedRadixCache.init_hicache`` under SGLang's
default HiCache server arguments: write-through, ``kernel`` IO, ``page_first`` host
layout, host ratio 2) on a real CPU ``MHATokenToKVPool`` of 61 layers, 1 head, head_dim 1,
bf16, page size 64, 65,536 device slots (geometry only changes the buffer sizes, not the
bookkeeping), and drives its controller (``HybridCacheController``) directly: per
repetition, N ``load(host_indices)`` calls then one ``start_loading()``, timed; then,
untimed, the ack is popped and synchronized and the device slots are freed. The host slots
are written once up front (``write`` of 16 pages; its ack popped) and loaded again every
repetition. Cases: 1 page as 1 op, 16 pages as 16 ops, 16 pages as 1 op. p20/p50/p80
microseconds over ``--reps`` repetitions after 3 warm-up ones, one torch thread, printed as
one JSON object on the last stdout line. Run it with the interpreter that has SGLang:

    $SGLANG_PYTHON bench/sglang_controller.py [--anchor bench/sglang_cpu_anchor.py]

`bench/controller.py --sglang-python $SGLANG_PYTHON` calls it between its own rounds.

What is counted on SGLang's side:
    load            device slot allocation (``PagedTokenToKVPoolAllocator.alloc``), the
                    side-pool resolution (none here) and a ``CacheOperation`` appended to
                    the load queue. No argument is checked: the host indices are taken as
                    given (not whether they are written, page-aligned or in range).
    start_loading   the layer-done counter's producer step, ``merge_ops`` (``torch.cat`` of
                    the queued ops' indices), index moves (no-ops on CPU), the transfer
                    engine's submission (stream context, start/ack events on
                    ``torch.cpu``'s stand-ins) and its per-layer loop: for each of the 61
                    layers ``load_to_device_per_layer_physical`` -> the host pool's
                    ``load_to_device_per_layer`` (layout dispatch, packed-row check, then the
                    ``transfer_kv_per_layer_pf_lf`` copy kernel, which the anchor
                    replaces by a no-op lambda) and the layer-done event's ``record``;
                    then the ack appended.
What is not counted: the copies themselves (no bytes move), a CUDA kernel launch per layer
(the stub costs a Python call, a real ``sgl_kernel`` launch several microseconds), CUDA
event records and stream switches (``torch.cpu``'s are trivial), the ack handling
(``loading_check``) and the radix tree around the controller.

Nothing of SGLang is copied here: the anchor installs its import stubs and the
kernel stubs; this script calls SGLang's installed API.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sglang_anchor import load_anchor  # noqa: E402

DEFAULT_ANCHOR = Path(__file__).resolve().parent / "sglang_cpu_anchor.py"  # shipped in bench/
CASES = ((1, 1), (16, 16), (16, 1))  # (pages, ops)
PAGE, SLOTS, WARMUP = 64, 1 << 16, 3


def build_controller(anchor, layers: int):
    """SGLang's HiCache on a CPU MHA pool of ``layers`` layers: (controller, device allocator)."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import get_context

    kv = MHATokenToKVPool(SLOTS, PAGE, torch.bfloat16, head_num=1, head_dim=1, layer_num=layers,
                          device="cpu", enable_memory_saver=False)
    alloc = anchor.PagedTokenToKVPoolAllocator(SLOTS, PAGE, torch.bfloat16, "cpu", kv,
                                               need_sort=False)
    params = anchor.CacheInitParams(disable=False, req_to_token_pool=None,
                                    token_to_kv_pool_allocator=alloc, page_size=PAGE,
                                    tree_components=(ComponentType.FULL,))
    override = get_context().override_server_args(**anchor.HICACHE_SERVER_ARGS)
    server_args = override.install()
    try:
        tree = UnifiedRadixCache(params)
        tree.init_hicache(server_args, params)
    finally:
        override.restore()
    ctrl = tree.cache_controller
    assert ctrl.transfer_layer_id_max == layers and ctrl.write_policy == "write_through"
    return ctrl, alloc, tree


def time_loads(ctrl, alloc, host_pages: list, pages: int, num_ops: int, reps: int) -> dict:
    """p20/p50/p80 microseconds of ``num_ops`` loads of ``pages`` pages, then start_loading."""
    import numpy as np
    import torch

    per = pages // num_ops
    srcs = [torch.cat(host_pages[i * per:(i + 1) * per]) for i in range(num_ops)]
    samples = []
    gc.collect()
    for _ in range(reps + WARMUP):
        t0 = time.perf_counter_ns()
        devs = [ctrl.load(src) for src in srcs]
        t1 = time.perf_counter_ns()
        ctrl.start_loading()
        t2 = time.perf_counter_ns()
        assert all(d is not None for d in devs) and len(ctrl.ack_load_queue) == 1
        ctrl.ack_load_queue.pop(0).finish_event.synchronize()
        alloc.free(torch.cat(devs))
        samples.append(((t1 - t0) / 1e3, (t2 - t1) / 1e3))
    t = np.asarray(samples[WARMUP:])

    def pct(xs):
        return {f"p{q}_us": round(float(np.percentile(xs, q)), 1) for q in (20, 50, 80)}
    return {"pages": pages, "ops": num_ops, "load": pct(t.sum(axis=1)), "load_queue": pct(t[:, 0]),
            "start_loading": pct(t[:, 1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchor", default=str(DEFAULT_ANCHOR), help="path of sglang_cpu_anchor.py")
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    if args.layers < 1 or args.reps < 1:
        ap.error(f"--layers and --reps: must be >= 1, got {args.layers} and {args.reps}")
    anchor = load_anchor(args.anchor)
    import torch
    torch.set_num_threads(1)
    stubs = anchor._install_hicache_cpu_stubs()
    ctrl, alloc, _tree = build_controller(anchor, args.layers)
    pages = max(p for p, _ in CASES)
    dev = alloc.alloc(pages * PAGE)
    host = ctrl.write(dev)  # queues and launches the backup (write-through); ack it
    assert host is not None and len(ctrl.ack_write_queue) == 1
    ctrl.ack_write_queue.pop(0).finish_event.synchronize()
    alloc.free(dev)
    host_pages = list(host.split(PAGE))
    rows = [time_loads(ctrl, alloc, host_pages, p, n, args.reps) for p, n in CASES]
    host_pool = ctrl.mem_pool_host.anchor_entry.host_pool
    print(json.dumps({
        "sglang": anchor.sglang.__version__, "controller": type(ctrl).__name__,
        "layers": args.layers, "page_size": PAGE, "device_slots": SLOTS,
        "host_slots": host_pool.size, "host_layout": host_pool.layout, "io_backend": ctrl.io_backend,
        "geometry": "MHA, 1 head, head_dim 1, bf16", "torch_threads": torch.get_num_threads(),
        "malloc_env": {k: os.environ.get(k) for k in anchor._MALLOC_ENV},
        "reps": args.reps, "warmup": WARMUP, "stubs": stubs, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
