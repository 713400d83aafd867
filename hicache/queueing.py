"""Queueing of `HybridCacheController`: ``write`` / ``load`` / ``mark_host_written``.

What a server passes is coerced and checked here, once (``hicache.slots``); the radix
tree passes ``trusted=True`` with slots it checked itself. Destination pages come
straight from the controller's own allocators, all or nothing (a server's ``device_alloc``
is checked like a caller's slots). A queued op waits for ``start_writing`` /
``start_loading`` (`hicache.controller`).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from hicache.batch import MergedOps, Op, merge_slots
from hicache.slots import alloc_all, alloc_pages_many, check_owned, check_pages, edge_slots, free_all
from transfer_kernels.rows import first_duplicate


class QueueingMixin:
    """``write``, ``load`` and ``mark_host_written`` of `HybridCacheController`."""

    def write(self, device_indices: Any, extra: Mapping[str, Any] | None = None, *,
              trusted: bool = False) -> dict[str, torch.Tensor] | None:
        """Queue a backup of device slots; allocate their host slots all-or-nothing.

        Args:
            device_indices: anchor device token slots (whole pages; an int64 CPU tensor,
                a list or a numpy array; empty when only ``extra`` moves).
            extra: device slots of other own-indexed pools, e.g. ``{"swa": slots}``.
            trusted: skip the coercion and every check of the slots (an internal caller
                such as the radix tree, which validated them itself). The caller then
                guarantees: ``device_indices`` and each ``extra`` value are 1-D int64
                contiguous CPU tensors (possibly empty) of whole aligned pages of their
                pool, in range, not repeated, currently allocated on the device;
                ``extra`` is ``None`` or a dict keyed by own-indexed pools other than the
                anchor; at least one tensor is non-empty. A broken promise is undefined
                behaviour (wrong rows copied, or an error at launch).
        Returns:
            Host slots keyed by pool name, or ``None`` if any host pool is short (nothing
            is allocated or queued then). The op's id is ``last_op_id`` afterwards. The
            tensors are the queued op's own: read-only until its ack (the batch derives
            its rows from them at ``start_writing``). The caller's own tensors are copied
            here (unless ``trusted``): reusing them afterwards changes nothing queued.
        Raises:
            ValueError: slots that are unaligned, out of range, repeated, on a CUDA device
                or not allocated on the device; ``extra`` naming a pool that is not an
                own-indexed pool of the stack. Nothing changes.
            RuntimeError: the controller is closed.
        """
        src = self._sources(device_indices, extra, trusted, "device_indices", self._check_device_slots)
        got = alloc_pages_many(self._host_allocs, [src], lambda _, n: _label("device_indices", n), "host")
        if got is None:
            return None
        return self._enqueue(Op(-1, "d2h", src, got.slots[0], got.stamps[0]))

    def _sources(self, anchor: Any, extra: Mapping[str, Any] | None, trusted: bool, what: str,
                 check: Callable[[str, torch.Tensor], None]) -> dict[str, torch.Tensor]:
        """A call's source slots keyed by pool: trusted as given, else coerced and each
        pool's slots checked by ``check(name, slots)``."""
        self._check_open()
        if trusted:
            return self._trusted_slots(anchor, extra, what)
        src = edge_slots(self.stack, anchor, extra, what)
        for name, slots in src.items():
            check(name, slots)
        return src

    def _check_device_slots(self, name: str, slots: torch.Tensor) -> None:
        pool = self.device_pools[name]
        if name in self._server_alloc:  # the server's own slots: shape and range only
            check_pages(slots, pool.allocator.page_size, pool.num_tokens, _label("device_indices", name))
        else:  # aligned, in range, not repeated, and allocated
            check_owned(pool.allocator, slots, _label("device_indices", name))

    def _trusted_slots(self, anchor: torch.Tensor, extra: dict[str, torch.Tensor] | None,
                       what: str) -> dict[str, torch.Tensor]:
        """A trusted call's slots keyed by pool, empty ones dropped (no other check)."""
        src = {self._anchor: anchor} if anchor.numel() else {}
        if extra:
            for name, slots in extra.items():
                if slots.numel():
                    src[name] = slots
        if not src:
            raise ValueError(f"{what}: nothing to transfer (empty anchor slots and no extra)")
        return src

    def load(self, host_indices: Any, extra: Mapping[str, Any] | None = None, *,
             trusted: bool = False) -> dict[str, torch.Tensor] | None:
        """Queue a load of host slots; allocate their device slots all-or-nothing.

        Args:
            host_indices: anchor host token slots from an acked ``write`` (whole pages).
            extra: host slots of other own-indexed pools, e.g. ``{"swa": slots}``.
            trusted: skip the coercion and every check of the slots (an internal caller
                such as the radix tree). The caller guarantees what ``write(trusted=True)``
                lists, for host slots, and that every page was filled by an acked
                ``write`` (or declared by ``mark_host_written``) and not freed since.
                A server-supplied ``device_alloc``'s slots are still checked.
        Returns:
            Device slots keyed by pool name, or ``None`` if any device pool is short;
            read-only until the op's ack, as for ``write``.
        Raises:
            ValueError: bad slots or pool names, or host slots that were never written
                (backup not acked), were freed, or were freed and allocated again since.
                Also when a server allocator hands out bad slots (they are given back).
            RuntimeError: the controller is closed.
        """
        src = self._sources(host_indices, extra, trusted, "host_indices", self._check_loadable)
        if not self._server_alloc:  # the device pools' own allocators: pages straight from them
            got = alloc_pages_many(self._device_allocs, [src], lambda _, n: _label("host_indices", n),
                                   "device")
            return None if got is None else self._enqueue(Op(-1, "h2d", src, got.slots[0], got.stamps[0]))
        # a server's allocator: its slots are coerced and checked
        dst = alloc_all(src, lambda n, k: self._alloc[n](k), lambda n, s: self._free[n](s),
                        self._server_alloc)
        if dst is None:
            return None
        self._check_server_slots(dst)
        return self._enqueue(Op(-1, "h2d", src, dst))

    def _check_server_slots(self, dst: dict[str, torch.Tensor]) -> None:
        """A server-supplied allocator must hand out distinct whole aligned pages in range."""
        try:
            for name in self._server_alloc & dst.keys():
                pool, what = self.device_pools[name], _label("device_alloc", name)
                check_pages(dst[name], pool.allocator.page_size, pool.num_tokens, what)
                twice = first_duplicate(dst[name])
                if twice is not None:
                    raise ValueError(f"{what}: slot {twice} handed out twice in one call")
        except ValueError:
            free_all(dst, lambda n, s: self._free[n](s))
            raise

    def load_many(self, requests: Sequence[tuple[Any, Mapping[str, Any] | None]], *,
                  trusted: bool = False) -> list[dict[str, torch.Tensor]] | None:
        """Queue several loads at once: one allocator call per device pool for all of them,
        and their slots merged once, here (``start_loading`` then merges nothing).

        Each request is checked as ``load(host_indices, extra, trusted=...)`` checks it;
        the set is all or nothing. With a server ``device_alloc`` each op allocates on its
        own (still all or nothing). The ops get consecutive ids (``last_op_id`` is the last).

        Args:
            requests: ``(host_indices, extra)`` pairs (``extra`` may be ``None``).
            trusted: as for :meth:`load`, for every request.
        Returns:
            Per request, its device slots keyed by pool (as :meth:`load` returns them), or
            ``None`` when a device pool is short for the sum (nothing allocated or queued).
        Raises:
            ValueError / TypeError: a bad request, naming ``requests[i]``; nothing changes
                (also when an allocator raises: what it took is given back, then it re-raises).
            RuntimeError: the controller is closed.
        """
        return self._many("h2d", requests, trusted)

    def write_many(self, requests: Sequence[tuple[Any, Mapping[str, Any] | None]], *,
                   trusted: bool = False) -> list[dict[str, torch.Tensor]] | None:
        """Queue several backups at once; :meth:`load_many` for ``write``: one host
        allocator call per pool, all or nothing.

        Args:
            requests: ``(device_indices, extra)`` pairs (``extra`` may be ``None``).
            trusted: as for :meth:`write`, for every request.
        Returns:
            Per request, its host slots keyed by pool, or ``None`` when a host pool is short.
        Raises:
            ValueError / TypeError: a bad request, naming ``requests[i]``; nothing changes.
            RuntimeError: the controller is closed.
        """
        return self._many("d2h", requests, trusted)

    def _many(self, direction: str, requests: Any, trusted: bool) -> list[dict] | None:
        load = direction == "h2d"
        what, check = (("host_indices", self._check_loadable) if load
                       else ("device_indices", self._check_device_slots))
        srcs = []
        for i, (anchor, extra) in enumerate(_requests(requests)):
            try:
                srcs.append(self._sources(anchor, extra, trusted, what, check))
            except (ValueError, TypeError) as exc:  # name the request; nothing was taken yet
                raise type(exc)(f"requests[{i}]: {exc}") from None
        if not srcs:
            self._check_open()
            return []
        if load and self._server_alloc:  # a server's allocator, op by op: undone if one fails
            return self._load_each(srcs)
        allocs = self._device_allocs if load else self._host_allocs
        got = alloc_pages_many(allocs, srcs, lambda i, n: f"requests[{i}]: {_label(what, n)}",
                               "device" if load else "host")
        if got is None:
            return None
        merged = MergedOps(merge_slots(srcs), got.merged, len(srcs))
        return [self._enqueue(Op(-1, direction, src, dst, stamps, merged))
                for src, dst, stamps in zip(srcs, got.slots, got.stamps)]

    def _load_each(self, srcs: list[dict[str, torch.Tensor]]) -> list[dict] | None:
        """Loads allocated by a server's allocator one op at a time; a shortfall or a raise
        gives back every op queued so far (and ``last_op_id`` is as before)."""
        queue, done, last = self._queues["h2d"], [], self.last_op_id
        try:
            for src in srcs:
                dst = alloc_all(src, lambda n, k: self._alloc[n](k), lambda n, sl: self._free[n](sl),
                                self._server_alloc)
                if dst is None:
                    break
                self._check_server_slots(dst)
                done.append(self._enqueue(Op(-1, "h2d", src, dst)))
        except BaseException:
            self._unqueue(queue, len(done), last)
            raise
        if len(done) == len(srcs):
            return done
        self._unqueue(queue, len(done), last)
        return None

    def _unqueue(self, queue: list, count: int, last_op_id: int) -> None:
        """Drop the last ``count`` queued ops and give back their device slots."""
        for _ in range(count):
            free_all(queue.pop().dst, lambda n, sl: self._free[n](sl))
        self.last_op_id = last_op_id

    def mark_host_written(self, host_indices: Any, extra: Mapping[str, Any] | None = None) -> None:
        """Declare host slots that were filled outside the controller loadable.

        For host pages whose bytes came from elsewhere (the storage tier reads pages
        straight into host slots): the caller allocated the slots from the host pools and
        wrote every data pool rooted at them. Afterwards ``load`` accepts them, exactly as
        after an acked ``write``, until they are freed.

        Args:
            host_indices: anchor host slots (whole pages; empty when only ``extra`` is given).
            extra: host slots of other own-indexed pools, e.g. ``{"swa": slots}``.
        Raises:
            ValueError: bad slots or pool names, or slots that are not allocated (nothing changes).
            RuntimeError: the controller is closed.
        """
        self._check_open()
        src = edge_slots(self.stack, host_indices, extra, "host_indices")
        stamps = {}
        for name, slots in src.items():
            alloc = self.host_group.pools[name].allocator
            pages = check_owned(alloc, slots, _label("host_indices", name), "never handed out, or freed")
            stamps[name] = (pages, alloc.generations(pages))
        for name, (pages, gens) in stamps.items():  # all checked first: all or nothing
            self._host_stamp[name][pages] = gens

    def _check_loadable(self, name: str, slots: torch.Tensor) -> None:
        pool = self.host_group.pools[name]
        what = _label("host_indices", name)
        pages = check_owned(pool.allocator, slots, what, "never written, or freed")
        if not (self._host_stamp[name][pages] == pool.allocator.generations(pages)).all():
            raise ValueError(f"{what}: slots were never written (backup not acked yet), or were "
                             f"freed and allocated again since their backup")

    def _enqueue(self, op: Op) -> dict[str, torch.Tensor]:
        op.op_id = self.last_op_id = next(self._ids)
        self._queues[op.direction].append(op)
        return dict(op.dst)


def _label(what: str, pool: str) -> str:
    return f"{what} (pool {pool!r})"


def _requests(requests: Any) -> list[tuple[Any, Any]]:
    """``requests`` as a list of ``(slots, extra)`` pairs (``TypeError`` naming the bad one)."""
    if not isinstance(requests, (list, tuple)):
        raise TypeError(f"requests: must be a list of (slots, extra) pairs, got {type(requests).__name__}")
    for i, req in enumerate(requests):
        if not isinstance(req, tuple) or len(req) != 2:
            raise TypeError(f"requests[{i}]: must be a (slots, extra) pair, got {type(req).__name__}")
    return list(requests)
