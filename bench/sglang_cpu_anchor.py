#!/usr/bin/env python3
"""SGLang CPU-side anchor benchmark: hierarchical-cache bookkeeping costs.

(The project's reference script for the SGLang comparison, shipped here so that a clone
needs nothing outside the repository; `bench/tree.py --anchor-python` and
`bench/controller.py --sglang-python` load it. Only its paths changed. See
docs/SGLANG.md for installing SGLang beside hicache.)

WHAT IT MEASURES (all on CPU, with CPU torch tensors; the installed sglang
package is imported, no SGLang code is copied here):
  a. Device token allocators (sglang/srt/mem_cache/allocator/{token,paged}.py):
     TokenToKVPoolAllocator (page_size 1) and PagedTokenToKVPoolAllocator
     (page_size 64), need_sort False (SGLang's default, non-disaggregated) and
     True (PD-disaggregation mode).  Cycle = alloc(4096) then free(those 4096),
     pools of 1,000,000 and 10,000,000 slots.  Median/mean microseconds per
     alloc and per free; for need_sort=True also the one-off merge+sort paid
     when the free list runs dry.
  b. Host (L2) pool slot allocator: HostKVCache.alloc/free as built inside
     MHATokenToKVPoolHost (sglang/srt/mem_cache/pool_host/{base,mha}.py),
     constructed on CPU with pin_memory=False and a 1-layer/1-head/head_dim-1
     bf16 geometry (4 bytes/token, so the buffer itself is small).  Same
     4096-slot cycle, 1M and 10M slots, host page_size 64 and 1.
  c. Radix trees, synthetic multi-turn workload: 200 conversations x 8 turns,
     each turn appends 512 random tokens (vocab 32000, seed 0) to that
     conversation's previous tokens; turns are interleaved (turn-major).  Per
     turn: match_prefix(full sequence), path_device_indices(last node) (what
     the scheduler calls to read the prefix KV indices), alloc the new tokens'
     slots (not counted), insert(full sequence, KV indices).  After the
     workload, evict 10% of the evictable tokens.  Trees measured:
       - RadixCache (sglang/srt/mem_cache/radix_cache.py), page 64 and page 1
       - UnifiedRadixCache (the tree SGLang 0.5.23 actually builds by default,
         and the one HiCache attaches to), with its default Rust TreeCore and
         with its pure-Python TreeCore, page 64 and page 1.
     Backing allocator: the matching SGLang allocator, 1M slots, need_sort=False.
  d. Hierarchical cache: sglang 0.5.23 has no HiRadixCache class any more;
     HiCache = UnifiedRadixCache.init_hicache() (HostPoolGroup +
     HybridCacheController + MHATokenToKVPoolHost, SGLang's default HiCache
     settings: write_through, io_backend kernel, page_first layout, host ratio
     2.0), on a real CPU MHATokenToKVPool (1 layer, 1 head, head_dim 1), 1M
     slots.  Same workload as c, plus one cache.check_hicache_events() after
     every insert (the per-scheduler-step poll that submits the queued
     write-through backups and reaps their acks), evict 10% (device -> host
     demotion), then a re-visit pass that loads every host-hit prefix back
     (init_load_back + ready_to_load_host_cache + check_hicache_events).
     Extra CPU stand-ins for this part only: _cuda_host_register -> no-op and
     the sgl_kernel.kvcacheio copy kernels -> no-ops (see
     _install_hicache_cpu_stubs), so NO KV bytes move: bookkeeping only.
  calibration: raw torch.cat of an N-int64 free list, the primitive that
     dominates need_sort=False frees, to separate design from machine.

SGLANG VERSION: 0.5.23 (pip, installed with --no-deps; it pins torch==2.14.1,
we run it on torch 2.13.0+cpu).

HOW TO RUN (CPU-only Linux, Python 3.11):
  python3 -m venv "$VENV"   # any scratch folder
  V=$VENV/bin
  $V/pip install torch==2.13.0 numpy psutil
  $V/pip install --no-deps sglang==0.5.23
  # small packages that sglang's import chain needs (all --no-deps; the
  # versions the recorded runs used):
  $V/pip install --no-deps orjson==3.13.0 pybase64==1.5.1 msgspec==0.22.0 \
      pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 \
      typing-inspection==0.4.5 requests==2.34.2 urllib3==2.8.0 idna==3.20 \
      certifi==2026.10.18 charset-normalizer==3.5.2 packaging==26.3 \
      starlette==1.10.0 anyio==4.16.0 sniffio==1.3.1 tqdm==4.70.1 dill==0.4.1 \
      partial-json-parser==0.2.1.1.post7 regex==2026.11.15 PyYAML==6.0.3 \
      safetensors==0.8.0 tokenizers==0.23.3 transformers==5.19.0 \
      huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 \
      truststore==0.10.5 click==8.5.1 rich==15.0.0 Pygments==2.21.0 \
      openai==2.8.0 httpx==0.28.1 httpcore==1.0.9 distro==1.9.0 jiter==0.19.0
  $V/python bench/sglang_cpu_anchor.py          # full run
  $V/python bench/sglang_cpu_anchor.py --quick  # smoke run
  Writes bench/results/local/sglang_cpu_anchor.json (override with --out).

STUBS (sys.modules-level, installed by _install_stubs below): heavy or
GPU-only packages that sglang imports at module load but that none of the
measured code paths execute: triton, tvm_ffi (GPU kernel toolchains),
torchvision, PIL, sentencepiece, gguf, compressed_tensors (model/quant
loaders), zmq, aiohttp, IPython (server/IPC/notebook).  Each becomes a
permissive dummy module.  torch's own optional-triton probes are run BEFORE the
stubs exist, so torch behaves as the plain CPU build it is.
"""

