"""`Slots`: what an op moves, checked once at the edge, and where it lands, allocated.

What a server passes is coerced and checked here, once (`hicache.controller.edge`); the
radix tree passes ``trusted=True`` with slots it checked itself. Destination pages come
straight from the controller's own allocators, all or nothing
(`hicache.controller.alloc`); a server's ``device_alloc`` is checked like a caller's
slots. The host pages' stamps say which are loadable: a page is loadable only while it
is still the allocation its last acked backup (or ``mark_host_written``) wrote into.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import torch

from hicache import slot_arrays
from hicache.controller.alloc import alloc_all, alloc_pages_many, free_all
from hicache.controller.batch import MergedOps, Op, merge_slots
from hicache.controller.edge import check_owned, check_pages, edge_slots, label
from hicache.device_pool import DevicePool
from host_pools.pools import HostPool
from host_pools.spec import Stack
from transfer_kernels.rows import first_duplicate

AllocFn = Callable[[int], "torch.Tensor | None"]
FreeFn = Callable[[torch.Tensor], Any]


class Slots:
    """Part: the ops' slots (see the module docstring). Owns the allocators of both tiers
    (the pools' own and a server's) and the host pages' loadable stamps.

    Args:
        stack: the pools.
        device_pools / host_pools: every pool of the stack, keyed by name.
        device_alloc / device_free: a server's allocators per own-indexed pool (checked).
    Not thread-safe: driven by the controller.
    """

    def __init__(self, stack: Stack, device_pools: Mapping[str, DevicePool], host_pools: Mapping[str, HostPool],
                 device_alloc: Mapping[str, AllocFn] | None, device_free: Mapping[str, FreeFn] | None) -> None:
        self._stack, self._anchor = stack, stack.anchor.name
        self._device_pools, self._host_pools = device_pools, host_pools
        own = [p.name for p in stack.own_indexed]
        self._server_alloc = set((device_alloc or {}).keys()) & set(own)
        self._alloc = {n: (device_alloc or {}).get(n, device_pools[n].alloc) for n in own}
        self._free = {n: (device_free or {}).get(n, device_pools[n].free) for n in own}
        # the own allocators of each tier (destination pages of writes and of loads)
        self._host_allocs = {n: host_pools[n].allocator for n in own}
        self._device_allocs = {n: device_pools[n].allocator for n in own}
        # Per host page: the allocation generation its last acked backup wrote into.
        # A page is loadable only while it is still that allocation (0 = never written).
        self._host_stamp = {n: np.zeros(host_pools[n].allocator.num_pages, np.int64) for n in own}

    # ---- ops -------------------------------------------------------------------------
    def backup(self, anchor: Any, extra: Mapping[str, Any] | None, trusted: bool) -> Op | None:
        """A write's op, its host pages taken (``None``: a host pool is short)."""
        tokens = anchor.numel() if trusted and not extra else 0
        if tokens:  # the radix tree's history alone: one pool
            return self._anchor_backup(anchor, tokens)
        src = self._sources(anchor, extra, trusted, "device_indices", self._check_device_slots)
        got = alloc_pages_many(self._host_allocs, [src], lambda _, n: label("device_indices", n), "host")
        return None if got is None else Op(-1, "d2h", src, got.slots[0], got.stamps[0])

    def _anchor_backup(self, anchor: torch.Tensor, tokens: int) -> Op | None:
        """`backup` of trusted anchor slots alone, ``tokens`` of them (not none; the tree's
        backups): `alloc_pages_many`'s work for one op and one pool, without its generality."""
        name = self._anchor
        alloc = self._host_allocs[name]
        count, rest = divmod(tokens, alloc.page_size)
        if rest:
            raise ValueError(f"{label('device_indices', name)}: {tokens} slots are not whole "
                             f"host pages of {alloc.page_size}")
        got = alloc.alloc_page_slots(count)
        if got is None:
            return None
        # positional: a keyword costs this hot call a third more
        return Op(-1, "d2h", {name: anchor}, {name: torch.from_numpy(got[2])}, {name: got[:2]}, None,
                  (name, tokens))

    def load(self, anchor: Any, extra: Mapping[str, Any] | None, trusted: bool) -> Op | None:
        """A load's op, its device slots taken (``None``: a device pool is short)."""
        src = self._sources(anchor, extra, trusted, "host_indices", self._check_loadable)
        if not self._server_alloc:  # the device pools' own allocators: pages straight from them
            got = alloc_pages_many(self._device_allocs, [src], lambda _, n: label("host_indices", n), "device")
            return None if got is None else Op(-1, "h2d", src, got.slots[0], got.stamps[0])
        return self._server_load(src)  # a server's allocator: its slots are coerced and checked

    def many(self, direction: str, requests: list[tuple[Any, Any]], trusted: bool) -> list[Op] | None:
        """The ops of ``load_many`` / ``write_many``: each request checked as one op is, the
        set all or nothing (``None``: a pool is short for the sum); errors name ``requests[i]``."""
        load = direction == "h2d"
        what, check = (("host_indices", self._check_loadable) if load
                       else ("device_indices", self._check_device_slots))
        srcs = []
        for i, (anchor, extra) in enumerate(requests):
            try:
                srcs.append(self._sources(anchor, extra, trusted, what, check))
            except (ValueError, TypeError) as exc:  # name the request; nothing was taken yet
                raise type(exc)(f"requests[{i}]: {exc}") from None
        if not srcs:
            return []
        if load and self._server_alloc:  # a server's allocator, op by op: undone if one fails
            return self._server_loads(srcs)
        got = alloc_pages_many(self._device_allocs if load else self._host_allocs, srcs,
                               lambda i, n: f"requests[{i}]: {label(what, n)}", "device" if load else "host")
        if got is None:
            return None
        merged = MergedOps(merge_slots(srcs), got.merged, len(srcs))
        return [Op(-1, direction, src, dst, stamps, merged) for src, dst, stamps in zip(srcs, got.slots, got.stamps)]

    def _sources(self, anchor: Any, extra: Mapping[str, Any] | None, trusted: bool, what: str,
                 check: Callable[[str, torch.Tensor], None]) -> dict[str, torch.Tensor]:
        """A call's source slots keyed by pool: trusted as given (empty ones dropped), else
        coerced and each pool's slots checked by ``check(name, slots)``."""
        if trusted:
            src = {self._anchor: anchor} if anchor.numel() else {}
            if extra:
                for name, slots in extra.items():
                    if slots.numel():
                        src[name] = slots
            if not src:
                raise ValueError(f"{what}: nothing to transfer (empty anchor slots and no extra)")
            return src
        src = edge_slots(self._stack, anchor, extra, what)
        for name, slots in src.items():
            check(name, slots)
        return src

    def _server_load(self, src: dict[str, torch.Tensor]) -> Op | None:
        dst = alloc_all(src, lambda n, k: self._alloc[n](k), lambda n, s: self._free[n](s), self._server_alloc)
        if dst is None:
            return None
        self._check_server_slots(dst)
        return Op(-1, "h2d", src, dst)

    def _server_loads(self, srcs: list[dict[str, torch.Tensor]]) -> list[Op] | None:
        """Loads allocated by a server's allocator one op at a time; a shortfall or a raise
        gives back what every op took so far."""
        done: list[Op] = []
        try:
            for src in srcs:
                op = self._server_load(src)
                if op is None:
                    break
                done.append(op)
        except BaseException:
            self.give_back(done, "h2d")
            raise
        if len(done) == len(srcs):
            return done
        self.give_back(done, "h2d")
        return None

    # ---- checks ----------------------------------------------------------------------
    def _check_device_slots(self, name: str, slots: torch.Tensor) -> None:
        pool = self._device_pools[name]
        if name in self._server_alloc:  # the server's own slots: shape and range only
            check_pages(slots, pool.allocator.page_size, pool.num_tokens, label("device_indices", name))
        else:  # aligned, in range, not repeated, and allocated
            check_owned(pool.allocator, slots, label("device_indices", name))

    def _check_loadable(self, name: str, slots: torch.Tensor) -> None:
        alloc, what = self._host_pools[name].allocator, label("host_indices", name)
        pages = check_owned(alloc, slots, what, "never written, or freed")
        if not (self._host_stamp[name][pages] == alloc.generations(pages)).all():
            raise ValueError(f"{what}: slots were never written (backup not acked yet), or were "
                             f"freed and allocated again since their backup")

    def _check_server_slots(self, dst: dict[str, torch.Tensor]) -> None:
        """A server-supplied allocator must hand out distinct whole aligned pages in range."""
        try:
            for name in self._server_alloc & dst.keys():
                pool, what = self._device_pools[name], label("device_alloc", name)
                check_pages(dst[name], pool.allocator.page_size, pool.num_tokens, what)
                twice = first_duplicate(dst[name])
                if twice is not None:
                    raise ValueError(f"{what}: slot {twice} handed out twice in one call")
        except ValueError:
            free_all(dst, lambda n, s: self._free[n](s))
            raise

    # ---- host stamps and give-back -----------------------------------------------------
    def mark_written(self, host_indices: Any, extra: Mapping[str, Any] | None) -> None:
        """Host slots filled outside the controller become loadable (all checked first)."""
        src = edge_slots(self._stack, host_indices, extra, "host_indices")
        stamps = {}
        for name, slots in src.items():
            alloc = self._host_pools[name].allocator
            pages = check_owned(alloc, slots, label("host_indices", name), "never handed out, or freed")
            stamps[name] = (pages, alloc.generations(pages))
        for name, (pages, gens) in stamps.items():  # all checked first: all or nothing
            self._host_stamp[name][pages] = gens

    def stamp(self, ops: list[Op]) -> None:
        """Acked backups: their host pages are loadable while still that allocation."""
        for op in ops:
            for name, (pages, gens) in op.stamps.items():
                slot_arrays.put(self._host_stamp[name], pages, gens)

    def give_back(self, ops: list[Op], direction: str) -> list[str]:
        """Free the destination slots of ``ops`` (all of them, even if a free raises).

        Returns:
            The frees that raised, as messages (each also logged).
        """
        host = self._host_pools
        free = ((lambda n, s: host[n].free(s)) if direction == "d2h" else (lambda n, s: self._free[n](s)))
        return [e for op in ops for e in free_all(op.dst, free)]
