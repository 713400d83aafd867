"""FileBackend: survives restarts, LRU eviction under a capacity (also across restarts),
no temporary files left behind, one index per directory shared by the pools' backends."""
from __future__ import annotations

import fcntl
import os

import pytest
import torch

from hicache.storage import FileBackend, StorageNamespace
from hicache.storage.file_index import close_index, open_index
from hicache.storage.file_ledger import STALE_TMP_S
from tests.hicache.storage.conftest import dsv4, keys_for, llama, pages_of, random_pool


def _files(root, suffix):
    return sorted(f for _, _, fs in os.walk(root) for f in fs if f.endswith(suffix))


def test_pages_survive_a_restart(tmp_path, gen):
    ns = StorageNamespace.for_pool(dsv4(), "c4_kv")
    src = random_pool(dsv4(), "c4_kv", 4, gen)
    keys = keys_for(4, 256)
    # 1. a first process backs up four pages and exits
    with FileBackend(ns, tmp_path) as first:
        assert first.batch_set(keys, pages_of(src, ns, 4)) == [True] * 4
    # 2. a second process, same directory: every page is a verified hit
    with FileBackend(ns, tmp_path) as second:
        assert second.batch_exists(keys) == 4
        out = random_pool(dsv4(), "c4_kv", 4, gen, layout="layer_first")
        assert second.batch_get(keys, pages_of(out, ns, 4)) == [True] * 4
        assert torch.equal(out.buffer.transpose(0, 1), src.buffer)
    assert _files(tmp_path, ".tmp") == []
    assert (tmp_path / ns.digest_hex[:32] / "namespace.json").is_file()


def test_capacity_evicts_least_recently_read_first(tmp_path, gen):
    ns = StorageNamespace.for_pool(llama(1), "kv")
    obj = 64 + ns.object_bytes
    src = random_pool(llama(1), "kv", 5, gen)
    keys = keys_for(5, 64)
    with FileBackend(ns, tmp_path, capacity_bytes=3 * obj) as b:
        # 1. three objects fill the capacity
        assert b.batch_set(keys[:3], pages_of(src, ns, 3)) == [True] * 3
        # 2. reading object 0 makes object 1 the least recently used
        assert b.batch_get(keys[:1], pages_of(random_pool(llama(1), "kv", 1, gen), ns, 1)) == [True]
        # 3. a fourth object evicts object 1 only
        assert b.batch_set(keys[3:4], pages_of(src, ns, 1, first=3)) == [True]
        assert [b.batch_exists([k]) for k in keys[:4]] == [1, 0, 1, 1]
        assert b.stats().evictions == 1
        # 4. a namespace whose object does not fit beside one of every other is refused at
        #    open, naming the flag and the smallest useful capacity; nothing is evicted for it
        with pytest.raises(ValueError, match=r"--hicache-storage-capacity.*smallest useful capacity is "
                                             r"--hicache-storage-capacity 0\.0"):
            FileBackend(StorageNamespace.for_pool(llama(4), "kv"), tmp_path)
        assert b.batch_exists(keys[2:4]) == 2 and len(b._index) == 3


def test_lru_order_survives_a_restart(tmp_path, gen):
    ns = StorageNamespace.for_pool(llama(1), "kv")
    obj = 64 + ns.object_bytes
    src = random_pool(llama(1), "kv", 4, gen)
    keys = keys_for(4, 64)
    with FileBackend(ns, tmp_path) as b:
        assert b.batch_set(keys[:3], pages_of(src, ns, 3)) == [True] * 3
    # access times via mtime: object 0 read last -> object 1 is the oldest
    for i, t in enumerate([1000, 900, 950]):
        os.utime(FileBackend.path(b, keys[i]), (t, t))
    with FileBackend(ns, tmp_path, capacity_bytes=3 * obj) as b:
        assert b.batch_set(keys[3:], pages_of(src, ns, 1, first=3)) == [True]
        assert [b.batch_exists([k]) for k in keys] == [1, 0, 1, 1]


def test_pools_share_one_index_per_directory(tmp_path, gen):
    stack = dsv4()
    a = FileBackend(StorageNamespace.for_pool(stack, "c4_kv"), tmp_path, capacity_bytes=10 ** 9)
    b = FileBackend(StorageNamespace.for_pool(stack, "c128_kv"), tmp_path)
    assert a._index is b._index and a._index.capacity_bytes == 10 ** 9
    keys = keys_for(2, 256)
    for backend in (a, b):
        pool = random_pool(stack, backend.namespace.pool, 2, gen)
        assert backend.batch_set(keys, pages_of(pool, backend.namespace, 2)) == [True, True]
    assert len(a._index) == 4
    a.close()
    b.close()
    index = open_index(tmp_path, 0)  # a fresh scan finds all four objects
    assert len(index) == 4 and index.total_bytes == sum(os.path.getsize(p) for p in index._lru)
    close_index(index)


def test_temporaries_of_dead_writers_and_stale_ones_are_removed_at_open(tmp_path, gen):
    ns = StorageNamespace.for_pool(llama(1), "kv")
    with FileBackend(ns, tmp_path):
        pass
    sub = tmp_path / ns.digest_hex[:32] / "ab"
    sub.mkdir()
    key = "ab" + "0" * 62
    dead, live = sub / f".{key}.page.{'1' * 16}.tmp", sub / f".{key}.page.{'2' * 16}.tmp"
    old_version = sub / f".{key}.123.456.tmp"  # an older version's temporary name (no writer to ask)
    marker = tmp_path / ns.digest_hex[:32] / f".namespace.json.{'3' * 16}.tmp"  # fresh: kept
    for path in (dead, live, old_version, marker):
        path.write_bytes(b"torn")
    old = os.path.getmtime(dead) - STALE_TMP_S - 1
    for path in (live, old_version):
        os.utime(path, (old, old))
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a writer still at work, however old its file
    try:
        with FileBackend(ns, tmp_path) as b:
            assert not dead.exists() and not old_version.exists() and live.exists() and marker.exists()
            assert b._index.total_bytes == 4  # the live write counts
    finally:
        os.close(fd)


def test_fsync_option_writes_the_same_bytes(tmp_path, gen):
    ns = StorageNamespace.for_pool(llama(1), "kv")
    src = random_pool(llama(1), "kv", 1, gen)
    with FileBackend(ns, tmp_path, fsync=True) as b:
        assert b.batch_set(keys_for(1, 64), pages_of(src, ns, 1)) == [True]
        out = random_pool(llama(1), "kv", 1, gen)
        assert b.batch_get(keys_for(1, 64), pages_of(out, ns, 1)) == [True]
        assert torch.equal(out.buffer, src.buffer)