from __future__ import annotations

import os
import sys

# Fixed glibc malloc thresholds (set before the interpreter starts, hence the
# re-exec).  With glibc's default *dynamic* mmap threshold, every pool-sized
# free-list copy (torch.cat in the allocators' free) may or may not get a fresh
# mmap + page faults depending on allocation history, which made the same
# measurement swing 10x between runs (1M-slot page-1 free: 0.24 ms .. 3.4 ms;
# 10M-slot: 34-39 ms vs ~6 ms).  Fixed thresholds keep freed blocks for reuse,
# like a GPU caching allocator does.  --default-malloc turns this off.
_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "4294967296",
    "MALLOC_TRIM_THRESHOLD_": "4294967296",
}
if "--default-malloc" not in sys.argv and any(
    os.environ.get(k) != v for k, v in _MALLOC_ENV.items()
):
    os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, **_MALLOC_ENV})

import argparse
import gc
import importlib.abc
import importlib.machinery
import json
import platform
import statistics
import time
import types
import warnings
from array import array

# --------------------------------------------------------------------------
# Stubs for heavy / GPU-only modules (documented in the header).
# --------------------------------------------------------------------------
STUBBED_TOPLEVEL = (
    "triton",
    "tvm_ffi",
    "torchvision",
    "PIL",
    "sentencepiece",
    "gguf",
    "compressed_tensors",
    "zmq",
    "aiohttp",
    "IPython",
)


def _install_stubs(names):
    stub_set = set(names)

    class _StubMeta(type):
        def __getattr__(cls, n):
            if n.startswith("__") and n.endswith("__"):
                raise AttributeError(n)
            return _Anything(cls.__name__ + "." + n)

    class_cache = {}

    def _stub_class(full):
        def __init__(self, *a, **k):
            pass

        def __getattr__(self, n):
            if n.startswith("__") and n.endswith("__"):
                raise AttributeError(n)
            return _Anything(full + "()." + n)

        def __call__(self, *a, **k):
            if len(a) == 1 and not k and callable(a[0]):
                return a[0]
            return _Anything(full + "()()")

        return _StubMeta(
            full.rsplit(".", 1)[-1],
            (),
            {"__init__": __init__, "__getattr__": __getattr__, "__call__": __call__},
        )

    def _attr(prefix, n):
        full = prefix + "." + n
        if n[:1].isupper():  # CamelCase names become real (dummy) classes
            if full not in class_cache:
                class_cache[full] = _stub_class(full)
            return class_cache[full]
        return _Anything(full)

    class _Anything:
        """Callable/attribute sink; acts as identity decorator (@triton.jit)."""

        def __init__(self, name):
            object.__setattr__(self, "_n", name)

        def __call__(self, *a, **k):
            if len(a) == 1 and not k and (callable(a[0]) or isinstance(a[0], type)):
                return a[0]
            return _Anything(self._n + "()")

        def __getattr__(self, n):
            if n.startswith("__") and n.endswith("__"):
                raise AttributeError(n)
            return _attr(self._n, n)

        def __getitem__(self, k):
            return _Anything(self._n + "[]")

        def __mro_entries__(self, bases):
            return (object,)

        def __bool__(self):
            return False

        def __iter__(self):
            return iter(())

        def __repr__(self):
            return f"<stub {self._n}>"

    class _StubModule(types.ModuleType):
        def __getattr__(self, n):
            if n.startswith("__") and n.endswith("__"):
                raise AttributeError(n)
            return _attr(self.__name__, n)

    class _Loader(importlib.abc.Loader):
        def create_module(self, spec):
            m = _StubModule(spec.name)
            m.__path__ = []
            m.__version__ = "0.0.0"
            return m

        def exec_module(self, m):
            pass

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in stub_set:
                return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)
            return None

    # Let torch settle its optional-triton detection while triton is truly absent.
    import torch
    import torch._dynamo  # noqa: F401
    import torch.utils._triton
    import torch.utils.flop_counter  # noqa: F401

    torch.utils._triton.has_triton_package()
    torch.utils._triton.has_triton()
    sys.meta_path.insert(0, _Finder())


