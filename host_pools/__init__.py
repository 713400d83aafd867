"""Host side of hicache: pool specs, the page allocator, host memory and host pools."""
from host_pools.allocator import PageAllocator
from host_pools.group import HostPoolGroup
from host_pools.memory import (HostBudget, HostMemoryError, HostReservation, cgroup_free_bytes, check_fits,
                               host_budget)
from host_pools.pools import LAYOUTS, HostPool, LogicalHostPool
from host_pools.spec import BufferSpec, HitPolicy, PoolKind, PoolSpec, Stack, slots_to_rows

__all__ = [
    "BufferSpec", "HitPolicy", "HostBudget", "HostMemoryError", "HostPool", "HostPoolGroup",
    "HostReservation", "LAYOUTS", "LogicalHostPool", "PageAllocator", "PoolKind", "PoolSpec",
    "Stack", "cgroup_free_bytes", "check_fits", "host_budget", "slots_to_rows",
]
