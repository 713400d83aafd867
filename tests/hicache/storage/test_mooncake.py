"""MooncakeBackend beyond the shared contract: another process reads what this one wrote,
host buffers registered once, keys carry the namespace."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from hicache.storage import StorageNamespace
from tests.hicache.storage.conftest import keys_for, llama, pages_of, random_pool


def test_a_second_process_reads_the_pages(mooncake_master, mooncake_anchor, gen):
    # 1. this process backs up four pages (they live in its contributed segment)
    extra = "cross-process"
    ns = StorageNamespace.for_pool(llama(1), "kv", extra=extra)
    from hicache.storage.mooncake_backend import MooncakeBackend
    backend = MooncakeBackend(ns, mooncake_master.address, 0)
    src = random_pool(llama(1), "kv", 4, gen)
    backend.register_buffer(src.buffer)
    assert backend.batch_set(keys_for(4, 64, start=0), pages_of(src, ns, 4)) == [True] * 4
    # 2. another process, its own client contributing nothing, reads them byte for byte
    child = Path(__file__).with_name("mooncake_child.py")
    run = subprocess.run([sys.executable, str(child), "read", mooncake_master.address, extra],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    want = [hashlib.sha256(p.numpy().tobytes()).hexdigest() for p in pages_of(src, ns, 4)]
    assert report == {"ok": [True] * 4, "sha256": want, "exists": 4}
    backend.close()


def test_buffers_register_once_and_keys_carry_the_namespace(mooncake, gen):
    ns = StorageNamespace.for_pool(llama(1), "kv")
    backend = mooncake(ns)
    pool = random_pool(llama(1), "kv", 2, gen)
    backend.register_buffer(pool.buffer)
    backend.register_buffer(pool.buffer)  # idempotent
    assert backend.client._registered[pool.buffer.data_ptr()] == (pool.buffer.numel(), 2)
    key = keys_for(1, 64)[0]
    name = backend.namespace.object_key(key)
    assert name.startswith(backend.namespace.digest_hex[:32] + "_") and name.endswith(key)
    assert backend.batch_set([key], pages_of(pool, ns, 1)) == [True]
    assert backend.client.store.get_size(name) == 64 + ns.object_bytes
    backend.close()  # registrations are undone with the backend
    assert pool.buffer.data_ptr() not in backend.client._registered
