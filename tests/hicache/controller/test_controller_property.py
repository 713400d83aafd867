"""Property test: random interleavings of write / load / start / poll / faults keep invariants."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache import HiCacheConfig, build
from hicache.models import deepseek_v4
from host_pools.memory import HostBudget
from transfer_kernels import NullBackend

BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)


class Switchable(NullBackend):
    """Moves nothing; raises while ``fail`` is set (bookkeeping only, fast)."""

    fail = False

    def _execute(self, plan) -> None:
        if self.fail:
            raise RuntimeError("injected fault")


ACTIONS = st.lists(st.tuples(st.sampled_from(["write", "load", "start_w", "start_l", "poll", "fault",
                                              "heal", "free_host", "free_dev"]),
                             st.integers(1, 3)), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS)
def test_random_interleavings_keep_invariants(actions):
    backend = Switchable()
    cache = build(deepseek_v4([4, 128]), 8 * 256, HiCacheConfig(hicache_ratio=1.0, swa_full_tokens_ratio=0.5),
                  device="cpu", budget=BIG, backend=backend)
    ctrl = cache.controller
    dev_kv, host_pool = cache.device_pools["kv"], cache.host_group.pools["kv"]
    owned_dev, owned_host, pending = [], [], {}  # what the "server" holds
    for action, n in actions:
        if action == "write":
            kv = dev_kv.alloc(n * 256)
            if kv is not None:
                owned_dev.append(kv)
                host = ctrl.write(kv)
                if host is not None:
                    pending[ctrl.last_op_id] = ("d2h", host["kv"])
        elif action == "load" and owned_host:
            got = ctrl.load(owned_host[0])
            if got is not None:
                pending[ctrl.last_op_id] = ("h2d", got["kv"])
        elif action == "start_w":
            ctrl.start_writing()
        elif action == "start_l":
            ctrl.start_loading()
        elif action == "poll":
            for ack in ctrl.poll():
                direction, slots = pending.pop(ack.op_id)
                if ack.success:
                    (owned_host if direction == "d2h" else owned_dev).append(slots)
        elif action in ("fault", "heal"):
            backend.fail = action == "fault"
        elif action == "free_host" and owned_host and not any(d == "h2d" for d, _ in pending.values()):
            host_pool.free(owned_host.pop())
        elif action == "free_dev" and owned_dev:
            dev_kv.free(owned_dev.pop(0))
    # drain, then every slot is either held by the server or free: no leak, no double owner
    ctrl.start_writing(), ctrl.start_loading()
    for ack in ctrl.poll():
        direction, slots = pending.pop(ack.op_id)
        if ack.success:
            (owned_host if direction == "d2h" else owned_dev).append(slots)
    assert not pending and ctrl.pending() == 0
    held_host = torch.cat(owned_host) if owned_host else torch.empty(0, dtype=torch.int64)
    held_dev = torch.cat(owned_dev) if owned_dev else torch.empty(0, dtype=torch.int64)
    assert held_host.unique().numel() == held_host.numel() == host_pool.allocator.used()
    assert held_dev.unique().numel() == held_dev.numel() == dev_kv.allocator.used()
    ctrl.check_integrity()
