"""`hicache.build`: device pools, host group and controller in one call (server start-up)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from host_pools.group import HostPoolGroup
from host_pools.memory import HostBudget
from host_pools.spec import Stack
from hicache.config import HiCacheConfig
from hicache.controller import HybridCacheController
from hicache.device_pool import DevicePool
from hicache.sizing import CachePlan, plan_sizes


@dataclass(frozen=True)
class HiCache:
    """Everything a server holds for the hierarchical cache of one model."""

    stack: Stack
    config: HiCacheConfig
    plan: CachePlan
    device_pools: dict[str, DevicePool]
    host_group: HostPoolGroup
    controller: HybridCacheController

    def close(self) -> None:
        """Wait for in-flight copies, then unpin host memory (call at shutdown; buffers go
        with their last reference). Further transfers raise ``RuntimeError``."""
        self.controller.close()


def build_device_pools(stack: Stack, device_rows: dict[str, int], device: torch.device) -> dict[str, DevicePool]:
    """Fresh device pools for every pool of ``stack`` (the anchor allocates whole pages)."""
    pools = {}
    for p in stack:
        page = stack.page_size if p is stack.anchor else None
        if p.has_data:
            pools[p.name] = DevicePool.allocate(p, device_rows[p.name], device, page_size=page)
        else:
            pools[p.name] = DevicePool.logical(p, device_rows[p.name] * p.tokens_per_row, device, stack.page_size)
    return pools


def build(stack: Stack, device_tokens: int, config: HiCacheConfig | None = None,
          device: str | torch.device = "cuda", *, budget: HostBudget | None = None,
          backend: Any = None) -> HiCache:
    """Assemble device pools, the host group (one reservation, inside the budget) and the controller.

    Args:
        stack: the model's pools (``hicache.models``).
        device_tokens: device anchor token capacity; other pools are sized from it.
        config: sizes, layout, backend; defaults to ``HiCacheConfig()``.
        device: ``"cuda"`` (host memory pinned) or ``"cpu"`` (CPU mode, plain memory).
        budget: host-memory budget override (tests); default from psutil/cgroup and config.
        backend: transfer backend override (name or instance), e.g. a fault injector.
    Returns:
        `HiCache` with device pools and host pools keyed by pool name.
    Raises:
        HostMemoryError: host pools do not fit the budget (nothing stays allocated).
        ValueError: bad sizes.
    """
    config = config or HiCacheConfig()
    dev = torch.device(device)
    plan = plan_sizes(stack, device_tokens, config, budget)
    host_group = HostPoolGroup.allocate(stack, plan.host_rows(), config.mem_layout, plan.budget,
                                        pin=dev.type == "cuda")
    device_pools = build_device_pools(stack, plan.device_rows(), dev)
    controller = HybridCacheController(device_pools, host_group, config, backend=backend)
    return HiCache(stack, config, plan, device_pools, host_group, controller)
