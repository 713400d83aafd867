"""The call budget of a load: the runtime-level calls a 16-page DeepSeek-V4-Pro load makes.

Every call of the budget goes through ``transfer_kernels.cuda.runtime`` (the CPU path makes the
same calls as the CUDA path; a record of no event does nothing), so counters put in its
place count what a GPU load would issue: per load at most one index upload and one stream
lookup; per launch group exactly one launch and one event record, plus the batch's own
event; no ``torch.cuda`` Python call anywhere on the path. 16 ops queued by ``load_many``
take one allocator call per pool and are merged once (with the compiled free stack; its
numpy form enters two: ``alloc_page_slots`` runs ``alloc_pages``). An int8 host pool's load (the fused
dequantize kernel) keeps the same budget.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from hicache import HiCacheConfig, build
from hicache.controller import batch as batch_module
from hicache.models import preset
from host_pools import allocator
from host_pools.memory import HostBudget
from tests.hicache.controller.rollback import load_groups
from transfer_kernels import TritonBackend, runtime

BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)
PAGES = 16
ALLOCS = 1 if allocator._pages is not None else 2  # allocator entries per allocation: compiled / numpy
CUDA_CALLS = ("current_stream", "current_device", "stream", "set_stream", "Event", "synchronize")


@pytest.fixture(scope="module")
def loaded():
    """DeepSeek-V4-Pro (61 layers, every pool) on the CPU: 16 device pages, 16 host pages
    (+ 16 SWA states) declared loadable. The pools are allocated lazily: no byte is read."""
    stack = preset("deepseek-v4-pro")
    tokens = PAGES * stack.page_size
    config = HiCacheConfig(mem_layout="page_first", hicache_ratio=1.0,
                           swa_full_tokens_ratio=PAGES * 128 / tokens)
    cache = build(stack, tokens, config, device="cpu", budget=BIG, backend=TritonBackend())
    host = cache.host_group.pools
    kv, swa = host["kv"].alloc(PAGES * stack.page_size), host["swa"].alloc(PAGES * 128)
    cache.controller.mark_host_written(kv, {"swa": swa})
    yield cache, (kv, swa)
    cache.close()


@pytest.fixture
def calls(monkeypatch, loaded):
    """Counters in place of the runtime calls (launches run nothing: only counted) and of
    every ``torch.cuda`` entry the path could use; allocator calls per pool."""
    return _counters(monkeypatch, loaded[0], ("kv", "swa"))


def _counters(monkeypatch, cache, pools: tuple[str, ...]) -> Counter:
    seen: Counter = Counter()

    def counted(key, real):
        return lambda *args, **kwargs: (seen.update([key]), real(*args, **kwargs))[1]
    monkeypatch.setattr(runtime, "upload", counted("upload", runtime.upload))
    monkeypatch.setattr(runtime, "stream_handle", counted("stream", runtime.stream_handle))
    monkeypatch.setattr(runtime, "launch", lambda launcher, group: seen.update([("launch", group)]))
    monkeypatch.setattr(runtime, "record", lambda event, stream: seen.update(["record"]))
    for name in CUDA_CALLS:
        monkeypatch.setattr(torch.cuda, name, counted(f"torch.cuda.{name}", lambda *_: None))
    for name in pools:
        alloc = cache.device_pools[name].allocator
        for method in ("alloc_pages", "alloc_page_slots"):  # many ops / one op
            monkeypatch.setattr(alloc, method, counted(f"alloc {name}", getattr(alloc, method)))
    monkeypatch.setattr(batch_module, "merged_once", counted("merged once", batch_module.merged_once))
    return seen


def _requests(loaded, ops: int) -> list[tuple[torch.Tensor, dict]]:
    cache, (kv, swa) = loaded
    per = PAGES // ops * cache.stack.page_size
    if swa is None:
        return [(kv[i * per:(i + 1) * per], {}) for i in range(ops)]
    return [(kv[i * per:(i + 1) * per], {"swa": swa[i * 128:(i + 1) * 128]}) for i in range(ops)]


def _load(cache, requests, many: bool) -> int:
    ctrl = cache.controller
    got = (ctrl.load_many(requests) if many
           else [ctrl.load(kv, extra) for kv, extra in requests])
    assert got is not None and all(g is not None for g in got)
    assert ctrl.start_loading() is not None
    assert all(a.success for a in ctrl.poll())
    for slots in got:
        for name, s in slots.items():
            cache.device_pools[name].free(s)
    extra = {"swa": torch.cat([e["swa"] for _, e in requests])} if requests[0][1] else {}
    return len(load_groups(ctrl, torch.cat([kv for kv, _ in requests]), extra).groups)


def _assert_budget(seen: Counter, groups: int) -> None:
    assert seen["upload"] == 1  # one index upload per load
    assert seen["stream"] <= 1  # the stream handle: once per load, not per launch
    assert [seen[("launch", g)] for g in range(groups)] == [1] * groups  # one per group
    assert sum(v for k, v in seen.items() if isinstance(k, tuple)) == groups
    assert seen["record"] == groups + 1  # one per group, one for the batch's ack
    assert not [k for k in seen if str(k).startswith("torch.cuda")]


def test_one_op_of_16_pages(loaded, calls):
    cache = loaded[0]
    groups = _load(cache, _requests(loaded, 1), many=False)
    assert 2 <= groups < cache.stack.num_model_layers  # grouped, not one launch per layer
    _assert_budget(calls, groups)
    assert calls["alloc kv"] == calls["alloc swa"] == ALLOCS


def test_16_ops_through_load_many(loaded, calls):
    cache = loaded[0]
    groups = _load(cache, _requests(loaded, PAGES), many=True)
    _assert_budget(calls, groups)
    # one allocator call per pool for all 16 ops; the batch takes the slots merged by it
    assert calls["alloc kv"] == calls["alloc swa"] == 1
    assert calls["merged once"] >= 1


def test_16_ops_one_by_one_allocate_per_op(loaded, calls):
    cache = loaded[0]
    # the single-op API keeps its contract: each load() allocates on its own
    groups = _load(cache, _requests(loaded, PAGES), many=False)
    _assert_budget(calls, groups)
    assert calls["alloc kv"] == calls["alloc swa"] == PAGES * ALLOCS


@pytest.fixture(scope="module")
def loaded_int8():
    """DeepSeek-V3 (61 layers, MLA bf16) with ``--hicache-host-dtype int8``: every load
    dequantizes (the fused quant kernel, through the same runtime calls)."""
    stack = preset("deepseek-v3")
    config = HiCacheConfig(mem_layout="page_first", hicache_ratio=1.0, host_dtype="int8")
    cache = build(stack, PAGES * stack.page_size, config, device="cpu", budget=BIG,
                  backend=TritonBackend())
    kv = cache.host_group.pools["kv"].alloc(PAGES * stack.page_size)
    cache.controller.mark_host_written(kv, {})
    yield cache, (kv, None)
    cache.close()


@pytest.mark.parametrize("ops", [1, PAGES])
def test_int8_load_keeps_the_budget(loaded_int8, monkeypatch, ops):
    cache = loaded_int8[0]
    seen = _counters(monkeypatch, cache, ("kv",))
    quant = cache.controller.backend.quant_backend(torch.device("cpu"))
    before = quant.launches
    groups = _load(cache, _requests(loaded_int8, ops), many=True)
    assert groups >= 2 and quant.launches - before == groups  # every launch converts
    _assert_budget(seen, groups)
    assert seen["alloc kv"] == (ALLOCS if ops == 1 else 1)  # one op: the one-op take (`alloc_page_slots`)


@pytest.fixture(scope="module")
def loaded_int8_staged():
    """The same int8 load through ``auto`` deciding as on a GPU: int8 pages staged by DMA,
    the fused kernel dequantizing from the ring (bench/host_only.py's CPU stand-ins)."""
    from bench import host_only
    from transfer_kernels import AutoBackend
    from transfer_kernels.backends import auto, auto_table
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(auto, "converting", host_only._converting_as_on_cuda)
        stack = preset("deepseek-v3")
        config = HiCacheConfig(mem_layout="page_first", hicache_ratio=1.0, host_dtype="int8")
        backend = AutoBackend(triton=TritonBackend(), table=host_only.cuda_rules_on_cpu(auto_table.SEED))
        cache = build(stack, PAGES * stack.page_size, config, device="cpu", budget=BIG, backend=backend)
        kv = cache.host_group.pools["kv"].alloc(PAGES * stack.page_size)
        cache.controller.mark_host_written(kv, {})
        yield cache, (kv, None)
        cache.close()


def test_int8_staged_load_keeps_the_budget(loaded_int8_staged, monkeypatch):
    cache = loaded_int8_staged[0]
    staged = cache.controller.backend.inner["dma"]
    quant = staged.kernel.quant_backend(torch.device("cpu"))
    seen = _counters(monkeypatch, cache, ("kv",))
    before = quant.launches, staged.copies, cache.controller.backend.launches
    groups = _load(cache, _requests(loaded_int8_staged, 1), many=True)
    assert groups >= 2
    assert quant.launches - before[0] == groups  # every group converts from the ring
    assert staged.copies - before[1] >= 1  # the int8 pages came by DMA
    assert cache.controller.backend.launches - before[2] == groups  # auto: one per group
    _assert_budget(seen, groups)
