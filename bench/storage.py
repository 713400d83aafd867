"""Storage tier throughput: batch_set / batch_get of real page objects, per backend, against a raw baseline.

Question answered: how many GB/s and what p50/p99 latency does each storage backend give
for the page objects of real pools (every DeepSeek-V4 Flash pool, a llama-3.1-8b 64-token
page), and what fraction is that of moving the same bytes the plainest way on the same
machine in the same run (file: open/write/close and open/readinto/close per object;
Mooncake: ``batch_put_from`` / ``batch_get_into`` of one blob per object)?

    python bench/storage.py                       # file and (if installed) mooncake
    python bench/storage.py --backends file --pools llama:kv --layout layer_first

Files are written without fsync and read back from the page cache (the tier's default
path); every batch uses fresh keys, so each set really writes. Writes
``bench/results/local/storage_<device>.json`` (or ``--out``), and each backend's figures
(get / set per pool's batch, fitted as latency + bytes / GB/s) into the machine's device
profile, ``--profile-out`` (`bench.device_profile`; updated when it exists).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import device_profile, harness  # noqa: E402
from hicache.models import preset  # noqa: E402
from hicache.storage import FileBackend, StorageNamespace, page_hashes, page_view  # noqa: E402
from host_pools.pools import HostPool  # noqa: E402

STACKS = {"dsv4": lambda: preset("deepseek-v4-flash"), "llama": lambda: preset("llama-3.1-8b")}
DEFAULT_POOLS = ("dsv4:swa,dsv4:c4_kv,dsv4:c4_indexer,dsv4:c128_kv,dsv4:c4_state,"
                 "dsv4:c4_indexer_state,llama:kv")
BENCH_MODEL_ID = "hicache-bench/storage"  # the identity of the bench's random pages (no server model)
COLUMNS = ("backend", "pool", "KB", "op", "p50_ms", "p99_ms", "GBps", "raw_GBps", "frac_raw")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/storage.py", description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="file,mooncake", help="comma list of file, mooncake")
    p.add_argument("--pools", default=DEFAULT_POOLS, help="comma list of stack:pool (stacks: dsv4, llama)")
    p.add_argument("--batch-pages", type=int, default=8, help="objects per batch call")
    p.add_argument("--budget-mb", type=int, default=768, help="bytes moved per pool and op (sets the reps)")
    p.add_argument("--layout", default="page_first", choices=("page_first", "layer_first"))
    p.add_argument("--dir", type=Path, default=None, help="scratch directory of the file runs (default: a fresh folder under bench/results/local/, removed at the end)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--profile-out", type=Path, default=None,
                   help="device profile to write the stores' figures into (default "
                        "bench/results/local/profile_<device>.json)")
    args = p.parse_args(argv)
    args.backends = args.backends.split(",")
    args.pools = [tuple(x.split(":")) for x in args.pools.split(",")]
    for stack, pool in args.pools:
        if stack not in STACKS:
            p.error(f"--pools: unknown stack {stack!r}; allowed: {', '.join(STACKS)}")
    return args


def percentiles(samples: list[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(np.asarray(samples), [50, 99])
    return float(p50), float(p99)


def timed_pairs(ours: list[Callable[[], object]], raw: list[Callable[[], object]]) -> tuple[list[float], list[float]]:
    """ms per call of each of ``ours`` and ``raw``, interleaved call by call so that both see
    the same machine state (page cache, memory pressure, other tenants)."""
    out: tuple[list[float], list[float]] = ([], [])
    for pair in zip(ours, raw):
        for fn, samples in zip(pair, out):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return out


class Case:
    """One pool: a random host pool of ``reps x batch`` objects and their keys."""

    def __init__(self, stack_name: str, pool: str, batch: int, budget_mb: int, layout: str) -> None:
        stack = STACKS[stack_name]()
        self.name = f"{stack_name}:{pool}"
        self.ns = StorageNamespace.for_pool(stack, pool, model=BENCH_MODEL_ID, extra=f"bench {time.time()}")
        nbytes = self.ns.object_bytes
        self.batch = batch
        self.reps = max(10, min(50, budget_mb * 2 ** 20 // (batch * nbytes)))
        rows = self.ns.rows_per_object
        self.host = HostPool(stack.pool(pool), rows * batch * self.reps, layout=layout)
        self.host.buffer.copy_(torch.randint(0, 256, self.host.buffer.shape, dtype=torch.uint8))
        self.pages = [page_view(self.host, i * rows, rows) for i in range(batch * self.reps)]
        ids = torch.randint(0, 128000, (stack.page_size * len(self.pages),))
        self.keys = page_hashes(ids, stack.page_size)

    def batches(self) -> list[tuple[list[str], list[torch.Tensor]]]:
        b = self.batch
        return [(self.keys[i:i + b], self.pages[i:i + b]) for i in range(0, len(self.keys), b)]


def backend_calls(backend, case: Case) -> dict[str, list[Callable[[], None]]]:
    backend.register_buffer(case.host.buffer)
    batches = case.batches()
    return {"set": [lambda k=k, p=p: _expect(backend.batch_set(k, p), "set") for k, p in batches],
            "get": [lambda k=k, p=p: _expect(backend.batch_get(k, p), "get") for k, p in batches]}


def run(ours: dict, raw: dict) -> tuple[dict, dict]:
    """Every set (ours and raw interleaved), then every get."""
    times = {op: timed_pairs(ours[op], raw[op]) for op in ("set", "get")}
    return {op: t[0] for op, t in times.items()}, {op: t[1] for op, t in times.items()}


def _expect(ok: list[bool], what: str) -> None:
    if not all(ok):
        raise RuntimeError(f"{what}: {ok.count(False)} of {len(ok)} objects failed")


def raw_file(root: Path, case: Case) -> dict[str, list[Callable[[], None]]]:
    """Plain files, one per object: the same bytes with no header, checksum or rename."""
    os.makedirs(root, exist_ok=True)
    flats = [p.contiguous().view(-1).numpy() for p in case.pages]  # page_first: no copy
    names = [str(root / f"raw{i}") for i in range(len(flats))]
    b = case.batch

    def write(i: int) -> None:
        for j in range(i, i + b):
            with open(names[j], "wb") as f:
                f.write(flats[j])

    def read(i: int) -> None:
        for j in range(i, i + b):
            with open(names[j], "rb", buffering=0) as f:
                f.readinto(flats[j])
    starts = range(0, len(flats), b)
    return {"set": [lambda i=i: write(i) for i in starts], "get": [lambda i=i: read(i) for i in starts]}


def raw_mooncake(store, case: Case) -> dict[str, list[Callable[[], None]]]:
    """One blob per object through ``batch_put_from`` / ``batch_get_into`` (no header, no exists check)."""
    flats = [p.contiguous().view(-1) for p in case.pages]
    names = [f"raw-{case.ns.digest_hex[:16]}-{i}" for i in range(len(flats))]
    n, b = case.ns.object_bytes, case.batch

    def put(i: int) -> None:
        codes = store.batch_put_from(names[i:i + b], [f.data_ptr() for f in flats[i:i + b]], [n] * b)
        _expect([c == 0 for c in codes], "raw put")

    def get(i: int) -> None:
        got = store.batch_get_into(names[i:i + b], [f.data_ptr() for f in flats[i:i + b]], [n] * b)
        _expect([g == n for g in got], "raw get")
    starts = range(0, len(flats), b)
    return {"set": [lambda i=i: put(i) for i in starts], "get": [lambda i=i: get(i) for i in starts]}


def rows_for(backend: str, case: Case, ours: dict, raw: dict) -> list[dict]:
    out = []
    nbytes = case.batch * case.ns.object_bytes
    for op in ("set", "get"):
        p50, p99 = percentiles(ours[op])
        raw50, _ = percentiles(raw[op])
        gbps, raw_gbps = harness.gbps(nbytes, p50), harness.gbps(nbytes, raw50)
        out.append({"backend": backend, "pool": case.name, "KB": case.ns.object_bytes / 1024,
                    "batch_pages": case.batch, "reps": case.reps, "op": op, "p50_ms": p50, "p99_ms": p99,
                    "GBps": gbps, "raw_GBps": raw_gbps, "frac_raw": gbps / raw_gbps})
    return out


def bench_file(root: Path, case: Case) -> list[dict]:
    backend = FileBackend(case.ns, root / "store")
    ours, raw = run(backend_calls(backend, case), raw_file(root / "raw", case))
    backend.close()
    for made in ("store", "raw"):  # only what this case made: a --dir of the user's stays
        shutil.rmtree(root / made, ignore_errors=True)
    return rows_for("file", case, ours, raw)


def bench_mooncake(master_address: str, case: Case) -> list[dict]:
    from hicache.storage.mooncake_backend import MooncakeBackend
    # room for our objects and the raw blobs, well under the master's 90 % eviction watermark
    segment = int(2.5 * len(case.keys) * (case.ns.object_bytes + 64)) + (64 << 20)
    backend = MooncakeBackend(case.ns, master_address, segment)
    ours, raw = run(backend_calls(backend, case), raw_mooncake(backend.client.store, case))
    backend.client.store.remove_all(True)
    backend.close()  # the last reference: the client and its segment go, the next pool gets its own
    return rows_for("mooncake", case, ours, raw)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    harness.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    # scratch under the results folder, never the shared system temp folder; removed at the end
    root = args.dir or Path(tempfile.mkdtemp(prefix="storage-scratch-", dir=harness.RESULTS_DIR))
    rows = []
    with contextlib.ExitStack() as stack:
        if args.dir is None:
            stack.callback(shutil.rmtree, root, True)
        if "mooncake" in args.backends:
            from hicache.storage.mooncake_master import MooncakeMaster
            master = stack.enter_context(MooncakeMaster())
        for stack_name, pool in args.pools:  # one pool's host buffer at a time (memory)
            case = Case(stack_name, pool, args.batch_pages, args.budget_mb, args.layout)
            if "file" in args.backends:
                rows += bench_file(root, case)
            if "mooncake" in args.backends:
                rows += bench_mooncake(master.address, case)
            del case
    rows.sort(key=lambda r: (r["backend"], r["pool"], r["op"]))
    print(harness.format_table(rows, COLUMNS))
    device = torch.device("cpu")
    out = args.out or harness.RESULTS_DIR / f"storage_{harness.device_slug(device)}.json"
    config = {"batch_pages": args.batch_pages, "budget_mb": args.budget_mb, "layout": args.layout,
              "backends": args.backends, "machine": f"{os.cpu_count()}-core VM",
              "note": "files without fsync, read back from the page cache; p50/p99 over one sample "
                      "per batch call (10-50 calls); raw = the same bytes through the plainest calls, same run"}
    harness.write_json(out, rows, config, device)
    stores = fitted_stores(rows, args.backends)
    if not stores:
        print(f"wrote {out}; no device profile written (no backend's figures could be fitted)")
        return 0
    path = device_profile.profile_path(device, args.profile_out)
    profile = device_profile.update(path, "h100", device, storage=stores)
    print(f"wrote {out} and {profile}")
    return 0


def fitted_stores(rows: list[dict], backends: Sequence[str]) -> dict:
    """Each backend's `Store` fitted from its rows; one whose times did not grow with the
    bytes (a loaded machine's noise on small batches) is left out, with a line saying so."""
    stores = {}
    for b in backends:
        if not any(r["backend"] == b for r in rows):
            continue
        try:
            stores[b] = device_profile.fit_store(rows, b)
        except ValueError as e:
            print(f"device profile: {b} left out: {e}")
    return stores


if __name__ == "__main__":
    sys.exit(main())
