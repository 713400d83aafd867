"""Faults of the storage tier seen from the tree: a prefetch racing host eviction, damaged
pages, other namespaces and salts, a full disk, a store unusable at start, a Mooncake
master killed mid-run. Each ends as a miss or a clean partial hit; serving goes on and
every byte used is checked."""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hicache import build
from hicache.models import mha
from hicache.radix import HiRadixCache
from hicache.radix.read import child_nodes
from hicache.radix.prefetch import PrefetchOutcome
from hicache.radix.store import open_store
from hicache.replay.content import ContentModel
from hicache.storage import StorageUnavailableError, file_backend
from tests.hicache.radix.test_cache import BIG, seq
from tests.hicache.radix.storage_env import (config, forget_all, make, poll_until_reading, serve, store_pages,
                                             stored)
from tests.hicache.storage.conftest import mooncake_or_skip


def test_prefetch_racing_host_eviction(tmp_path, gated):
    cache, tree, a = stored(tmp_path, 4, backend_cls=gated, hicache_ratio=1.0)
    b = seq(500, 4, 4)
    content = ContentModel(cache)
    # 1. B is cached on device and host; a prefetch of A holds 4 host slots mid-read
    serve(cache, tree, content, b)
    p = tree.prefetch(a)
    poll_until_reading(tree, gated)
    assert p.host_tokens == 16
    # 2. meanwhile the host is asked for everything: B goes, the prefetch's slots do not
    tree.evict(1 << 30)
    assert tree.evict_host(1 << 30) == 16
    tree.check_integrity()
    c = seq(900, 8, 4)
    serve(cache, tree, content, c)  # C's write-through wants the host too
    tree.check_integrity()
    # 3. the read finishes: A lands whole and byte-exact
    gated.gate.set()
    assert tree.wait_prefetch(p).outcome is PrefetchOutcome.COMPLETE
    got = serve(cache, tree, content, a)
    assert got.host == 16  # landed before this request matched
    tree.check_integrity()
    tree.close()


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_damaged_page_is_a_partial_hit_logged_once(tmp_path, caplog, damage):
    cache, tree, a = stored(tmp_path, 5)
    key = tree.storage.page_hashes(a, None)[2]
    path = Path(tree.storage.backends["kv"].path(key))
    raw = bytearray(path.read_bytes())
    if damage == "flipped":
        raw[-1] ^= 0x40  # one payload bit of page 2
    else:
        raw = raw[:len(raw) // 2]  # page 2 cut short (a torn copy from elsewhere)
    path.write_bytes(bytes(raw))
    got = serve(cache, tree, ContentModel(cache), a)
    assert got.prefetch.outcome is PrefetchOutcome.READ_FAILED
    assert (got.prefetch.read_tokens, got.storage) == (8, 8)  # pages 0-1: the leading run before it
    assert sum("refused" in r.getMessage() for r in caplog.records) == 1
    tree.check_integrity()
    tree.close()


@pytest.mark.parametrize("other", ["fp8", "rank", "salt"])
def test_another_namespace_or_salt_never_hits(tmp_path, other):
    stack = mha(1, 1, 8, page_size=4)
    a = seq(0, 3, 4)
    store_pages(tmp_path, stack, a)
    if other == "fp8":
        cache, tree = make(mha(1, 1, 8, page_size=4, kv_quant="fp8"), tmp_path)
    else:
        rank = dict(tp_rank=1, tp_size=2) if other == "rank" else {}
        cache = build(stack, 32, config(tmp_path, **rank), device="cpu", budget=BIG, backend="torch")
        store = open_store(cache) if other == "rank" else open_store(cache, cache_salt="t2")
        tree = HiRadixCache(cache, storage=store)
    got = serve(cache, tree, ContentModel(cache), a)
    assert got.prefetch.outcome is PrefetchOutcome.NOT_FOUND and got.storage == 0
    tree.close()


def test_disk_full_writes_fail_and_serving_goes_on(tmp_path, monkeypatch, caplog):
    stack = mha(1, 1, 8, page_size=4)
    cache, tree = make(stack, tmp_path)
    content = ContentModel(cache)

    def full(fd, buffers):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(file_backend.os, "writev", full)
    a = seq(0, 3, 4)
    serve(cache, tree, content, a)
    tree.drain_storage()
    assert tree.counters["storage_write_failed_pages"] == 3
    assert not any(n.stored for n in child_nodes(tree.root))
    assert sum("No space left" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.setattr(file_backend.os, "writev", os.writev)
    # nothing was stored, nothing is found; the tree still serves from device and host
    forget_all(tree)
    assert serve(cache, tree, content, a).prefetch.outcome is PrefetchOutcome.NOT_FOUND
    tree.drain_storage()  # (the recomputed pages are written now: space is back)
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]
    tree.check_integrity()
    tree.close()


def test_store_unusable_at_start_is_an_error_or_with_the_flag_no_tier(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    stack = mha(1, 1, 8, page_size=4)
    cfg = config(blocker / "store")
    cache = build(stack, 32, cfg, device="cpu", budget=BIG, backend="torch")
    with pytest.raises(StorageUnavailableError, match="--hicache-storage-dir.*--hicache-storage-optional"):
        HiRadixCache(cache)
    cache = build(stack, 32, dataclasses.replace(cfg, storage_optional=True), device="cpu", budget=BIG,
                  backend="torch")
    tree = HiRadixCache(cache)
    assert tree.storage is None and tree.prefetch(seq(0, 1, 4)) is None
    assert any("running without the storage tier" in r.getMessage() for r in caplog.records)


def test_mooncake_master_killed_mid_run_serving_goes_on():
    # a real master in a child process: one storage hit, then the master dies; the next
    # requests are served from device and host (bytes checked), each at once, logged once
    mooncake_or_skip()
    child = Path(__file__).with_name("mooncake_tree_child.py")
    run = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["before"] == 16
    assert [tokens for tokens, _ in report["after"]] == [0] * 5  # the storage hit rate drops to 0
    assert all(seconds < 10 for _, seconds in report["after"])  # no hang
    assert len(report["warnings"]) == 1 and "unreachable" in report["warnings"][0]
    assert report["stats"]["errors"] > 0