_install_stubs(STUBBED_TOPLEVEL)
warnings.simplefilter("ignore")

import logging  # noqa: E402

logging.disable(logging.WARNING)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sglang  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

ns = time.perf_counter_ns
KV_DTYPE = torch.bfloat16  # the allocators only record it
CHUNK = 4096


def _us(vals_ns):
    return [v / 1000.0 for v in vals_ns]


def _summ(vals_ns):
    v = _us(vals_ns)
    return {
        "median_us": statistics.median(v),
        "mean_us": statistics.fmean(v),
        "p90_us": float(np.percentile(v, 90)),
        "max_us": max(v),
        "n": len(v),
    }


# --------------------------------------------------------------------------
# a. device token allocators
# --------------------------------------------------------------------------
def make_device_allocator(kind, size, need_sort):
    # kvcache=None: the constructors only store it (no attribute is read).
    if kind == "token_p1":
        return TokenToKVPoolAllocator(size, KV_DTYPE, "cpu", None, need_sort=need_sort)
    if kind == "paged_p64":
        return PagedTokenToKVPoolAllocator(
            size, 64, KV_DTYPE, "cpu", None, need_sort=need_sort
        )
    raise ValueError(kind)


def bench_alloc_free(obj, warmup, reps):
    for _ in range(warmup):
        idx = obj.alloc(CHUNK)
        obj.free(idx)
        idx = None
    a_ns, f_ns = [], []
    gc.collect()
    for _ in range(reps):
        t0 = ns()
        idx = obj.alloc(CHUNK)
        t1 = ns()
        assert idx is not None and idx.numel() == CHUNK
        obj.free(idx)
        # Drop the caller's handle inside the timed free: for the page-1
        # allocator the returned indices are a view into the previous free-list
        # buffer, so this is where that buffer is actually released.
        idx = None
        t2 = ns()
        a_ns.append(t1 - t0)
        f_ns.append(t2 - t1)
    return _summ(a_ns), _summ(f_ns)


def bench_device_merge(kind, size):
    """need_sort=True: the alloc that finds the free list short merges and sorts
    everything staged.  Stage (size - 2*CHUNK) slots, then time that alloc."""
    a = make_device_allocator(kind, size, True)
    big = a.alloc(size - 2 * CHUNK)
    a.free(big)
    a.alloc(CHUNK)  # leaves < CHUNK*?  (page allocator: in pages)
    gc.collect()
    t0 = ns()
    out = a.alloc(2 * CHUNK)
    t1 = ns()
    assert out is not None
    return (t1 - t0) / 1000.0


def run_a(pools, warmup, reps):
    rows = []
    for kind in ("token_p1", "paged_p64"):
        for need_sort in (False, True):
            for size in pools:
                a = make_device_allocator(kind, size, need_sort)
                sa, sf = bench_alloc_free(a, warmup, reps)
                row = {
                    "component": "a.device_allocator",
                    "class": type(a).__name__,
                    "page_size": a.page_size,
                    "need_sort": need_sort,
                    "pool_slots": size,
                    "chunk_tokens": CHUNK,
                    "alloc": sa,
                    "free": sf,
                }
                if need_sort:
                    row["merge_sort_once_us"] = bench_device_merge(kind, size)
                rows.append(row)
                del a
                gc.collect()
    return rows


# --------------------------------------------------------------------------
# b. host pool slot allocator (HostKVCache inside MHATokenToKVPoolHost)
# --------------------------------------------------------------------------
def make_host_pool(size, page_size):
    from sglang.srt.mem_cache.device_pool_info import (
        KVBufferLayout,
        KVBuffers,
        MHABufferInfo,
    )
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    dev = torch.device("cpu")
    # Minimal "device" pool stand-in: one layer, one head, head_dim 1 (real
    # tensors; only geometry/pointers are read at construction).
    k = torch.zeros((page_size * 2, 1, 1), dtype=KV_DTYPE)
    v = torch.zeros((page_size * 2, 1, 1), dtype=KV_DTYPE)
    info = MHABufferInfo(
        buffers=KVBuffers(
            k=(k,),
            v=(v,),
            k_data_ptrs=torch.tensor([k.data_ptr()], dtype=torch.uint64),
            v_data_ptrs=torch.tensor([v.data_ptr()], dtype=torch.uint64),
            layout=KVBufferLayout.NHD,
        ),
        page_size=page_size,
        head_num=1,
        head_dim=1,
        v_head_dim=1,
        dtype=KV_DTYPE,
        device=dev,
    )
    return MHATokenToKVPoolHost(
        info,
        host_to_device_ratio=2.0,
        host_size=0,
        page_size=page_size,
        layout="layer_first",
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=size // 2,
        start_layer=0,
        end_layer=1,
        host_token_capacity=size,
    )


