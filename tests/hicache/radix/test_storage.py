"""The storage tier in the tree: write-through / write-back, prefetch into host slots, the
hybrid rule through storage, partial hits (host short, timeout, damage), a prefetch racing
host eviction, warm starts from another tree. Content is checked byte for byte on the device."""
from __future__ import annotations

import tempfile
import threading
import time
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache.models import deepseek_v4, mha
from hicache.radix import prefetch as prefetch_module
from hicache.radix.prefetch import PrefetchOutcome
from hicache.storage import FileBackend
from hicache.replay.content import ContentModel
from tests.hicache.radix.storage_env import STACKS, forget_all, make, poll_until_reading, serve, stored
from tests.hicache.radix.test_cache import seq

@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("stack_name", list(STACKS))
def test_write_through_then_prefetch_brings_every_pool_back_exact(tmp_path, stack_name, layout):
    stack = STACKS[stack_name]()
    cache, tree = make(stack, tmp_path, mem_layout=layout)
    content, ps = ContentModel(cache), stack.page_size
    a = seq(0, 3, ps)
    # 1. computed once: device -> host (write-through) -> storage (write-through)
    first = serve(cache, tree, content, a)
    assert (first.device, first.host, first.storage) == (0, 0, 0)
    forget_all(tree)
    node_pages = tree.counters["storage_write_pages"]
    assert node_pages == 3
    # 2. the device and host forgot; the store did not: a storage hit, bytes checked on device
    shift = cache.device_pools[tree.anchor].alloc(ps)  # other slots than the first time
    again = serve(cache, tree, content, a)
    assert again.prefetch.outcome is PrefetchOutcome.COMPLETE
    assert again.prefetch.found_tokens == again.prefetch.read_tokens == again.prefetch.added_tokens == 3 * ps
    assert (again.device, again.host, again.storage) == (0, 0, 3 * ps)
    # 3. landed pages are known stored: nothing is written twice
    tree.drain_storage()
    assert tree.counters["storage_write_pages"] == node_pages
    cache.device_pools[tree.anchor].free(shift)
    tree.check_integrity()
    tree.close()


def test_a_second_tree_on_the_same_store_starts_warm(tmp_path):
    stack = deepseek_v4([4, 128, 0, 4])
    cache1, tree1 = make(stack, tmp_path)
    content = ContentModel(cache1)
    a = seq(0, 4, 256)
    serve(cache1, tree1, content, a)
    tree1.close()
    cache1.close()
    # another process (another cache, another tree): its first request is a storage hit
    cache2, tree2 = make(stack, tmp_path)
    got = serve(cache2, tree2, ContentModel(cache2), a)
    assert got.storage == 4 * 256 and got.prefetch.outcome is PrefetchOutcome.COMPLETE
    tree2.check_integrity()
    tree2.close()


def test_hybrid_prefetch_stops_at_the_deepest_stored_snapshot(tmp_path):
    stack = deepseek_v4([4, 128, 0, 4])
    cache, tree = make(stack, tmp_path, device_pages=16)
    content, ps = ContentModel(cache), 256
    ab = seq(0, 4, ps)
    # 1. A+B computed with a snapshot at its end; then only A's boundary keeps one in storage
    serve(cache, tree, content, ab[:2 * ps])
    serve(cache, tree, content, ab, snap=False)
    forget_all(tree)
    # 2. a query for A+B+C: history for 4 pages is in storage, a snapshot only after page 2
    q = np.concatenate([ab, seq(9000, 1, ps)])
    got = serve(cache, tree, content, q, snap=False)
    assert got.prefetch.outcome is PrefetchOutcome.COMPLETE
    assert got.prefetch.found_tokens == got.storage == 2 * ps  # not 4: no snapshot at 1024
    # 3. history without any stored snapshot is no match through storage at all
    x = seq(20000, 2, ps)
    serve(cache, tree, content, x, snap=False)
    forget_all(tree)
    nothing = serve(cache, tree, content, x, snap=False)
    assert nothing.prefetch.outcome is PrefetchOutcome.NOT_FOUND and nothing.storage == 0
    tree.check_integrity()
    tree.close()


def test_write_back_writes_only_when_the_host_lets_go(tmp_path):
    stack = mha(1, 1, 8, page_size=4)
    cache, tree = make(stack, tmp_path, storage_write_policy="write_back")
    content = ContentModel(cache)
    a = seq(0, 2, 4)
    serve(cache, tree, content, a)
    tree.drain_storage()
    assert tree.counters["storage_write_pages"] == 0 and tree.stats()["storage"]["objects_written"] == 0
    # host eviction sends the leaf to storage; its host pages return once the write ends
    tree.evict(8)
    assert tree.evict_host(8) == 8 and not tree.root.children
    tree.check_integrity()  # the pages being written are in flight, not leaked
    tree.drain_storage()
    host = cache.host_group.pools["kv"]
    assert host.available() == host.num_tokens
    assert tree.stats()["storage"]["objects_written"] == 2
    got = serve(cache, tree, content, a)
    assert got.storage == 8
    tree.check_integrity()
    tree.close()


class SecondReadWaits(FileBackend):
    """A FileBackend whose second read (call) waits on a gate: a store stalled mid-prefetch."""

    gate, entered, calls = threading.Event(), threading.Event(), 0

    def _get(self, keys, pages):
        cls = type(self)
        cls.calls += 1
        if cls.calls == 2:
            cls.entered.set()
            assert cls.gate.wait(60), "the test never opened the gate"
        return super()._get(keys, pages)


@pytest.fixture
def stalled():
    SecondReadWaits.gate.clear()
    SecondReadWaits.entered.clear()
    SecondReadWaits.calls = 0
    yield SecondReadWaits
    SecondReadWaits.gate.set()


