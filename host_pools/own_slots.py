"""`OwnSlots`: who hands out a pool's token slots — its own allocator, or (a sidecar) its source.

A part each pool owns (`HostPool`, `LogicalHostPool`, `hicache`'s `DevicePool`), decided once
at construction: an own-indexed pool's ``alloc`` / ``free`` / ``available`` are its
allocator's own methods (no hop per call); a sidecar's refuse with one line naming its
source. Thread-safe through the allocator.
"""
from __future__ import annotations

from typing import Callable, NoReturn

import torch

from host_pools.allocator import PageAllocator
from host_pools.spec import PoolSpec


class OwnSlots:
    """The slot calls of one pool.

    Args:
        spec: the pool.
        allocator: its own allocator, or ``None`` for a sidecar (its rows follow its
            source's slots).

    Attributes:
        alloc: ``alloc(num_tokens) -> Tensor | None``, whole-page token slots or ``None``
            when short.
        free: ``free(slots) -> int``; ``ValueError`` on unaligned, out-of-range or double
            frees (nothing changes).
        available: ``available() -> int``, free token slots.
        rows_of: rows of aligned runs of the pool's token slots.
    """

    __slots__ = ("allocator", "alloc", "free", "available", "rows_of")

    def __init__(self, spec: PoolSpec, allocator: PageAllocator | None) -> None:
        self.allocator = allocator
        self.rows_of: Callable[[torch.Tensor], torch.Tensor] = spec.rows_of
        if allocator is None:
            refuse = _refusal(spec)
            self.alloc = self.free = self.available = refuse
        else:
            self.alloc, self.free, self.available = allocator.alloc, allocator.free, allocator.available


def _refusal(spec: PoolSpec) -> Callable[..., NoReturn]:
    def refuse(*_args: object) -> NoReturn:
        raise ValueError(f"pool {spec.name!r} borrows indices from {spec.indices_from!r}; "
                         "allocate from its source")
    return refuse