def run_b(pools, warmup, reps):
    rows = []
    for page_size in (64, 1):
        for size in pools:
            t0 = ns()
            hp = make_host_pool(size, page_size)
            build_ms = (ns() - t0) / 1e6
            sa, sf = bench_alloc_free(hp, warmup, reps)
            # the alloc that merges the staged release list back
            hp2 = make_host_pool(size, page_size)
            big = hp2.alloc(size - 2 * CHUNK)
            hp2.free(big)
            hp2.alloc(CHUNK)
            gc.collect()
            t1 = ns()
            out = hp2.alloc(2 * CHUNK)
            merge_us = (ns() - t1) / 1000.0
            assert out is not None
            rows.append(
                {
                    "component": "b.host_pool_allocator",
                    "class": type(hp).__name__ + " (HostKVCache.alloc/free)",
                    "page_size": hp.page_size,
                    "pool_slots": hp.size,
                    "chunk_tokens": CHUNK,
                    "pin_memory": False,
                    "layout": "layer_first",
                    "build_ms": build_ms,
                    "alloc": sa,
                    "free": sf,
                    "merge_release_once_us": merge_us,
                }
            )
            del hp, hp2
            gc.collect()
    return rows


# --------------------------------------------------------------------------
# c. radix trees, multi-turn workload
# --------------------------------------------------------------------------
N_CONV, N_TURN, TURN_TOK, VOCAB, RADIX_POOL = 200, 8, 512, 32000, 1_000_000


def make_conversations(seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, VOCAB, size=N_TURN * TURN_TOK, dtype=np.int64).tolist()
        for _ in range(N_CONV)
    ]


def make_tree(tree, page_size):
    kind = "paged_p64" if page_size == 64 else "token_p1"
    alloc = make_device_allocator(kind, RADIX_POOL, False)
    if tree == "RadixCache":
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=alloc,
            page_size=page_size,
        )
        return RadixCache(params), alloc
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    backend = {"UnifiedRadixCache[rust]": "rust", "UnifiedRadixCache[python]": "python"}[
        tree
    ]
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        tree_components=(ComponentType.FULL,),
        tree_core_backend=backend,
    )
    cache = UnifiedRadixCache(params)
    return cache, alloc


def run_workload(tree, page_size, convs):
    cache, alloc = make_tree(tree, page_size)
    legacy = tree == "RadixCache"
    avail0 = alloc.available_size()
    core = type(getattr(cache, "tree_core", cache)).__name__
    n_ops = N_CONV * N_TURN
    m_ns = [0] * n_ops
    p_ns = [0] * n_ops
    i_ns = [0] * n_ops
    conv_vals = [torch.empty((0,), dtype=torch.int64) for _ in range(N_CONV)]
    tokens_seen = 0
    hit_tokens = 0
    op = 0
    gc.collect()
    for turn in range(N_TURN):
        seq_len = (turn + 1) * TURN_TOK
        for c in range(N_CONV):
            toks = array("q", convs[c][:seq_len])
            key_m = RadixKey(toks)
            key_i = RadixKey(toks)
            t0 = ns()
            res = cache.match_prefix(MatchPrefixParams(key=key_m))
            t1 = ns()
            L = res.device_prefix_len
            prefix = cache.path_device_indices(res.last_device_node)[:L]
            t2 = ns()
            new = alloc.alloc(seq_len - L)
            assert new is not None, "radix backing pool exhausted"
            value = torch.cat((prefix, new))
            # prev_prefix_len=L tells UnifiedRadixCache that value[:L] is already
            # tree-owned (the scheduler passes req.kv.cache_protected_len); the
            # unified tree frees any other duplicates itself.  RadixCache ignores
            # it and leaves duplicate freeing to the caller (done below).
            t3 = ns()
            ins = cache.insert(InsertParams(key=key_i, value=value, prev_prefix_len=L))
            t4 = ns()
            if legacy and ins.prefix_len > L:
                alloc.free(value[L : ins.prefix_len])
            conv_vals[c] = value
            m_ns[op], p_ns[op], i_ns[op] = t1 - t0, t2 - t1, t4 - t3
            tokens_seen += seq_len
            hit_tokens += L
            op += 1
    evictable = cache.evictable_size()
    acct_ok = alloc.available_size() + evictable == avail0
    n_evict = int(evictable * 0.10)
    gc.collect()
    t0 = ns()
    er = cache.evict(EvictParams(num_tokens=n_evict))
    ev_us = (ns() - t0) / 1000.0
    acct_ok = acct_ok and alloc.available_size() + cache.evictable_size() == avail0
    out = {
        "accounting_ok": acct_ok,
        "tree_core": core,
        "match_ns": m_ns,
        "path_ns": p_ns,
        "insert_ns": i_ns,
        "tokens_seen": tokens_seen,
        "hit_tokens": hit_tokens,
        "evictable_before": evictable,
        "evict_request": n_evict,
        "evicted": er.num_tokens_evicted,
        "evict_us": ev_us,
    }
    del cache, alloc
    gc.collect()
    return out


