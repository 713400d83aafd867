"""Faults, each a scenario: store unreachable at start and mid-run, truncated and corrupted
objects, a full disk, objects of another namespace. Every one is a miss or a failed write,
counted and logged once; none raises into the caller, hangs, or hands out wrong bytes."""
from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hicache.config import HiCacheConfig
from hicache.storage import FileBackend, PageCheck, StorageNamespace, StorageUnavailableError, make_storage
from hicache.storage import file_backend
from hicache.storage.page import HEADER_BYTES, encode_header
from tests.hicache.storage.conftest import keys_for, llama, mooncake_or_skip, pages_of, random_pool

NS = StorageNamespace.for_pool(llama(1), "kv")


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "hicache.storage"]


# ---- unreachable at start ----------------------------------------------------------------
def test_file_store_unusable_at_start(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file where the directory should be")
    config = HiCacheConfig(storage_backend="file", storage_dir=str(blocker / "store"), storage_model_id=NS.model)
    with pytest.raises(StorageUnavailableError, match="--hicache-storage-dir.*--hicache-storage-optional"):
        make_storage(config, NS)
    # with the flag the server starts without the tier and says so
    assert make_storage(dataclasses.replace(config, storage_optional=True), NS) is None
    assert any("running without the storage tier" in m for m in _warnings(caplog))


def test_mooncake_master_unreachable_at_start(caplog):
    mooncake_or_skip()
    from hicache.storage.mooncake_master import free_port
    config = HiCacheConfig(storage_backend="mooncake", storage_master=f"127.0.0.1:{free_port()}",
                           storage_capacity_gb=0.1, storage_model_id=NS.model)
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailableError, match="no mooncake_master.*--hicache-storage-master"):
        make_storage(config, NS)
    assert make_storage(dataclasses.replace(config, storage_optional=True), NS) is None
    assert time.monotonic() - t0 < 10  # a TCP probe, not Mooncake's 90 s of set-up retries


# ---- unreachable mid-run -----------------------------------------------------------------
def test_file_store_vanishes_mid_run(tmp_path, gen, caplog):
    src = random_pool(llama(1), "kv", 2, gen)
    keys = keys_for(2, 64)
    b = FileBackend(NS, tmp_path / "store")
    assert b.batch_set(keys[:1], pages_of(src, NS, 1)) == [True]
    # the directory disappears (an unmounted share) and a file takes its place
    shutil.rmtree(tmp_path / "store")
    (tmp_path / "store").write_text("gone")
    assert b.batch_exists(keys) == 0
    assert b.batch_get(keys, pages_of(src, NS, 2)) == [False, False]
    assert b.batch_set(keys, pages_of(src, NS, 2)) == [False, False]
    assert b.batch_set(keys, pages_of(src, NS, 2)) == [False, False]
    assert b.stats().errors >= 2
    assert len([m for m in _warnings(caplog) if "set failed" in m]) == 1  # logged once
    b.close()


def _child(mode: str) -> dict:
    mooncake_or_skip()
    child = Path(__file__).with_name("mooncake_child.py")
    run = subprocess.run([sys.executable, str(child), mode], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_mooncake_master_killed_mid_run():
    report = _child("kill")
    assert report["before"] == [True] * 8
    for name, result, seconds in report["calls"]:
        assert result in (0, [False] * 4), (name, result)
        assert seconds < 10, (name, seconds)  # bounded by one Mooncake RPC timeout at worst
    assert sum(s for _, _, s in report["calls"][1:]) < 2  # after the first failure: at once
    assert len(report["warnings"]) == 1 and "unreachable" in report["warnings"][0]
    assert report["stats"]["errors"] > 0


# ---- corrupt objects ---------------------------------------------------------------------
def _stored(tmp_path, gen, n=2):
    b = FileBackend(NS, tmp_path)
    src = random_pool(llama(1), "kv", n, gen)
    keys = keys_for(n, 64)
    assert b.batch_set(keys, pages_of(src, NS, n)) == [True] * n
    return b, src, keys


@pytest.mark.parametrize("damage", ["truncate_payload", "truncate_header", "flip_payload", "flip_header", "append"])
def test_damaged_page_file_is_a_logged_miss(tmp_path, gen, caplog, damage):
    b, src, keys = _stored(tmp_path, gen)
    for k in keys:
        path = b.path(k)
        data = bytearray(Path(path).read_bytes())
        if damage == "truncate_payload":
            data = data[:HEADER_BYTES + 1000]
        elif damage == "truncate_header":
            data = data[:30]
        elif damage == "flip_payload":
            data[HEADER_BYTES + 12345] ^= 0x10
        elif damage == "flip_header":
            data[0] ^= 0xFF
        else:
            data += b"trailing garbage"
        Path(path).write_bytes(bytes(data))
    out = random_pool(llama(1), "kv", 2, gen)
    assert b.batch_get(keys, pages_of(out, NS, 2)) == [False, False]
    assert b.stats().corrupt == 2 and b.stats().hits == 0
    assert len([m for m in _warnings(caplog) if "refused" in m]) == 1  # two refusals, one warning
    # the refused files are gone, so the next backup rewrites them and reads work again
    assert b.batch_exists(keys) == 0
    assert b.batch_set(keys, pages_of(src, NS, 2)) == [True, True]
    assert b.batch_get(keys, pages_of(out, NS, 2)) == [True, True]
    assert torch.equal(out.buffer, src.buffer)
    b.close()


def test_object_of_another_namespace_is_refused(tmp_path, gen, caplog):
    fp8 = StorageNamespace.for_pool(llama(1, "-fp8"), "kv")
    a, _, keys = _stored(tmp_path, gen, n=1)
    b = FileBackend(dataclasses.replace(NS, tp_rank=1, tp_size=2), tmp_path)
    os.makedirs(os.path.dirname(b.path(keys[0])), exist_ok=True)
    shutil.copy(a.path(keys[0]), b.path(keys[0]))  # misfiled: rank 0's bytes under rank 1
    out = random_pool(llama(1), "kv", 1, gen)
    assert b.batch_exists(keys) == 1  # present ...
    assert b.batch_get(keys, pages_of(out, b.namespace, 1)) == [False]  # ... but never loaded
    assert "namespace digest differs" in " ".join(_warnings(caplog))
    assert fp8.object_bytes != NS.object_bytes  # (and an fp8 reader could not even take the size)
    a.close()
    b.close()


# ---- full disk ---------------------------------------------------------------------------
def test_disk_full_write_leaves_nothing_behind(tmp_path, gen, caplog, monkeypatch):
    b = FileBackend(NS, tmp_path)
    src = random_pool(llama(1), "kv", 3, gen)
    keys = keys_for(3, 64)
    real_writev = os.writev
    calls = {"n": 0}

    def writev_enospc(fd, buffers):
        calls["n"] += 1
        if calls["n"] >= 2:  # the second object runs out of space after a partial write
            real_writev(fd, [memoryview(buffers[0])[:10]])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_writev(fd, buffers)
    monkeypatch.setattr(file_backend.os, "writev", writev_enospc)
    assert b.batch_set(keys, pages_of(src, NS, 3)) == [True, False, False]
    monkeypatch.setattr(file_backend.os, "writev", real_writev)
    # no torn object, no temporary file, and the index forgot the failed ones
    assert b.batch_exists(keys) == 1
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]
    assert len(b._index) == 1 and b.stats().errors == 2
    assert b._index.total_bytes == os.path.getsize(b.path(keys[0]))  # their reservations given back
    assert len([m for m in _warnings(caplog) if "No space left" in m]) == 1
    # space is back: the same pages back up and read back exactly
    assert b.batch_set(keys, pages_of(src, NS, 3)) == [True] * 3
    out = random_pool(llama(1), "kv", 3, gen)
    assert b.batch_get(keys, pages_of(out, NS, 3)) == [True] * 3 and torch.equal(out.buffer, src.buffer)
    b.close()


