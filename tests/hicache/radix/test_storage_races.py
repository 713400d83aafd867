"""The tree's parts meeting at `poll`: a load-back racing a prefetch that lands while it
makes room, one broken ack among others, two trees sharing one `StorageIO`, and
DeepSeek-V4 stacks without a history pool on the storage tier."""
from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
import torch

from hicache import build
from hicache.cli import main
from hicache.models import deepseek_v4, mha
from hicache.radix import HiRadixCache
from hicache.radix.read import child_nodes
from hicache.radix.prefetch import PrefetchOutcome
from hicache.radix.store import TierStore
from hicache.replay.content import ContentModel, prefix_hashes
from hicache.storage import FileBackend, StorageIO, StorageNamespace
from tests.hicache.radix.storage_env import config, forget_all, make, serve, store_pages, stored
from tests.hicache.radix.test_cache import BIG, seq
from tests.hicache.radix.test_cache import make as make_plain

PS = 4


def finish_io(jobs) -> None:
    """Wait until every operation of ``jobs`` has finished on the I/O threads (its result
    is then waiting to be polled); polls nothing."""
    for job in jobs:
        for op in job.ops.values():
            assert op.result(30) is not None, "a storage operation did not finish"


def store_jobs(tree) -> list:
    return list({id(job): job for job, _ in tree.storage._jobs.values()}.values())


# ---- item 4: load_back racing a prefetch ----------------------------------------------------
def test_load_back_whose_room_lands_a_prefetch_that_splits_its_node(tmp_path):
    stack = mha(1, 1, 8, page_size=PS)
    x = seq(0, 4, PS)
    p_tokens = np.concatenate([x[:2 * PS], seq(700, 2, PS)])  # shares X's first 2 pages
    cache, tree = make(stack, tmp_path, device_pages=6, write_policy="write_back")
    content = ContentModel(cache)
    # 1. X (4 pages, one node) is cached, then evicted to the host (write-back backs it up first)
    serve(cache, tree, content, x)
    assert tree.evict(4 * PS) == 4 * PS
    # 2. Y fills the device (device-only under write-back): a load of X needs room
    serve(cache, tree, content, seq(300, 4, PS))
    tree.drain_storage()
    store_pages(tmp_path, stack, p_tokens)  # meanwhile another server stored P
    # 3. P's prefetch starts inside X (X locked), its read finishes but is not polled yet
    p = tree.prefetch(p_tokens)
    finish_io(store_jobs(tree))
    tree.poll()  # the lookup: host slots taken, reads submitted
    finish_io(store_jobs(tree))
    # 4. load_back(X): making room backs Y up and waits, which polls: P lands and splits X
    m = tree.match_prefix(x)
    node = m.last_host_node
    tree.inc_lock_ref(node)
    got = tree.load_back(node)
    assert got is not None and got["kv"].numel() == 4 * PS
    assert p.done and p.result.outcome is PrefetchOutcome.COMPLETE
    tree.wait()
    tree.dec_lock_ref(node)
    # 5. X is a device hit with its own bytes; P's new pages are a host hit
    m = tree.match_prefix(x)
    assert m.device_hit_length == 4 * PS
    content.verify("kv", m.device_slots, prefix_hashes(x, PS), "X after its load")
    m = tree.match_prefix(p_tokens)
    assert (m.device_hit_length, m.host_hit_length) == (2 * PS, 2 * PS)
    tree.check_integrity()
    tree.close()


def test_one_broken_ack_does_not_drop_the_others(monkeypatch, caplog):
    cache, tree = make_plain(mha(1, 1, 8, page_size=PS), "write_through", device_pages=8)
    kv = cache.device_pools["kv"]
    a, b = seq(0, 2, PS), seq(100, 2, PS)
    # 1. A and B cached and backed up, then evicted to the host
    node_a = tree.insert(a, kv.alloc(2 * PS)).last_node
    node_b = tree.insert(b, kv.alloc(2 * PS)).last_node
    tree.wait()
    assert tree.evict(4 * PS) == 4 * PS
    free_before = kv.available()
    # 2. both loads go in one batch; publishing A's ack breaks (a bug, injected)
    assert tree.load_back(node_a) is not None and tree.load_back(node_b) is not None
    owner = getattr(tree, "_transfers", tree)
    publish = owner._publish_load

    def broken(rec, chain):
        if rec.node is node_a:
            raise RuntimeError("injected: this ack cannot be applied")
        return publish(rec, chain)
    monkeypatch.setattr(owner, "_publish_load", broken)
    cache.controller.start_loading()
    with caplog.at_level(logging.ERROR):
        tree.poll()  # never raises: each ack is handled on its own
    # 3. B's ack was applied; A's was reported and its device slots went back
    assert tree.match_prefix(b).device_hit_length == 2 * PS
    assert tree.match_prefix(a).device_hit_length == 0 and node_a.host is not None
    assert kv.available() == free_before - 2 * PS
    assert tree.stats()["tree"]["acks_broken"] == 1
    assert any("injected" in r.getMessage() or "injected" in str(r.exc_info) for r in caplog.records)
    assert tree.pending_ops() == 0 and node_a.lock_ref == 0
    tree.check_integrity()