def run_c(trees, pages, runs, warmup_runs):
    convs = make_conversations(0)
    rows = []
    for tree in trees:
        for page_size in pages:
            for _ in range(warmup_runs):
                run_workload(tree, page_size, convs)
            res = [run_workload(tree, page_size, convs) for _ in range(runs)]
            totals = [
                (sum(r["match_ns"]) + sum(r["insert_ns"])) / 1e6 for r in res
            ]
            totals_p = [
                (sum(r["match_ns"]) + sum(r["path_ns"]) + sum(r["insert_ns"])) / 1e6
                for r in res
            ]
            k = totals.index(statistics.median(totals)) if runs % 2 else 0
            rep = res[k]  # the median run (odd run counts)
            n_ops = len(rep["match_ns"])
            med_total_ms = statistics.median(totals)
            rows.append(
                {
                    "component": "c.radix_workload",
                    "tree": tree,
                    "tree_core": rep["tree_core"],
                    "page_size": page_size,
                    "workload": f"{N_CONV} conv x {N_TURN} turns x {TURN_TOK} new tok, interleaved",
                    "runs": runs,
                    "total_match_insert_ms_each_run": totals,
                    "total_match_insert_ms": med_total_ms,
                    "total_incl_path_indices_ms": statistics.median(totals_p),
                    "match_prefix_mean_us": sum(rep["match_ns"]) / n_ops / 1000,
                    "match_prefix_median_us": statistics.median(rep["match_ns"]) / 1000,
                    "path_device_indices_mean_us": sum(rep["path_ns"]) / n_ops / 1000,
                    "insert_mean_us": sum(rep["insert_ns"]) / n_ops / 1000,
                    "insert_median_us": statistics.median(rep["insert_ns"]) / 1000,
                    "ops": n_ops,
                    "tokens_through_match_and_insert": rep["tokens_seen"],
                    "tokens_per_s": rep["tokens_seen"] / (med_total_ms / 1e3),
                    "new_tokens_per_s": N_CONV * N_TURN * TURN_TOK / (med_total_ms / 1e3),
                    "prefix_hit_tokens": rep["hit_tokens"],
                    "evictable_tokens_before_evict": rep["evictable_before"],
                    "evict_request_tokens": rep["evict_request"],
                    "evicted_tokens": rep["evicted"],
                    "evict_us_each_run": [r["evict_us"] for r in res],
                    "evict_us": statistics.median([r["evict_us"] for r in res]),
                    "slot_accounting_ok_all_runs": all(r["accounting_ok"] for r in res),
                }
            )
    return rows


def run_calibration(reps=30):
    """Raw torch.cat cost of a free list of N int64 + 4096 (the primitive that
    dominates need_sort=False frees), to separate allocator design from this
    machine's CPU malloc/page-fault behaviour."""
    out = {}
    for n in (15_625, 156_250, 1_000_000, 10_000_000):
        a = torch.arange(n, dtype=torch.int64)
        b = torch.arange(CHUNK, dtype=torch.int64)
        ts = []
        for _ in range(reps):
            t0 = ns()
            a = torch.cat((a[CHUNK:], b))
            ts.append(ns() - t0)
        out[f"cat_int64_{n}"] = _summ(ts)["median_us"]
    return out


# --------------------------------------------------------------------------
# d. HiCache = UnifiedRadixCache.init_hicache() on CPU
# --------------------------------------------------------------------------
# GPU-only pieces replaced for this part only (documented in the report):
#   pool_host.common._cuda_host_register -> no-op (pins host memory via cudart)
#   pool_host.mha.transfer_kv_* (sgl_kernel.kvcacheio CUDA copy kernels, not
#   imported on CPU) -> no-ops, so D2H/H2D data movement is NOT measured; only
#   the bookkeeping around it (host-slot alloc/free, op queues, merge, acks,
#   tree state changes, locks) is.
HICACHE_TRANSFER_OPS = (
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_direct",
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
)
HICACHE_SERVER_ARGS = dict(
    # SGLang defaults, spelled out: write_through, kernel IO, page_first, ratio 2
    enable_hierarchical_cache=True,
    hicache_write_policy="write_through",
    hicache_io_backend="kernel",
    hicache_mem_layout="page_first",
    hicache_ratio=2.0,
)