def test_mooncake_store_full_fails_the_writes_that_do_not_fit():
    report = _child("full")  # 100 objects of 256 KiB offered to a 16 MiB store that never evicts
    n = report["stored"].index(False)
    assert 0 < n < 100 and report["stored"] == [True] * n + [False] * (100 - n)
    assert report["got"] == report["stored"] and report["exact"] and report["exists"] == n
    assert report["stats"]["errors"] == 100 - n and report["stats"]["objects_written"] == n
    assert len(report["warnings"]) == 1 and "store is full" in report["warnings"][0]


# ---- Mooncake: corrupt and foreign objects -----------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "flipped", "foreign"])
def test_mooncake_damaged_object_is_a_logged_miss(mooncake, gen, caplog, damage):
    b = mooncake(NS)
    src = random_pool(llama(1), "kv", 1, gen)
    key = keys_for(1, 64, salt=damage)[0]
    payload = src.buffer.view(-1).clone()
    ns = dataclasses.replace(b.namespace, tp_rank=1, tp_size=2) if damage == "foreign" else b.namespace
    blob = bytearray(encode_header(ns, key, payload) + payload.numpy().tobytes())
    if damage == "truncated":
        blob = blob[:HEADER_BYTES + 100]
    elif damage == "flipped":
        blob[HEADER_BYTES + 7] ^= 0x01
    assert b.client.store.put(b.namespace.object_key(key), bytes(blob)) == 0
    out = random_pool(llama(1), "kv", 1, gen)
    assert b.batch_get([key], pages_of(out, NS, 1)) == [False]
    assert b.stats().corrupt == 1
    want = {"truncated": PageCheck.TRUNCATED, "flipped": PageCheck.BAD_CHECKSUM,
            "foreign": PageCheck.WRONG_NAMESPACE}[damage]
    assert want.value in " ".join(_warnings(caplog))


# ---- configuration -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, flag", [
    ({"storage_backend": "file", "storage_model_id": "m"}, "--hicache-storage-dir"),
    ({"storage_backend": "file", "storage_dir": "/tmp/x"}, "--hicache-storage-model-id"),
    ({"storage_backend": "mooncake", "storage_master": "localhost"}, "--hicache-storage-master"),
    ({"storage_backend": "mooncake", "storage_master": "127.0.0.1:99999"}, "--hicache-storage-master"),
])
def test_storage_flags_that_need_each_other(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        HiCacheConfig(**kwargs)


def test_make_storage_opens_the_configured_backend(tmp_path, mooncake_master, mooncake_anchor):
    assert make_storage(HiCacheConfig(), NS) is None  # --hicache-storage-backend none
    file = HiCacheConfig(storage_backend="file", storage_dir=str(tmp_path), storage_capacity_gb=1, storage_model_id=NS.model)
    with make_storage(file, NS) as f:
        assert isinstance(f, FileBackend) and f._index.capacity_bytes == 10 ** 9
    config = HiCacheConfig(storage_backend="mooncake", storage_master=mooncake_master.address, storage_model_id=NS.model)
    with make_storage(config, NS) as m:
        assert m.kind == "mooncake" and m.client is mooncake_anchor.client
