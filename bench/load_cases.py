"""One model's cache as a server holds it, and the timing of one load or backup batch.

`LoadBench` builds the cache with ``hicache.build`` (production pinned host pools on CUDA),
fills the host pools with random bytes, declares most host pages loadable
(``mark_host_written``) and keeps the rest free for backups. Batches take random host pages
in random order (scattered, as a server's prefixes are) into device pages handed out in
random order. Times are microseconds:

    host_us     perf_counter from the first load()/write() to the return of start_*()
    e2e_us      from the first load()/write() until the batch's last copy has ended (on
                CUDA: an event after the last copy, synchronized on the host clock)
    layer0_us   (loads) from the first load() until layer 0 may be read
    gpu_us      a gated run: the GPU held by a sleep while the host enqueues, then
                from the gate's end to the last copy (the GPU's time alone)
    gpu_layer0_us  the same, to the end of the launch group holding layer 0

On CPU everything runs synchronously inside start_*(): e2e_us == host_us, no GPU times.
"""
from __future__ import annotations

import argparse
import time
from typing import Any, NamedTuple

import numpy as np
import torch

from hicache import HiCacheConfig, build
from hicache.models import preset
from host_pools.memory import HostBudget
from transfer_kernels import AutoBackend, CopyEngineBackend, NullBackend, StagedBackend, TorchBackend, TritonBackend

BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)
FILL_BYTES = 32 << 20  # random block tiled over the host pools


class Batch(NamedTuple):
    """What one batch moved and how long it took (see the module docstring)."""

    bytes_by_pool: dict[str, int]
    times: dict[str, float]
    groups: list[tuple[int, int, float]]  # gated loads: (first layer, end layer, ms from start)


def host_dtype_error(host_dtype: str, models: list[tuple[str, int | None]], calibrate: bool) -> str | None:
    """Why ``--hicache-host-dtype`` cannot run these models (or ``--calibrate``), else ``None``."""
    if host_dtype == "auto":
        return None
    if calibrate:
        return "--calibrate: measures exact copies (auto's table); drop --hicache-host-dtype"
    from hicache.host_dtype import resolve_host_stack
    for model, layers in models:
        try:
            resolve_host_stack(preset(model, layers), HiCacheConfig(host_dtype=host_dtype))
        except ValueError as e:
            return f"--models: {e}"
    return None


def _cuda(device: torch.device) -> bool:
    return device.type == "cuda"