def _install_hicache_cpu_stubs():
    import sglang.srt.mem_cache.pool_host.common as phc
    import sglang.srt.mem_cache.pool_host.mha as phm

    phc._cuda_host_register = lambda *a, **k: None
    stubbed = []
    for name in HICACHE_TRANSFER_OPS:
        if not hasattr(phm, name):
            setattr(phm, name, lambda *a, **k: None)
            stubbed.append(name)
    return ["pool_host.common._cuda_host_register"] + [
        "pool_host.mha." + n for n in stubbed
    ]


def make_hicache_tree(page_size, server_args):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    # Real (CPU) device KV pool, minimal geometry: 1 layer, 1 head, head_dim 1.
    kv = MHATokenToKVPool(
        RADIX_POOL, page_size, KV_DTYPE, head_num=1, head_dim=1, layer_num=1,
        device="cpu", enable_memory_saver=False,
    )
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(RADIX_POOL, KV_DTYPE, "cpu", kv, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(
            RADIX_POOL, page_size, KV_DTYPE, "cpu", kv, need_sort=False
        )
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        tree_components=(ComponentType.FULL,),
    )
    cache = UnifiedRadixCache(params)
    cache.init_hicache(server_args, params)
    assert cache.cache_controller is not None
    return cache, alloc


def run_hicache_workload(page_size, convs, server_args):
    from types import SimpleNamespace

    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

    cache, alloc = make_hicache_tree(page_size, server_args)
    cc = cache.cache_controller
    host = cc.mem_pool_host
    n_ops = N_CONV * N_TURN
    m_ns, p_ns, i_ns, e_ns = ([0] * n_ops for _ in range(4))
    tokens_seen = 0
    op = 0
    gc.collect()
    for turn in range(N_TURN):
        seq_len = (turn + 1) * TURN_TOK
        for c in range(N_CONV):
            toks = array("q", convs[c][:seq_len])
            key_m, key_i = RadixKey(toks), RadixKey(toks)
            t0 = ns()
            res = cache.match_prefix(MatchPrefixParams(key=key_m))
            t1 = ns()
            L = res.device_prefix_len
            prefix = cache.path_device_indices(res.last_device_node)[:L]
            t2 = ns()
            new = alloc.alloc(seq_len - L)
            assert new is not None
            value = torch.cat((prefix, new))
            t3 = ns()
            cache.insert(InsertParams(key=key_i, value=value, prev_prefix_len=L))
            t4 = ns()
            # one scheduler step: submit queued write-through backups, reap acks
            cache.check_hicache_events()
            t5 = ns()
            m_ns[op], p_ns[op], i_ns[op], e_ns[op] = t1 - t0, t2 - t1, t4 - t3, t5 - t4
            tokens_seen += seq_len
            op += 1
    cache.check_hicache_events()
    backed_up = host.size - host.available_size()
    acct_ok = alloc.available_size() + cache.evictable_size() == RADIX_POOL - (
        RADIX_POOL % page_size if page_size > 1 else 0
    )
    evictable = cache.evictable_size()
    n_evict = int(evictable * 0.10)
    gc.collect()
    t0 = ns()
    er = cache.evict(EvictParams(num_tokens=n_evict))
    ev_us = (ns() - t0) / 1000.0
    # Re-visit every conversation: those whose tail was demoted now hit on host;
    # load it back the way the scheduler does (init_load_back -> start_loading
    # -> loading_check via check_hicache_events).
    lb_ns, lb_tokens, lb_match_ns = [], 0, []
    full = N_TURN * TURN_TOK
    for c in range(N_CONV):
        toks = array("q", convs[c][:full])
        t0 = ns()
        res = cache.match_prefix(MatchPrefixParams(key=RadixKey(toks)))
        t1 = ns()
        if res.host_hit_length <= 0:
            continue
        req = SimpleNamespace(
            rid=f"conv{c}", last_node=res.last_device_node,
            swa_host_hit_length=0, mamba_host_hit_length=0,
            kv=SimpleNamespace(mamba_pool_idx=None),
        )
        t2 = ns()
        loaded = cache.init_load_back(
            InitLoadBackParams(
                best_match_node=res.best_match_node,
                host_hit_length=res.host_hit_length,
                req=req,
            )
        )
        cache.ready_to_load_host_cache()
        cache.check_hicache_events()
        t3 = ns()
        assert loaded is not None and loaded[0] == res.host_hit_length, (loaded, res)
        lb_match_ns.append(t1 - t0)
        lb_ns.append(t3 - t2)
        lb_tokens += loaded[0]
    cache.check_hicache_events()
    out = {
        "tree_core": type(cache.tree_core).__name__,
        "match_ns": m_ns, "path_ns": p_ns, "insert_ns": i_ns, "events_ns": e_ns,
        "tokens_seen": tokens_seen,
        "host_slots": host.size,
        "host_slots_used_after_workload": backed_up,
        "evictable_before": evictable,
        "evict_request": n_evict,
        "evicted": er.num_tokens_evicted,
        "evict_us": ev_us,
        "load_backs": len(lb_ns),
        "load_back_tokens": lb_tokens,
        "load_back_us": [v / 1000 for v in lb_ns],
        "host_hit_match_us": [v / 1000 for v in lb_match_ns],
        "accounting_ok": acct_ok,
        "ongoing_write_through_left": len(cache.ongoing_write_through),
        "ongoing_load_back_left": len(cache.ongoing_load_back),
    }
    cache.release_host_resources()
    del cache, alloc
    gc.collect()
    return out


