"""The `StorageBackend` contract, run against every backend: byte-exact round trips, leading-run
exists, content-addressed writes, disjoint namespaces, argument checks, concurrent callers."""
from __future__ import annotations

import threading

import pytest
import torch

from hicache.storage import StorageNamespace
from tests.hicache.storage.conftest import dsv4, keys_for, llama, pages_of, random_pool

POOLS = [("dsv4", p.name) for p in dsv4().data_pools()] + [("llama", "kv"), ("llama-fp8", "kv")]
STACKS = {"dsv4": dsv4, "llama": llama, "llama-fp8": lambda: llama(2, "-fp8")}


@pytest.mark.parametrize("src_layout, dst_layout", [("page_first", "layer_first"), ("layer_first", "page_first")])
@pytest.mark.parametrize("stack_name, pool", POOLS, ids=[f"{s}:{p}" for s, p in POOLS])
def test_round_trip_is_byte_exact(open_backend, gen, stack_name, pool, src_layout, dst_layout):
    stack = STACKS[stack_name]()
    ns = StorageNamespace.for_pool(stack, pool)
    backend = open_backend(ns)
    n, r = 3, ns.rows_per_object
    src = random_pool(stack, pool, (n + 2) * r, gen, layout=src_layout)
    dst = random_pool(stack, pool, (n + 2) * r, gen, layout=dst_layout)
    backend.register_buffer(src.buffer)
    backend.register_buffer(dst.buffer)
    src_before, dst_before = src.buffer.clone(), dst.buffer.clone()
    keys = keys_for(n, stack.page_size)
    # 1. back up objects 1..3 of the source pool
    assert backend.batch_set(keys, pages_of(src, ns, n, first=1)) == [True] * n
    # 2. read them into objects 0..2 of a pool in the other layout
    assert backend.batch_get(keys, pages_of(dst, ns, n, first=0)) == [True] * n
    for i in range(n):
        assert torch.equal(pages_of(dst, ns, 1, first=i)[0], pages_of(src, ns, 1, first=i + 1)[0])
    # 3. the source is unchanged, and so are the destination's untouched rows
    assert torch.equal(src.buffer, src_before)
    untouched = pages_of(dst, ns, 2, first=n)
    assert all(torch.equal(u, b) for u, b in zip(untouched, pages_of(_wrap(dst, dst_before), ns, 2, first=n)))
    s = backend.stats()
    assert (s.objects_written, s.bytes_written, s.hits, s.bytes_read) == (n, n * ns.object_bytes, n, n * ns.object_bytes)


def _wrap(pool, buffer):
    """A shallow copy of ``pool`` whose buffer is ``buffer`` (to view a snapshot the same way)."""
    clone = object.__new__(type(pool))
    clone.__dict__.update(pool.__dict__, buffer=buffer, _views=None)
    return clone


def test_exists_is_the_leading_run_and_get_reports_each_key(open_backend, gen):
    ns = StorageNamespace.for_pool(llama(1), "kv", extra="exists")
    backend = open_backend(ns)
    pool = random_pool(llama(1), "kv", 6, gen)
    keys = keys_for(6, 64)
    present = [0, 1, 2, 4]  # a hole at 3
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set([keys[i] for i in present], [pages_of(pool, ns, 1, i)[0] for i in present]) == [True] * 4
    assert backend.batch_exists(keys) == 3
    assert backend.batch_exists(keys[4:5]) == 1
    assert backend.batch_exists([]) == 0
    out = random_pool(llama(1), "kv", 6, gen)
    assert backend.batch_get(keys, pages_of(out, ns, 6)) == [True, True, True, False, True, False]
    assert backend.stats().misses == 2


def test_existing_objects_are_kept_not_rewritten(open_backend, gen):
    ns = StorageNamespace.for_pool(llama(1), "kv", extra="rewrite")
    backend = open_backend(ns)
    a, b = random_pool(llama(1), "kv", 2, gen), random_pool(llama(1), "kv", 2, gen)
    keys = keys_for(2, 64)
    assert backend.batch_set(keys, pages_of(a, ns, 2)) == [True, True]
    assert backend.batch_set(keys, pages_of(b, ns, 2)) == [True, True]  # same keys: content-addressed
    out = random_pool(llama(1), "kv", 2, gen)
    assert backend.batch_get(keys, pages_of(out, ns, 2)) == [True, True]
    assert torch.equal(out.buffer, a.buffer)
    assert backend.stats().writes_skipped == 2


@pytest.mark.parametrize("other", ["fp8", "rank1", "salt"])
def test_namespaces_and_salts_never_read_each_other(open_backend, gen, other):
    bf16 = StorageNamespace.for_pool(llama(2), "kv", model="llama-3.1-8b", tp_size=2)
    backend = open_backend(bf16)
    pool = random_pool(llama(2), "kv", 2, gen)
    keys = keys_for(2, 64)
    assert backend.batch_set(keys, pages_of(pool, bf16, 2)) == [True, True]
    if other == "salt":  # same namespace, another tenant's salt: other keys
        assert backend.batch_exists(keys_for(2, 64, salt="tenant-b")) == 0
        return
    stack = llama(2, "-fp8") if other == "fp8" else llama(2)
    ns = StorageNamespace.for_pool(stack, "kv", model="llama-3.1-8b", tp_size=2, tp_rank=int(other == "rank1"))
    reader = open_backend(ns)
    assert reader.batch_exists(keys) == 0
    out = random_pool(stack, "kv", 2, gen)
    before = out.buffer.clone()
    assert reader.batch_get(keys, pages_of(out, ns, 2)) == [False, False]
    assert torch.equal(out.buffer, before)


def test_bad_arguments_raise_and_change_nothing(open_backend, gen):
    ns = StorageNamespace.for_pool(llama(1), "kv", extra="bad-args")
    backend = open_backend(ns)
    pool = random_pool(llama(1), "kv", 2, gen)
    keys = keys_for(2, 64)
    with pytest.raises(ValueError, match="one buffer per key"):
        backend.batch_set(keys, pages_of(pool, ns, 1))
    with pytest.raises(ValueError, match=r"pages\[0\]: need"):
        backend.batch_set(keys[:1], [pool.buffer[0, 0, :100]])
    with pytest.raises(ValueError, match=r"keys\[1\]"):
        backend.batch_get([keys[0], "not-a-hash"], pages_of(pool, ns, 2))
    assert backend.batch_exists(keys) == 0
    assert backend.stats().objects_written == 0
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        backend.batch_exists(keys)


def test_concurrent_callers(open_backend, gen):
    ns = StorageNamespace.for_pool(llama(1), "kv", extra="threads")
    backend = open_backend(ns)
    src = random_pool(llama(1), "kv", 16, gen)
    keys = keys_for(16, 64)
    outs = [random_pool(llama(1), "kv", 16, gen) for _ in range(4)]
    errors = []

    def worker(t: int) -> None:
        try:
            # every thread writes every key (overlapping writers, in two orders) before reading all:
            # [t::2] left keys out for t >= 2, so a slow thread 0 made a reader miss key 0
            order = list(range(16))[t % 2::2] + list(range(16))[1 - t % 2::2]
            for i in order:
                assert backend.batch_set([keys[i]], [pages_of(src, ns, 1, i)[0]]) == [True]
            assert backend.batch_get(keys, pages_of(outs[t], ns, 16)) == [True] * 16
        except Exception as e:  # surfaced below with the thread's number
            errors.append((t, e))
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert all(torch.equal(o.buffer, src.buffer) for o in outs)