class LoadBench:
    """A cache of ``model`` with ``host_pages`` loadable anchor pages (see module docstring)."""

    def __init__(self, model: str, layers: int | None, layout: str, host_pages: int,
                 max_batch_pages: int, max_ops: int, device: torch.device, backend: Any,
                 seed: int = 0, host_dtype: str = "auto") -> None:
        self.stack = stack = preset(model, layers)
        self.device, self.rng = device, np.random.default_rng(seed)
        device_pages = 4 * max_batch_pages
        tokens = device_pages * stack.page_size
        swa_rows = 4 * max_ops  # device SWA rows: 4 batches of max_ops states
        config = HiCacheConfig(mem_layout=layout, hicache_ratio=max(1.0, host_pages / device_pages),
                               swa_full_tokens_ratio=min(1.0, swa_rows * 128 / tokens), host_dtype=host_dtype)
        self.cache = build(stack, tokens, config, device=device, budget=BIG, backend=backend)
        self.ctrl = self.cache.controller
        self.anchor = stack.anchor.name
        self.has_swa = "swa" in self.cache.device_pools
        self._fill_host()
        self._loadable = self._declare_loadable(0.6)  # the rest: backups' destinations
        self._shuffle_device()
        self.gate_cycles = 10_000_000  # ~5 ms; doubled when the GPU started before the host was done
        self._marks: list | None = None

    # ---- set-up ---------------------------------------------------------------------
    def _fill_host(self) -> None:
        block = torch.randint(0, 256, (FILL_BYTES,), dtype=torch.uint8,
                              generator=torch.Generator().manual_seed(1))
        for pool in self.cache.host_group.pools.values():
            if pool.buffer is None:
                continue
            flat = pool.buffer.view(-1)
            for at in range(0, flat.numel(), FILL_BYTES):
                n = min(FILL_BYTES, flat.numel() - at)
                flat[at:at + n] = block[:n]

    def _declare_loadable(self, share: float) -> dict[str, np.ndarray]:
        """Allocate ``share`` of every own-indexed host pool's pages and mark them written."""
        pages = {}
        for name in self.stack.own_names:
            pool = self.cache.host_group.pools[name]
            ps = pool.allocator.page_size
            count = int(pool.available() // ps * share)
            slots = pool.alloc(count * ps)
            pages[name] = slots.numpy().reshape(-1, ps)
        self.ctrl.mark_host_written(torch.from_numpy(pages[self.anchor].reshape(-1)),
                                    {n: torch.from_numpy(p.reshape(-1)) for n, p in pages.items()
                                     if n != self.anchor} or None)
        return pages

    def _shuffle_device(self) -> None:
        """Free every device page in random order: later allocations come out scattered."""
        for name in self.stack.own_names:
            pool = self.cache.device_pools[name]
            ps = pool.allocator.page_size
            slots = pool.alloc(pool.available()).numpy().reshape(-1, ps)
            for page in slots[self.rng.permutation(len(slots))]:
                pool.free(torch.from_numpy(page.copy()))

    # ---- batches --------------------------------------------------------------------
    def _pick(self, name: str, count: int) -> torch.Tensor:
        rows = self._loadable[name]
        return torch.from_numpy(rows[self.rng.choice(len(rows), count, replace=False)].reshape(-1))

    def load_args(self, pages: int, ops: int) -> list[tuple[torch.Tensor, dict | None]]:
        """``ops`` loads of ``pages // ops`` random host pages each (+ one SWA state each)."""
        per = pages // ops
        return [(self._pick(self.anchor, per), {"swa": self._pick("swa", 1)} if self.has_swa else None)
                for _ in range(ops)]

    def backup_args(self, pages: int, ops: int) -> list[tuple[torch.Tensor, dict | None]]:
        """``ops`` backups of ``pages // ops`` device pages each (+ one SWA state each)."""
        pools = self.cache.device_pools
        out = []
        for _ in range(ops):
            kv = pools[self.anchor].alloc(pages // ops * self.stack.page_size)
            swa = pools["swa"].alloc(128) if self.has_swa else None
            assert kv is not None and (swa is not None or not self.has_swa), "device pools too small"
            out.append((kv, {"swa": swa} if swa is not None else None))
        return out

    def run(self, direction: str, args: list, trusted: bool, gated: bool) -> Batch:
        """One batch (``args`` from ``load_args``/``backup_args``); frees what it took."""
        ctrl, cuda = self.ctrl, _cuda(self.device)
        if cuda:
            torch.cuda.synchronize()
        start = self._gate() if gated else None
        t0 = time.perf_counter()
        call = ctrl.load if direction == "h2d" else ctrl.write
        got = [call(a, e, trusted=trusted) for a, e in args]
        t1 = time.perf_counter()
        k = ctrl.start_loading() if direction == "h2d" else ctrl.start_writing()
        t2 = time.perf_counter()
        end = self._end_event(direction, k) if cuda else None
        times = {"queue_us": (t1 - t0) * 1e6, "start_us": (t2 - t1) * 1e6, "host_us": (t2 - t0) * 1e6}
        late = start is not None and start.query()  # the GPU did not wait for the host
        if late:
            self.gate_cycles *= 2  # a longer gate for the next batches
        if cuda:  # to the last copy's completion
            times.update(self._wait(direction, k, end, t0, start))
        else:  # the copies ran inside start_*()
            times["e2e_us"] = times["host_us"]
        if late:  # this sample's GPU span includes host time: not reported
            times = {k: v for k, v in times.items() if not k.startswith("gpu")}
        acks = ctrl.poll()
        assert len(acks) == len(args) and all(a.success for a in acks), acks
        groups = self._group_times(start)
        self._release(direction, args, got)
        nbytes: dict[str, int] = {}
        for ack in acks:
            for name, n in ack.bytes.items():
                nbytes[name] = nbytes.get(name, 0) + n
        return Batch(nbytes, times, groups)

    def capacity(self, pages: int, ops: int) -> int:
        """Batches of (pages, ops) the device pools hold at once (steady-state runs)."""
        pools = self.cache.device_pools
        fit = pools[self.anchor].available() // (pages * self.stack.page_size)
        if self.has_swa:
            fit = min(fit, pools["swa"].available() // (128 * ops))
        return int(fit)

    def run_many(self, direction: str, count: int, pages: int, ops: int, trusted: bool = True,
                 idle_first: bool = True) -> tuple[int, float]:
        """``count`` batches back to back, no sync between: (bytes, wall us until the last
        copy ended). ``idle_first=False``: start while the GPU runs other work (the copy
        stream alone is waited for at the end, not the device)."""
        make = self.load_args if direction == "h2d" else self.backup_args
        batches = [make(pages, ops) for _ in range(count)]
        call = self.ctrl.load if direction == "h2d" else self.ctrl.write
        start = self.ctrl.start_loading if direction == "h2d" else self.ctrl.start_writing
        cuda = _cuda(self.device)
        if cuda and idle_first:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        got = []
        for args in batches:
            got.append([call(a, e, trusted=trusted) for a, e in args])
            start()
        if cuda:
            (self.ctrl.load_stream if direction == "h2d" else self.ctrl.write_stream).synchronize()
        elapsed = (time.perf_counter() - t0) * 1e6
        acks = self.ctrl.poll()
        assert all(a.success for a in acks), acks
        for args, dst in zip(batches, got):
            self._release(direction, args, dst)
        return sum(n for a in acks for n in a.bytes.values()), elapsed

    def run_both(self, count: int, pages: int, ops: int) -> tuple[int, float]:
        """``count`` loads and ``count`` backups of (pages, ops) issued alternately, no sync
        between: (bytes of both, wall us until both copy streams are done)."""
        loads = [self.load_args(pages, ops) for _ in range(count)]
        backups = [self.backup_args(pages, ops) for _ in range(count)]
        ctrl, cuda = self.ctrl, _cuda(self.device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        got_loads, got_backups = [], []
        for load, backup in zip(loads, backups):
            got_loads.append([ctrl.load(a, e, trusted=True) for a, e in load])
            ctrl.start_loading()
            got_backups.append([ctrl.write(a, e, trusted=True) for a, e in backup])
            ctrl.start_writing()
        if cuda:
            ctrl.load_stream.synchronize()
            ctrl.write_stream.synchronize()
        elapsed = (time.perf_counter() - t0) * 1e6
        acks = ctrl.poll()
        assert len(acks) == 2 * count * ops and all(a.success for a in acks), acks
        for args, dst in zip(loads, got_loads):
            self._release("h2d", args, dst)
        for args, dst in zip(backups, got_backups):
            self._release("d2h", args, dst)
        return sum(n for a in acks for n in a.bytes.values()), elapsed

    def _gate(self) -> Any:
        """Hold the GPU (a sleep on the current stream, which the copy stream waits for)
        while the host enqueues; record timing marks per launch group."""
        torch.cuda._sleep(self.gate_cycles)
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        self._marks = []
        counter = self.ctrl.layer_done
        plain = type(counter).record_span

        def timed(first: int, end: int, index: int) -> None:
            plain(counter, first, end, index)
            mark = torch.cuda.Event(enable_timing=True)
            mark.record()
            self._marks.append((first, end, mark))

        counter.record_span = timed
        return start

    def _end_event(self, direction: str, k: int | None) -> Any:
        if direction == "h2d":
            return self.ctrl.layer_done.event(self.stack.num_model_layers - 1, k)
        end = torch.cuda.Event(enable_timing=True)
        end.record(self.ctrl.write_stream)
        return end

    def _wait(self, direction: str, k: int | None, end: Any, t0: float, start: Any) -> dict:
        out = {}
        if direction == "h2d":
            self.ctrl.layer_done.event(0, k).synchronize()
            out["layer0_us"] = (time.perf_counter() - t0) * 1e6
        end.synchronize()
        out["e2e_us"] = (time.perf_counter() - t0) * 1e6
        torch.cuda.synchronize()
        if start is not None:
            self.ctrl.layer_done.__dict__.pop("record_span", None)
            if direction == "h2d" and self._marks:
                out["gpu_us"] = start.elapsed_time(self._marks[-1][2]) * 1e3
                out["gpu_layer0_us"] = start.elapsed_time(self._marks[0][2]) * 1e3
            elif direction == "d2h":
                out["gpu_us"] = start.elapsed_time(end) * 1e3
        return out

    def _group_times(self, start: Any) -> list[tuple[int, int, float]]:
        marks, self._marks = self._marks, None
        if start is None or not marks:
            return []
        return [(first, end, start.elapsed_time(ev)) for first, end, ev in marks]

    def _release(self, direction: str, args: list, got: list) -> None:
        """Free the batch's destination slots (loads: device; backups: host, and the
        device slots the backup read)."""
        dst_pools = self.cache.device_pools if direction == "h2d" else self.cache.host_group.pools
        for slots in got:
            for name, s in slots.items():
                dst_pools[name].free(s)
        if direction == "d2h":
            for kv, extra in args:
                self.cache.device_pools[self.anchor].free(kv)
                for name, s in (extra or {}).items():
                    self.cache.device_pools[name].free(s)

    def close(self) -> None:
        self.cache.close()


def make_backends(names: list[str], device: torch.device, max_programs: int | None,
                  host: bool = False) -> dict:
    """Fresh backends by name; every triton kernel bounded by ``max_programs``; ``host``:
    as ``--host-only`` builds them (``bench/host_only.py``)."""
    if host:
        from bench import host_only
        return host_only.make_backends(names, device.type == "cuda")
    kernel = TritonBackend(max_programs) if device.type == "cuda" else TorchBackend()
    factories = {"null": NullBackend, "triton": lambda: TritonBackend(max_programs),
                 "copy_engine": CopyEngineBackend, "torch": TorchBackend,
                 "dma": lambda: StagedBackend(kernel),
                 "auto": lambda: AutoBackend(triton=TritonBackend(max_programs))}
    return {n: factories[n]() for n in names}


def open_bench(args: argparse.Namespace, model: str, layers: int | None, layout: str,
               backend) -> LoadBench:
    """The model's cache, sized for the largest case of ``args``."""
    cap_pages = int(args.host_gib * (1 << 30) // max(1, _page_bytes(model, layers)))
    bench = LoadBench(model, layers, layout, min(4096, max(4 * max(args.pages), cap_pages)),
                      max(args.pages), max(args.ops), args.device, backend,
                      host_dtype=args.host_dtype)
    if args.group_bytes is not None:
        bench.ctrl.load_groups.min_bytes = args.group_bytes
    return bench


def _page_bytes(model: str, layers: int | None) -> int:
    from hicache.models import preset
    return preset(model, layers).row_bytes_per_anchor_page()