def run_d(pages, runs, warmup_runs):
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams  # noqa: F401
    from sglang.srt.runtime_context import get_context

    info = {
        "component": "d.hicache",
        "HiRadixCache_class_in_sglang_0_5_23": False,
        "what_ran": "UnifiedRadixCache + init_hicache (HostPoolGroup, "
        "HybridCacheController, MHATokenToKVPoolHost), Rust TreeCore",
        "server_args_overrides": HICACHE_SERVER_ARGS,
        "stubs": _install_hicache_cpu_stubs(),
        "rows": [],
    }
    ov = get_context().override_server_args(**HICACHE_SERVER_ARGS)
    server_args = ov.install()
    try:
        convs = make_conversations(0)
        for page_size in pages:
            info_args = dict(server_args=server_args)
            for _ in range(warmup_runs):
                run_hicache_workload(page_size, convs, **info_args)
            res = [run_hicache_workload(page_size, convs, **info_args) for _ in range(runs)]
            tot = [(sum(r["match_ns"]) + sum(r["insert_ns"])) / 1e6 for r in res]
            tot_ev = [
                (sum(r["match_ns"]) + sum(r["insert_ns"]) + sum(r["events_ns"])) / 1e6
                for r in res
            ]
            k = tot.index(statistics.median(tot)) if runs % 2 else 0
            rep = res[k]
            n = len(rep["match_ns"])
            med = statistics.median(tot)
            info["rows"].append(
                {
                    "tree": "UnifiedRadixCache+HiCache",
                    "tree_core": rep["tree_core"],
                    "page_size": page_size,
                    "runs": runs,
                    "total_match_insert_ms_each_run": tot,
                    "total_match_insert_ms": med,
                    "total_incl_hicache_events_ms": statistics.median(tot_ev),
                    "match_prefix_mean_us": sum(rep["match_ns"]) / n / 1000,
                    "path_device_indices_mean_us": sum(rep["path_ns"]) / n / 1000,
                    "insert_mean_us": sum(rep["insert_ns"]) / n / 1000,
                    "check_hicache_events_mean_us": sum(rep["events_ns"]) / n / 1000,
                    "tokens_per_s": rep["tokens_seen"] / (med / 1e3),
                    "host_slots": rep["host_slots"],
                    "host_slots_used_after_workload": rep["host_slots_used_after_workload"],
                    "evict_request_tokens": rep["evict_request"],
                    "evicted_tokens": rep["evicted"],
                    "evict_us_each_run": [r["evict_us"] for r in res],
                    "evict_us": statistics.median([r["evict_us"] for r in res]),
                    "load_backs": rep["load_backs"],
                    "load_back_tokens": rep["load_back_tokens"],
                    "load_back_mean_us": (
                        statistics.fmean(rep["load_back_us"]) if rep["load_back_us"] else None
                    ),
                    "host_hit_match_mean_us": (
                        statistics.fmean(rep["host_hit_match_us"])
                        if rep["host_hit_match_us"] else None
                    ),
                    "slot_accounting_ok_all_runs": all(r["accounting_ok"] for r in res),
                    "pending_ops_left": rep["ongoing_write_through_left"]
                    + rep["ongoing_load_back_left"],
                }
            )
        info["ran"] = True
    finally:
        ov.restore()
    return info


