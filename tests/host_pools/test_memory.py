"""Host memory: the budget (psutil, cgroup v1/v2, headroom, ranks) and all-or-nothing reservations."""
from __future__ import annotations

import math
import mmap
import os

import pytest
import torch

from host_pools.group import HostPoolGroup
from host_pools.memory import (GIB, HostBudget, HostMemoryError, HostReservation, cgroup_free_bytes,
                               default_headroom_bytes, host_budget, pin_chunk_bytes)
from host_pools.pools import HostPool, LogicalHostPool
from host_pools.spec import BufferSpec, PoolKind, PoolSpec, Stack

V1_UNLIMITED = 9_223_372_036_854_771_712  # what cgroup v1 reports without a limit


def _cgroup_v2(root, limit: str, usage: int | None) -> str:
    (root / "memory.max").write_text(f"{limit}\n")
    if usage is not None:
        (root / "memory.current").write_text(f"{usage}\n")
    return str(root)


def _cgroup_v1(root, limit: int, usage: int) -> str:
    (root / "memory").mkdir()
    (root / "memory" / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (root / "memory" / "memory.usage_in_bytes").write_text(f"{usage}\n")
    return str(root)


def _budget(budget_bytes: int) -> HostBudget:
    return HostBudget(available_bytes=budget_bytes, cgroup_free_bytes=None, headroom_bytes=0,
                      ranks_per_host=1, budget_bytes=budget_bytes)


# ---------------------------------------------------------------- cgroup and budget


def test_cgroup_v2_limit_minus_usage(tmp_path):
    root = _cgroup_v2(tmp_path, str(8 * GIB), 3 * GIB)
    assert cgroup_free_bytes(root) == 5 * GIB


def test_cgroup_v2_max_is_unlimited(tmp_path):
    assert cgroup_free_bytes(_cgroup_v2(tmp_path, "max", 3 * GIB)) is None


def test_cgroup_v2_usage_above_limit_gives_zero(tmp_path):
    assert cgroup_free_bytes(_cgroup_v2(tmp_path, str(2 * GIB), 3 * GIB)) == 0


def test_cgroup_v1_limit_minus_usage(tmp_path):
    assert cgroup_free_bytes(_cgroup_v1(tmp_path, 6 * GIB, 1 * GIB)) == 5 * GIB


def test_cgroup_v1_huge_limit_is_unlimited(tmp_path):
    assert cgroup_free_bytes(_cgroup_v1(tmp_path, V1_UNLIMITED, 1 * GIB)) is None


def test_no_cgroup_files_is_unlimited(tmp_path):
    assert cgroup_free_bytes(str(tmp_path)) is None


def test_host_budget_takes_the_smaller_of_psutil_and_cgroup(tmp_path):
    root = _cgroup_v2(tmp_path, str(20 * GIB), 4 * GIB)  # cgroup allows 16 GiB more
    # psutil has more than the cgroup allows: the cgroup wins
    b = host_budget(headroom_bytes=2 * GIB, cgroup_root=root, available_bytes=100 * GIB)
    assert (b.cgroup_free_bytes, b.budget_bytes) == (16 * GIB, 14 * GIB)
    # psutil has less: psutil wins
    b = host_budget(headroom_bytes=2 * GIB, cgroup_root=root, available_bytes=10 * GIB)
    assert b.budget_bytes == 8 * GIB and b.available_bytes == 10 * GIB


def test_host_budget_v1(tmp_path):
    root = _cgroup_v1(tmp_path, 12 * GIB, 2 * GIB)
    b = host_budget(headroom_bytes=1 * GIB, cgroup_root=root, available_bytes=64 * GIB)
    assert b.budget_bytes == 9 * GIB


def test_host_budget_unlimited_cgroup_uses_psutil(tmp_path):
    root = _cgroup_v2(tmp_path, "max", 5 * GIB)
    b = host_budget(headroom_bytes=3 * GIB, cgroup_root=root, available_bytes=11 * GIB)
    assert b.cgroup_free_bytes is None and b.budget_bytes == 8 * GIB
    assert "unlimited" in b.describe()


def test_host_budget_splits_across_ranks(tmp_path):
    root = _cgroup_v2(tmp_path, str(30 * GIB), 2 * GIB)
    b = host_budget(headroom_bytes=4 * GIB, ranks_per_host=3, cgroup_root=root, available_bytes=99 * GIB)
    # (28 - 4) GiB over 3 ranks
    assert b.budget_bytes == 8 * GIB and b.ranks_per_host == 3
    assert "3 rank(s)" in b.describe()


def test_headroom_larger_than_memory_gives_zero_budget(tmp_path):
    b = host_budget(headroom_bytes=8 * GIB, cgroup_root=str(tmp_path), available_bytes=5 * GIB)
    assert b.budget_bytes == 0


def test_default_headroom(tmp_path):
    assert default_headroom_bytes(40 * GIB) == 4 * GIB
    assert default_headroom_bytes(512 * GIB) == 10 * GIB
    b = host_budget(cgroup_root=str(tmp_path), available_bytes=7 * GIB)
    assert b.headroom_bytes == default_headroom_bytes()


def test_available_bytes_override_is_used_as_is(tmp_path):
    b = host_budget(headroom_bytes=0, cgroup_root=str(tmp_path), available_bytes=123_456_789)
    assert b.available_bytes == 123_456_789 and b.budget_bytes == 123_456_789


@pytest.mark.parametrize("kwargs, match", [
    ({"ranks_per_host": 0}, "ranks_per_host"),
    ({"headroom_bytes": -1}, "headroom_bytes"),
])
def test_host_budget_rejects_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        host_budget(cgroup_root=str(tmp_path), available_bytes=GIB, **kwargs)


# ---------------------------------------------------------------- HostReservation


def test_reserve_refuses_over_budget_and_allocates_nothing(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(HostReservation, "_allocate", lambda self, name, n: calls.append(name))
    # a container with 3 GiB of which 1 GiB is used: 2 GiB left, less than the 3.5 GiB asked
    budget = host_budget(headroom_bytes=0, cgroup_root=_cgroup_v2(tmp_path, str(3 * GIB), GIB),
                         available_bytes=64 * GIB)
    requests = {"swa": 3 * GIB, "c4_kv": GIB // 2, "empty": 0}
    res = HostReservation()
    with pytest.raises(HostMemoryError) as info:
        res.reserve(requests, budget, flag_hint="--hicache-ratio")
    msg = str(info.value)
    # the message lists every non-empty pool in GiB, what is available, and the flag to lower
    assert "need 3.50 GiB" in msg  # the total
    assert "swa" in msg and "3.000 GiB" in msg
    assert "c4_kv" in msg and "0.500 GiB" in msg
    assert "empty" not in msg
    assert "budget is 2.00 GiB" in msg and "available 64.00 GiB, cgroup free 2.00 GiB" in msg
    assert "Lower --hicache-ratio" in msg
    assert res.buffers == {} and calls == []
    assert isinstance(info.value, ValueError)


def test_reserve_rejects_negative_requests():
    with pytest.raises(ValueError, match="requests"):
        HostReservation().reserve({"swa": -1}, _budget(GIB))


def test_reserve_gives_exact_sizes():
    res = HostReservation()
    out = res.reserve({"a": 4096 * 3 + 17, "b": 1, "c": 0}, _budget(1 << 20))
    assert {k: (v.dtype, v.numel()) for k, v in out.items()} == {
        "a": (torch.uint8, 4096 * 3 + 17), "b": (torch.uint8, 1), "c": (torch.uint8, 0)}
    assert res.total_bytes == 4096 * 3 + 18
    # the memory is usable
    out["a"].fill_(7)
    assert int(out["a"][-1]) == 7
    res.release()
    assert res.buffers == {}


def test_reserve_failure_midway_releases_everything(monkeypatch):
    real = HostReservation._allocate

    def flaky(self, name, nbytes, *args):
        if name == "second":
            raise MemoryError("mmap refused")
        return real(self, name, nbytes, *args)

    monkeypatch.setattr(HostReservation, "_allocate", flaky)
    res = HostReservation()
    with pytest.raises(HostMemoryError, match="host allocation failed"):
        res.reserve({"first": 4096, "second": 4096}, _budget(1 << 20))
    assert res.buffers == {}


# ---------------------------------------------------------------- HostPoolGroup.allocate


def _stack() -> Stack:
    """Data-less anchor (page 8) + a history sidecar, and an own-indexed state pool + its sidecar."""
    u8 = torch.uint8
    return Stack((
        PoolSpec("kv", PoolKind.ANCHOR, 0, (), tokens_per_row=1),
        PoolSpec("hist", PoolKind.HISTORY, 2, (BufferSpec("kv", (40,), u8),), 8, indices_from="kv"),
        PoolSpec("win", PoolKind.STATE, 3,
                 (BufferSpec("kv", (24,), u8), BufferSpec("kv_scale", (2,), torch.float32)), 4, window_tokens=4),
        PoolSpec("ring", PoolKind.STATE, 1, (BufferSpec("state", (2, 4), torch.float32),), 4,
                 indices_from="win", window_tokens=4),
    ), page_size=8)


ROWS = {"kv": 64, "hist": 8, "win": 6, "ring": 6}  # 64 anchor tokens = 8 pages; 6 window rows


def _expected_bytes() -> dict[str, int]:
    return {"hist": 8 * 2 * 40, "win": 6 * 3 * 32, "ring": 6 * 1 * 32}


def test_group_allocate_refusal_leaves_nothing_allocated(monkeypatch):
    made: list[HostReservation] = []

    class Recording(HostReservation):
        def __init__(self, pin: bool = False) -> None:
            super().__init__(pin)
            made.append(self)

        def _allocate(self, name, nbytes, *args):  # must never be reached on a refusal
            raise AssertionError(f"allocated {name} despite the refusal")

    monkeypatch.setattr("host_pools.group.HostReservation", Recording)
    need = sum(_expected_bytes().values())
    with pytest.raises(HostMemoryError, match="Lower --hicache-size"):
        HostPoolGroup.allocate(_stack(), ROWS, "page_first", _budget(need - 1), flag_hint="--hicache-size")
    assert len(made) == 1 and made[0].buffers == {}


def test_group_allocate_requires_every_row_count():
    with pytest.raises(ValueError, match="ring"):
        HostPoolGroup.allocate(_stack(), {k: v for k, v in ROWS.items() if k != "ring"}, "page_first",
                               _budget(1 << 20))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_group_allocate_success_gives_exact_sizes(layout):
    expected = _expected_bytes()
    group = HostPoolGroup.allocate(_stack(), ROWS, layout, _budget(sum(expected.values())))
    assert {name: buf.numel() for name, buf in group.reservation.buffers.items()} == expected
    assert isinstance(group["kv"], LogicalHostPool) and group["kv"].num_tokens == 64
    for name, nbytes in expected.items():
        pool = group[name]
        assert isinstance(pool, HostPool) and pool.nbytes == nbytes and pool.layout == layout
        # the pool's tensor is the reservation's memory, not a copy
        assert pool.buffer.data_ptr() == group.reservation.buffers[name].data_ptr()
    assert group.nbytes == sum(expected.values())
    assert group["kv"].allocator.page_size == 8 and group["win"].allocator.page_size == 4
    assert group["hist"].allocator is None and group["ring"].allocator is None
    group.check_integrity()
    group.close()
    assert group.reservation.buffers == {}


@pytest.mark.gpu
def test_pinned_reservation_registers_and_unregisters():
    budget = HostBudget(1 << 40, None, 0, 1, 1 << 40)
    res = HostReservation(pin=True)
    # one pool over two 1 GiB-chunk boundaries would be slow; a few MiB still pins in one call
    bufs = res.reserve({"a": 3 << 20, "b": 1 << 20}, budget)
    assert all(b.is_pinned() for b in bufs.values())
    # pinned host memory is readable by the GPU: a round trip through the device is exact
    bufs["a"].copy_(torch.randint(0, 256, (3 << 20,), dtype=torch.uint8))
    assert torch.equal(bufs["a"].cuda().cpu(), bufs["a"])
    res.release()
    assert not res.buffers and not res._pinned


# ---------------------------------------------------------------- pinning (faked on CPU)


class FakeCudaHost:
    """Stands in for host_pools.cuda_host: records registrations, fails on request."""

    def __init__(self, fail_at: int | None = None, offset: int = 0) -> None:
        self.registered: dict[int, int] = {}
        self.calls = 0
        self.fail_at, self.offset = fail_at, offset

    def register(self, ptr: int, nbytes: int) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("cudaHostRegister of 1 bytes failed: CUDA error 2 (out of memory)")
        self.registered[ptr] = nbytes

    def unregister(self, ptr: int) -> None:
        del self.registered[ptr]

    def device_pointer(self, ptr: int) -> int:
        return ptr + self.offset


@pytest.fixture
def fake_cuda(monkeypatch):
    import host_pools.cuda_host as cuda_host

    def install(**kw) -> FakeCudaHost:
        fake = FakeCudaHost(**kw)
        for name in ("register", "unregister", "device_pointer"):
            monkeypatch.setattr(cuda_host, name, getattr(fake, name))
        return fake
    return install


@pytest.mark.parametrize("stride", [4096, 74880 * 61, 1728, 3])
def test_pin_chunks_never_cut_a_row(stride):
    # Chunk starts are page-aligned multiples of the row stride, near the 1 GiB target.
    chunk = pin_chunk_bytes(stride, 1 << 40)
    assert chunk % stride == 0 and chunk % mmap.PAGESIZE == 0
    assert chunk <= max(1 << 30, math.lcm(stride, mmap.PAGESIZE))
    # A stride whose lcm with the page exceeds 64 GiB: one registration for the buffer.
    assert pin_chunk_bytes((1 << 40) + 1, 5 << 20) == 5 << 20


def test_pinned_reservation_registers_row_aligned_chunks(fake_cuda, monkeypatch):
    monkeypatch.setattr("host_pools.memory._PIN_CHUNK_BYTES", 3 * 4096)
    fake = fake_cuda()
    res = HostReservation(pin=True)
    stride = 2 * 4096 // 3 * 3  # 8190 B rows: chunks of lcm(4096, 8190) bytes
    bufs = res.reserve({"a": 40 * stride}, _budget(1 << 30), row_strides={"a": stride})
    base = bufs["a"].data_ptr()
    starts = res.chunks["a"] - base
    assert starts[0] == 0 and all(int(s) % stride == 0 and int(s) % 4096 == 0 for s in starts)
    assert sorted(fake.registered) == (base + starts).tolist()
    assert sum(fake.registered.values()) == 40 * stride
    res.release()
    assert fake.registered == {} and res.chunks == {}


@pytest.mark.parametrize("kw,match", [({"fail_at": 2}, "out of memory"),
                                      ({"offset": 4096}, "differs from its host address")])
def test_pinning_failure_unpins_everything(fake_cuda, monkeypatch, kw, match):
    # A failing second registration, or a device address that is not the host address:
    # a clear refusal, every earlier registration undone, nothing kept.
    monkeypatch.setattr("host_pools.memory._PIN_CHUNK_BYTES", 4096)
    fake = fake_cuda(**kw)
    res = HostReservation(pin=True)
    with pytest.raises(HostMemoryError, match=match):
        res.reserve({"a": 4 * 4096, "b": 4096}, _budget(1 << 30))
    assert fake.registered == {} and res.buffers == {}


def test_finalizer_makes_no_cuda_call_in_a_forked_child(fake_cuda, monkeypatch):
    fake = fake_cuda()
    res = HostReservation(pin=True)
    res.reserve({"a": 4096}, _budget(1 << 30))
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as if this were a forked child
    res.release()
    assert len(fake.registered) == 1  # the parent's pin is the parent's to undo