# ---- item 5: two trees on one StorageIO -----------------------------------------------------
def tree_on(io, store_dir):
    stack = mha(1, 1, 8, page_size=PS)
    cache = build(stack, 8 * PS, config(store_dir), device="cpu", budget=BIG, backend="torch")
    backends = {p.name: FileBackend(StorageNamespace.for_pool(stack, p.name, rows_per_object=TierStore.unit_rows(
        stack, p.name)), store_dir) for p in stack.data_pools()}
    return cache, HiRadixCache(cache, storage=TierStore(cache, backends, io=io))


def test_two_trees_sharing_one_storage_io_get_their_own_results(tmp_path):
    io = StorageIO()
    (c1, t1), (c2, t2) = tree_on(io, tmp_path / "one"), tree_on(io, tmp_path / "two")
    a = seq(0, 3, PS)
    # 1. tree 1 writes A through to storage; tree 2 polls after the write finished
    serve(c1, t1, ContentModel(c1), a)
    jobs = store_jobs(t1)
    assert jobs
    finish_io(jobs)
    t2.poll()
    t1.poll()
    assert not t1.storage.busy()  # tree 1 got its write's result (and unpinned its pages)
    # 2. tree 1 forgets A and prefetches it; tree 2 polls before tree 1 at every step
    forget_all(t1)
    p = t1.prefetch(a)
    for _ in range(2):  # the lookup, then the read
        finish_io(store_jobs(t1))
        t2.poll()
        t1.poll()
    assert p.done and p.result.outcome is PrefetchOutcome.COMPLETE
    assert all(n.lock_ref == 0 for n in child_nodes(t1.root))
    t1.check_integrity()
    t2.check_integrity()
    t1.close()
    t2.close()
    io.close()


def test_match_and_prefetch_matches_again_after_the_prefetch(tmp_path):
    cache, tree, a = stored(tmp_path, 3)
    m, first_end = tree.match_and_prefetch(a)
    assert (first_end, m.device_hit_length, m.host_hit_length) == (0, 0, 3 * PS)
    tree.check_integrity()
    tree.close()


# ---- item 6: DeepSeek-V4 stacks with no history pool ---------------------------------------
@pytest.mark.parametrize("ratios", [[0], [0, 0]])
def test_dsv4_without_a_history_pool_on_the_storage_tier(tmp_path, ratios):
    stack = deepseek_v4(ratios)
    ps = stack.page_size
    cache, tree = make(stack, tmp_path, device_pages=8)
    content = ContentModel(cache)
    a = seq(0, 3, ps)
    # 1. cold: computed, its snapshot written to storage (the pages hold no data)
    first = serve(cache, tree, content, a)
    assert (first.device, first.host, first.storage) == (0, 0, 0)
    tree.drain_storage()
    assert tree.counters["storage_write_failed_pages"] == 0
    # 2. device and host forget it: the snapshot comes back from storage, checked byte for byte
    forget_all(tree)
    again = serve(cache, tree, content, a)
    assert again.prefetch.outcome is PrefetchOutcome.COMPLETE
    assert again.storage == 3 * ps
    tree.check_integrity()
    tree.close()


@pytest.mark.parametrize("layers", ["1", "2"])
def test_replay_dsv4_flash_with_one_or_two_layers_on_the_storage_tier(tmp_path, capsys, layers):
    argv = ["replay", "--model", "deepseek-v4-flash", "--layers", layers, "--max-requests", "12",
            "--no-progress", "--allow-device-only", "--hicache-storage-backend", "file", "--hicache-storage-dir", str(tmp_path)]
    assert main(argv) == 0
    assert "Traceback" not in capsys.readouterr().err


# ---- a prefix the host dropped while its storage write was still running ---------------------
class SlowWrites(FileBackend):
    """A FileBackend whose writes wait for a class-wide gate (a store with a backlog)."""

    gate = None

    def _set(self, keys, pages):
        assert type(self).gate.wait(120), "the test never opened the gate"
        return super()._set(keys, pages)


def test_a_prefix_dropped_while_its_write_runs_is_found_by_the_next_lookup(tmp_path):
    SlowWrites.gate = threading.Event()
    stack = mha(1, 1, 8, page_size=PS)
    cache, tree = make(stack, tmp_path, backend_cls=SlowWrites)
    content, a = ContentModel(cache), seq(0, 3, PS)
    try:
        serve(cache, tree, content, a)
        tree.poll()  # the write of a's pages is submitted; it waits at the gate
        tree.evict(1 << 30)
        tree.evict_host(1 << 30)  # the node leaves the tree; its host pages wait for the write
        assert not tree.root.children
        p = tree.prefetch(a)
        tree.poll()
        assert not p.done  # the lookup waits for the write of its keys
        SlowWrites.gate.set()
        assert tree.wait_prefetch(p).outcome is PrefetchOutcome.COMPLETE and p.result.read_tokens == 3 * PS
        got = serve(cache, tree, content, a)  # every byte of it checked on the device
        assert (got.device, got.host) == (0, 3 * PS)
        tree.check_integrity()
    finally:
        SlowWrites.gate.set()
        tree.close()
        cache.close()