# --------------------------------------------------------------------------
def fmt_table(result):
    L = []
    L.append("calibration: median us of torch.cat(int64 free list[N-4096], 4096): "
             + ", ".join(f"N={k.split('_')[-1]}: {v:.0f}" for k, v in result["calibration_us"].items()))
    L.append("")
    L.append("a. device allocators: alloc(4096)+free(4096) on CPU, microseconds")
    L.append(f"{'class':30s} {'pg':>3s} {'sort':>5s} {'pool':>9s} {'alloc med':>10s} {'alloc mean':>10s} {'free med':>10s} {'free mean':>10s} {'merge once':>11s}")
    for r in result["a"]:
        L.append(
            f"{r['class']:30s} {r['page_size']:3d} {str(r['need_sort']):>5s} {r['pool_slots']:9d} "
            f"{r['alloc']['median_us']:10.1f} {r['alloc']['mean_us']:10.1f} {r['free']['median_us']:10.1f} {r['free']['mean_us']:10.1f} "
            f"{r.get('merge_sort_once_us', float('nan')):11.1f}"
        )
    L.append("")
    L.append("b. host pool slot allocator (HostKVCache in MHATokenToKVPoolHost, pin_memory=False)")
    L.append(f"{'pg':>3s} {'pool':>9s} {'alloc med':>10s} {'alloc mean':>10s} {'free med':>10s} {'free mean':>10s} {'merge once':>11s} {'build ms':>9s}")
    for r in result["b"]:
        L.append(
            f"{r['page_size']:3d} {r['pool_slots']:9d} {r['alloc']['median_us']:10.1f} {r['alloc']['mean_us']:10.1f} "
            f"{r['free']['median_us']:10.1f} {r['free']['mean_us']:10.1f} {r['merge_release_once_us']:11.1f} {r['build_ms']:9.1f}"
        )
    L.append("")
    L.append("c. radix trees, 200 conv x 8 turns x 512 tok (1600 match + 1600 insert); us = mean per op")
    L.append(f"{'tree':27s} {'pg':>3s} {'total ms':>9s} {'match us':>9s} {'path us':>8s} {'insert us':>9s} {'Mtok/s':>7s} {'evict us':>9s} {'evicted':>8s}")
    for r in result["c"]:
        L.append(
            f"{r['tree']:27s} {r['page_size']:3d} {r['total_match_insert_ms']:9.1f} {r['match_prefix_mean_us']:9.1f} "
            f"{r['path_device_indices_mean_us']:8.1f} {r['insert_mean_us']:9.1f} {r['tokens_per_s']/1e6:7.1f} "
            f"{r['evict_us']:9.0f} {r['evicted_tokens']:8d}"
        )
    L.append("")
    d = result["d"]
    L.append("d. HiCache (UnifiedRadixCache.init_hicache; copy kernels stubbed) same workload; us = mean per op")
    if not d.get("rows"):
        L.append("   did not run: " + str(d.get("error")))
    L.append(f"{'tree':27s} {'pg':>3s} {'total ms':>9s} {'match us':>9s} {'path us':>8s} {'insert us':>9s} {'events us':>9s} {'Mtok/s':>7s} {'evict us':>9s} {'loadbacks':>9s} {'lb us':>7s}")
    for r in d.get("rows", []):
        L.append(
            f"{r['tree']:27s} {r['page_size']:3d} {r['total_match_insert_ms']:9.1f} {r['match_prefix_mean_us']:9.1f} "
            f"{r['path_device_indices_mean_us']:8.1f} {r['insert_mean_us']:9.1f} {r['check_hicache_events_mean_us']:9.1f} "
            f"{r['tokens_per_s']/1e6:7.1f} {r['evict_us']:9.0f} {r['load_backs']:9d} {r['load_back_mean_us'] or 0:7.0f}"
        )
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--default-malloc", action="store_true",
                    help="keep glibc's dynamic mmap threshold (noisier)")
    ap.add_argument(
        "--out",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results/local/sglang_cpu_anchor.json"),
    )
    args = ap.parse_args()
    pools = [1_000_000, 10_000_000]
    if args.quick:
        warm, reps, runs, wruns = 3, 10, 1, 0
    else:
        warm, reps, runs, wruns = 20, 200, 3, 1
    t_start = time.time()
    result = {
        "meta": {
            "sglang": sglang.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
            "cpu": platform.processor() or platform.machine(),
            "cpu_model": _cpu_model(),
            "nproc": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "stubbed_modules": list(STUBBED_TOPLEVEL),
            "tensors": "CPU torch tensors (device='cpu') everywhere",
            "timer": "time.perf_counter_ns",
            "malloc_env": {k: os.environ.get(k) for k in _MALLOC_ENV},
            "alloc_warmup_reps": [warm, reps],
            "radix_runs_warmup": [runs, wruns],
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
    }
    result["calibration_us"] = run_calibration()
    result["a"] = run_a(pools, warm, reps)
    result["b"] = run_b(pools, warm, reps)
    result["c"] = run_c(
        ["RadixCache", "UnifiedRadixCache[rust]", "UnifiedRadixCache[python]"],
        [64, 1],
        runs,
        wruns,
    )
    try:
        result["d"] = run_d([64, 1], runs, wruns)
    except Exception as e:  # report why HiCache could not run on CPU
        import traceback

        result["d"] = {"component": "d.hicache", "ran": False, "error": repr(e),
                       "traceback": traceback.format_exc()[-3000:]}
    result["meta"]["wall_s"] = time.time() - t_start
    print(fmt_table(result))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.out}  (wall {result['meta']['wall_s']:.0f}s)")


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


if __name__ == "__main__":
    main()
