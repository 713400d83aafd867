"""The backlog a server's gate reads: bytes queued on the controller and on the storage I/O
pool (each until acked / finished), and the gate a tree builds from its config."""
from __future__ import annotations

import pytest

from hicache import HiCacheConfig, build
from hicache.cost import LiveBacklog, load_profile
from hicache.models import mha, preset
from hicache.radix import HiRadixCache
from hicache.storage import FileBackend, StorageIO, StorageNamespace
from tests.hicache.radix.test_cache import BIG
from tests.hicache.storage.conftest import keys_for, llama, pages_of, random_pool
from tests.hicache.storage.test_io_pool import GatedBackend

H100 = load_profile("h100")


def test_the_controller_counts_the_bytes_of_ops_not_acked_yet():
    stack = preset("llama-3.1-8b", 2)
    cache = build(stack, 1024, HiCacheConfig(hicache_ratio=2, io_backend="torch"), device="cpu", budget=BIG)
    ctrl, kv = cache.controller, cache.device_pools["kv"]
    assert ctrl.backlog_bytes("d2h") == ctrl.backlog_bytes("h2d") == 0
    ctrl.write(kv.alloc(128))  # two pages, queued
    per_token = 2 * 2 * 8 * 128 * 2  # layers x (k, v) x heads x dim x bf16
    assert ctrl.backlog_bytes("d2h") == 128 * per_token and ctrl.backlog_bytes("h2d") == 0
    backlog = LiveBacklog(ctrl, None, H100.h2d, None)
    assert backlog("h2d") == 0.0 == backlog("storage")
    ctrl.start_writing()
    ctrl.poll()  # CPU: the copy ran in start_writing; acked now
    assert ctrl.backlog_bytes("d2h") == 0
    cache.close()


def test_the_io_pool_counts_reads_and_writes_until_they_finish(tmp_path, gen):
    ns = StorageNamespace.for_pool(llama(1), "kv")
    backend = GatedBackend(ns, tmp_path)
    src = random_pool(llama(1), "kv", 4, gen)
    io = StorageIO(num_threads=1, chunk_pages=4)
    keys = keys_for(4, 64)
    pages = pages_of(src, ns, 4)
    io.backup(backend, keys, pages).result(10)
    assert io.backlog_bytes() == 0
    op = io.prefetch(backend, keys, pages)
    assert backend.entered.wait(120)  # the read is running, held at the gate
    assert io.backlog_bytes() == sum(p.numel() * p.element_size() for p in pages) > 0
    backend.gate.set()
    op.result(10)
    assert io.backlog_bytes() == 0
    io.close()
    backend.close()


@pytest.mark.parametrize("stack,policy,gated", [(preset("llama-3.1-8b", 2), "cost", True),
                                                (preset("llama-3.1-8b", 2), "always", False),
                                                (mha(2, 8, 128), "cost", False)])  # no preset: no shape
def test_a_tree_builds_the_gate_its_config_asks_for(stack, policy, gated):
    cache = build(stack, 1024, HiCacheConfig(hicache_ratio=2, io_backend="torch", load_policy=policy),
                  device="cpu", budget=BIG)
    tree = HiRadixCache(cache)
    assert (tree._cut is not None) == gated
    if gated:
        gate = tree._cut.gate
        assert gate.page == 64 and gate.cost.footprint.token_bytes == 32 * 2 * 8 * 128 * 2  # the whole model
        assert gate.backlog("h2d") == 0.0
    cache.close()
