"""`HostPoolGroup`: the host pools of one stack, their source graph and one memory reservation.

Sidecars own no allocator: their rows are derived, when a transfer runs, from the
token slots of the own-indexed pool at the root of their source chain.

    kv (anchor, page 256) --+-- c4_kv       rows = kv_slots  // 256 (one per page)
                            +-- c4_indexer  rows = kv_slots  // 256
                            +-- c128_kv     rows = kv_slots  // 256
    swa (own, row 128) -----+-- c4_state    rows = swa_slots // 128 (one per SWA row)
                            +-- c4_indexer_state
"""
from __future__ import annotations

from typing import Mapping, Union

import numpy as np
import torch

from host_pools.memory import HostBudget, HostReservation
from host_pools.pools import HostPool, LogicalHostPool
from host_pools.spec import Stack

AnyHostPool = Union[HostPool, LogicalHostPool]


class HostPoolGroup:
    """All host pools of one stack, keyed by name.

    Args:
        anchor: the anchor pool (``LogicalHostPool`` or a ``HostPool`` with data).
        pools: the other pools (any order); sidecars name their source in their spec.
        reservation: the memory reservation backing the buffers, kept for teardown.
    Raises:
        ValueError: a source that does not exist, a cycle, duplicate names, or a sidecar
            whose rows do not cover its source's token slots.
    """

    def __init__(self, anchor: AnyHostPool, pools: list[AnyHostPool] | tuple[AnyHostPool, ...] = (),
                 reservation: HostReservation | None = None) -> None:
        all_pools = [anchor, *pools]
        page = anchor.allocator.page_size if anchor.allocator is not None else 1
        self.stack = Stack(tuple(p.spec for p in all_pools), page_size=page)  # validates the graph
        if self.stack.anchor.name != anchor.name:
            raise ValueError(f"anchor: {anchor.name!r} is not an ANCHOR pool")
        self.anchor = anchor
        self.pools: dict[str, AnyHostPool] = {p.name: p for p in all_pools}
        self.reservation = reservation
        self.closed = False
        for p in all_pools:
            self._check_coverage(p)

    def _check_coverage(self, pool: AnyHostPool) -> None:
        if not pool.spec.is_sidecar:
            return
        root = self.pools[self.stack.root_of(pool.name).name]
        tpr = pool.spec.tokens_per_row
        if root.allocator.page_size % tpr:
            raise ValueError(f"pools: sidecar {pool.name!r} has tokens_per_row={tpr}, which does not divide "
                             f"the page of its root {root.name!r} ({root.allocator.page_size})")
        if pool.num_rows * tpr < root.num_tokens:
            raise ValueError(f"pools: sidecar {pool.name!r} has {pool.num_rows} rows of {tpr} tokens, "
                             f"fewer than the {root.num_tokens} token slots of its root {root.name!r}")

    @classmethod
    def allocate(cls, stack: Stack, host_rows: Mapping[str, int], layout: str, budget: HostBudget,
                 pin: bool = False, flag_hint: str = "--hicache-ratio or --hicache-size") -> "HostPoolGroup":
        """Build every host pool of ``stack`` inside one reservation.

        Args:
            host_rows: rows per pool name (token slots for a data-less anchor).
            budget: the host-memory budget; the whole group must fit.
            pin: pin with cudaHostRegister (CUDA mode).
        Raises:
            HostMemoryError: the group does not fit (nothing stays allocated).
        """
        missing = [p.name for p in stack if p.name not in host_rows]
        if missing:
            raise ValueError(f"host_rows: no row count for pools {missing}")
        requests = {p.name: HostPool.bytes_for(p, host_rows[p.name]) for p in stack.data_pools()}
        strides = {p.name: HostPool.row_stride_for(p, layout) for p in stack.data_pools()}
        reservation = HostReservation(pin=pin)
        storage = reservation.reserve(requests, budget, flag_hint, strides)
        try:
            return cls._assemble(stack, host_rows, layout, storage, reservation)
        except Exception:  # a bad layout or row count: give the memory back before raising
            reservation.release()
            raise

    @classmethod
    def _assemble(cls, stack: Stack, host_rows: Mapping[str, int], layout: str,
                  storage: dict[str, torch.Tensor], reservation: HostReservation) -> "HostPoolGroup":
        built = {}
        for p in stack:
            page = stack.page_size if p is stack.anchor else None
            if not p.has_data:
                built[p.name] = LogicalHostPool(host_rows[p.name] * p.tokens_per_row, stack.page_size, p.name)
            else:
                built[p.name] = HostPool(p, host_rows[p.name], layout, storage[p.name], page_size=page)
        others = [built[p.name] for p in stack if p is not stack.anchor]
        return cls(built[stack.anchor.name], others, reservation)

    def pin_chunks(self, name: str) -> "np.ndarray | None":
        """Start addresses of the pinned registrations of pool ``name`` (None when not pinned)."""
        if self.reservation is None:
            return None
        return self.reservation.chunks.get(name)

    def __getitem__(self, name: str) -> AnyHostPool:
        if name not in self.pools:
            raise ValueError(f"pool: unknown host pool {name!r}; known: {sorted(self.pools)}")
        return self.pools[name]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pools.values())

    def derive_rows(self, own_slots: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Host rows of every data pool rooted at a pool of ``own_slots`` (see `Stack.derive_rows`)."""
        return self.stack.derive_rows(dict(own_slots))

    def check_integrity(self) -> None:
        """``RuntimeError`` if any allocator breaks free + used = total."""
        for p in self.pools.values():
            if p.allocator is not None:
                p.allocator.check_integrity()

    def close(self) -> None:
        """Unpin the group's memory (buffers go with their last reference); idempotent.

        Call only when no copy touches the buffers any more (``HybridCacheController.close``
        waits for its streams first).
        """
        self.closed = True
        if self.reservation is not None:
            self.reservation.release()