def test_a_prefetch_ends_at_its_deadline_while_a_read_is_stalled(tmp_path, stalled, monkeypatch):
    """Issue 23, item 18: the deadline holds even while an I/O chunk is stuck in the store;
    the prefetch ends with the chunks that finished, and the stuck chunk's host slots stay
    out of reach until it returns (its bytes are never published)."""
    cache, tree, a = stored(tmp_path, 6, backend_cls=stalled, storage_prefetch_policy="timeout",
                            storage_prefetch_timeout_s=60)
    tree.storage.io.chunk_pages = 2
    content, host = ContentModel(cache), cache.host_group.pools["kv"]
    p = tree.prefetch(a)
    poll_until_reading(tree, stalled)  # chunk 1 (2 pages) read, chunk 2 stuck in the store
    later = types.SimpleNamespace(monotonic=lambda: time.monotonic() + 3600)
    monkeypatch.setattr(prefetch_module, "time", later)  # the tree's clock: the deadline has passed
    tree.poll()
    assert p.done and p.result.outcome is PrefetchOutcome.TIMEOUT
    assert (p.result.found_tokens, p.result.read_tokens, p.result.added_tokens) == (24, 8, 8)
    tree.check_integrity()
    assert host.available() == host.num_tokens - 24  # 8 published, 16 still the stuck read's
    stalled.gate.set()
    tree.drain_storage()
    assert host.available() == host.num_tokens - 8  # its late end gave the 16 back, published nothing
    # the next request finds the 2 pages on host (checked) and prefetches the other 4
    got = serve(cache, tree, content, a)
    assert (got.host, got.storage, got.prefetch.outcome) == (8, 16, PrefetchOutcome.COMPLETE)
    tree.check_integrity()
    tree.close()


def test_prefetch_with_too_few_host_slots_reads_what_fits(tmp_path):
    stack = deepseek_v4([4, 128, 0, 4])
    ps = 256
    a = seq(0, 6, ps)
    cache, tree = make(stack, tmp_path, device_pages=16)
    content = ContentModel(cache)
    serve(cache, tree, content, a[:2 * ps])  # snapshots at 512 and 1536 in storage
    serve(cache, tree, content, a[:4 * ps], snap=False)
    serve(cache, tree, content, a[:6 * ps])
    forget_all(tree)
    # a request holds all but 3 pages of the host: the deepest boundary that fits is 512
    host = cache.host_group.pools["kv"]
    held = host.alloc(host.available() - 3 * ps)
    got = serve(cache, tree, content, a, snap=False)
    assert got.prefetch.outcome is PrefetchOutcome.HOST_SHORT
    assert (got.prefetch.found_tokens, got.prefetch.read_tokens) == (6 * ps, 2 * ps)
    assert got.storage == 2 * ps
    host.free(held)
    tree.check_integrity()
    tree.close()


def test_best_effort_takes_what_is_there_and_stays_clean(tmp_path, gated):
    cache, tree, a = stored(tmp_path, 6, backend_cls=gated, storage_prefetch_policy="best_effort")
    content = ContentModel(cache)
    p = tree.prefetch(a)
    poll_until_reading(tree, gated)
    # the scheduler takes the request now: the read in progress (one chunk) still finishes
    threading.Timer(0.1, gated.gate.set).start()
    res = tree.wait_prefetch(p)
    assert res.outcome in (PrefetchOutcome.STOPPED, PrefetchOutcome.COMPLETE)
    assert res.added_tokens == res.read_tokens <= res.found_tokens == 24
    got = serve(cache, tree, content, a)  # whatever landed is byte-checked
    assert got.host == res.read_tokens
    tree.check_integrity()
    tree.close()


# ---- property test -------------------------------------------------------------------
def _tokens(pages: list[int]) -> np.ndarray:
    out = [np.full(256, 1 + p * 7 + i * 31, dtype=np.int64) + np.arange(256) for i, p in enumerate(pages)]
    return np.concatenate(out)


OPS = st.one_of(
    st.tuples(st.just("serve"), st.lists(st.integers(0, 2), min_size=1, max_size=4)),
    st.tuples(st.just("evict"), st.integers(0, 4)),
    st.tuples(st.just("evict_host"), st.integers(0, 4)),
    st.tuples(st.just("evict_states"), st.integers(0, 2)),
    st.tuples(st.just("evict_host_states"), st.integers(0, 2)),
    st.tuples(st.just("drain"), st.just(0)),
    st.tuples(st.just("forget"), st.just(0)),  # device and host let go; writes may be in flight
)


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["write_through", "write_back"]), store_policy=st.sampled_from(["write_through",
                                                                                             "write_back"]),
       ops=st.lists(OPS, min_size=1, max_size=12))
def test_random_operations_with_storage_keep_every_invariant(policy, store_policy, ops):
    # DeepSeek-V4 (every pool kind) on a small device and host: prefetches, evictions on
    # both tiers and storage writes interleave; every byte a request uses is checked
    with tempfile.TemporaryDirectory() as store_dir:
        cache, tree = make(deepseek_v4([4, 0]), store_dir, device_pages=4, write_policy=policy,
                           storage_write_policy=store_policy)
        content = ContentModel(cache)
        for op, arg in ops:
            if op == "serve":
                serve(cache, tree, content, _tokens(arg))
            elif op == "drain":
                tree.drain_storage()
            elif op == "forget":
                tree.evict(1 << 30)
                tree.evict_host(1 << 30)
            elif op in ("evict", "evict_host"):
                getattr(tree, op)(arg * 256)
            else:
                getattr(tree, op)(arg * 128)
            tree.check_integrity()
        tree.close()
        tree.check_integrity()
