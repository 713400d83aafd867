"""Child processes of the Mooncake tests (a second process on the store, or one that loses it).

    python mooncake_child.py kill               a backend loses its own master mid-run
    python mooncake_child.py read MASTER EXTRA  read llama-3.1-8b (1 layer) pages 0..3 written by
                                                the parent under namespace ``extra=EXTRA``
    python mooncake_child.py full               back up more than the store holds (no eviction)

Each prints one JSON line and leaves with ``os._exit`` (Mooncake's destructor retries a dead
master for ~10 s and takes ~2 s on a live one; neither is under test here).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402

from hicache.storage import StorageNamespace, page_hashes, page_view  # noqa: E402
from hicache.storage.mooncake_backend import MooncakeBackend  # noqa: E402
from hicache.storage.mooncake_master import MooncakeMaster  # noqa: E402
from hicache.models import preset  # noqa: E402
from host_pools.pools import HostPool  # noqa: E402


class Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def timed(fn, *args):
    t0 = time.monotonic()
    out = fn(*args)
    return out, round(time.monotonic() - t0, 3)


def read(master: str, extra: str) -> None:
    stack = preset("llama-3.1-8b", 1)
    ns = StorageNamespace.for_pool(stack, "kv", extra=extra)
    backend = MooncakeBackend(ns, master, 0)  # contributes no memory: reads the parent's segment
    pool = HostPool(stack.pool("kv"), 4)
    backend.register_buffer(pool.buffer)
    keys = page_hashes(torch.arange(4 * 64), 64)
    ok = backend.batch_get(keys, [page_view(pool, i, 1) for i in range(4)])
    digests = [hashlib.sha256(page_view(pool, i, 1).numpy().tobytes()).hexdigest() for i in range(4)]
    print(json.dumps({"ok": ok, "sha256": digests, "exists": backend.batch_exists(keys)}), flush=True)
    os._exit(0)


def full() -> None:
    warnings = Count()
    logging.getLogger("hicache.storage").addHandler(warnings)
    stack = preset("llama-3.1-8b", 1)  # 256 KiB objects; 100 of them into a 16 MiB segment
    ns = StorageNamespace.for_pool(stack, "kv")
    src, out = HostPool(stack.pool("kv"), 100), HostPool(stack.pool("kv"), 100)
    src.buffer.copy_(torch.randint(0, 256, src.buffer.shape, dtype=torch.uint8))
    keys = page_hashes(torch.arange(100 * 64), 64)
    master = MooncakeMaster(extra_args=("--eviction_high_watermark_ratio=1.0",)).start()
    backend = MooncakeBackend(ns, master.address, 16 << 20)
    stored = backend.batch_set(keys, [page_view(src, i, 1) for i in range(100)])
    got = backend.batch_get(keys, [page_view(out, i, 1) for i in range(100)])
    exact = all(torch.equal(page_view(out, i, 1), page_view(src, i, 1)) for i in range(100) if got[i])
    print(json.dumps({"stored": stored, "got": got, "exact": exact, "exists": backend.batch_exists(keys),
                      "stats": backend.stats().as_dict(), "warnings": warnings.messages}), flush=True)
    master.stop()
    os._exit(0)


def kill() -> None:
    warnings = Count()
    logging.getLogger("hicache.storage").addHandler(warnings)
    stack = preset("llama-3.1-8b", 1)
    ns = StorageNamespace.for_pool(stack, "kv")
    pool = HostPool(stack.pool("kv"), 8)
    pool.buffer.copy_(torch.randint(0, 256, pool.buffer.shape, dtype=torch.uint8))
    keys = page_hashes(torch.arange(8 * 64), 64)
    pages = [page_view(pool, i, 1) for i in range(8)]
    master = MooncakeMaster().start()
    backend = MooncakeBackend(ns, master.address, 64 << 20, retry_s=2.0, connect_timeout_s=0.5)
    report = {"before": backend.batch_set(keys[:4], pages[:4]) + backend.batch_get(keys[:4], pages[4:])}
    master.kill()
    calls = []
    for _ in range(3):  # every call after the kill: misses and failures, never a hang
        calls.append(("exists",) + timed(backend.batch_exists, keys[:4]))
        calls.append(("get",) + timed(backend.batch_get, keys[:4], pages[4:]))
        calls.append(("set",) + timed(backend.batch_set, keys[4:], pages[4:]))
    time.sleep(2.1)  # past retry_s: one probe, still down
    calls.append(("get-after-retry",) + timed(backend.batch_get, keys[:4], pages[4:]))
    report.update(calls=calls, stats=backend.stats().as_dict(), warnings=warnings.messages)
    print(json.dumps(report), flush=True)
    master.stop()
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    full() if sys.argv[1] == "full" else kill()
