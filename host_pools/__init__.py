"""Host side of hicache: pool specs, the page allocator, host memory and host pools."""
from host_pools.allocator import PageAllocator
from host_pools.group import HostPoolGroup
from host_pools.host_format import HOST_DTYPES, host_spec, host_stack, int8_refusal
from host_pools.memory import (HostBudget, HostMemoryError, HostReservation, cgroup_free_bytes, check_fits,
                               host_budget)
from host_pools.pools import LAYOUTS, HostPool, LogicalHostPool
from host_pools.spec import BufferSpec, HitPolicy, PoolKind, PoolSpec, Stack, slots_to_rows

__all__ = [
    "BufferSpec", "HOST_DTYPES", "HitPolicy", "HostBudget", "HostMemoryError", "HostPool", "HostPoolGroup",
    "HostReservation", "LAYOUTS", "LogicalHostPool", "PageAllocator", "PoolKind", "PoolSpec",
    "Stack", "cgroup_free_bytes", "check_fits", "host_budget", "host_spec", "host_stack", "int8_refusal",
    "slots_to_rows",
]
