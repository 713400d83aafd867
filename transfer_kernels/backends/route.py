"""`Route`: how a fixed list of lanes moves on one backend, decided once.

A *lane* is a job without its rows (source table, destination table, layers). A route is
built once per lane set — by hicache's controller per (pool set, direction) when it is
constructed, or by a backend for the tables of a checked ``copy_rows`` call — and:

* decides from the tables alone, once (`CopyBackend.decide_lanes`): each lane's mover (DMA
  + scatter, kernel, copy engine, torch, int8 conversion), its staged host side and page
  span; the backend's checks of the tables run here, never per load;
* owns ONE cache: per *size class* (the row counts of a load, and whatever else its
  caller keys by), one `Prepared` built on the class's first load (`prepare`: layouts,
  staging, launch groups); every later load of the class finds it (``prepared[key]``)
  and only binds its rows (`Prepared.start`). A new class may share what does not
  depend on its size with the newest class already there (`prepare`: the triton layout's
  static part), through that class's prepared object: still one cache.

The route keeps its tables through weak references unless ``hold``: a cache of routes
never keeps a pool alive. A held route is a controller's: it owns its tables anyway, and
its loads run one at a time on one stream (one route per direction; the controller's lock),
so its prepared objects keep their device buffers from load to load (`CopyBackend.lay_out`'s
``keep``). A route that is not held may be loaded from any number of threads at once.
"""
from __future__ import annotations

import weakref
from types import MappingProxyType
from typing import Any, Hashable, Mapping, Sequence

import torch

from transfer_kernels.backends.launches import Prepared
from transfer_kernels.rows import CopyPlan, Lane, LaunchGroups, PlannedJob

CACHE_SIZE = 64  # size classes kept per route (a server's loads fall in a few)


class Route:
    """A lane set's decisions and its prepared objects (module docstring).

    Args:
        backend: the `CopyBackend` that moves the lanes.
        lanes: per job, (src, dst, layers); ``layers`` table-local.
        device: where the copies execute (``rows.plan.exec_device`` of the lanes).
        hold: keep the tables alive (else weak references); the loads of the route run one
            at a time on one stream (its prepared objects keep their device buffers).

    Raises:
        ValueError: the backend cannot move these tables (its check, made once here).
    """

    def __init__(self, backend: Any, lanes: Sequence[Lane], device: torch.device,
                 hold: bool = True) -> None:
        self.backend, self.device = backend, device
        lanes = tuple(Lane(lane.src, lane.dst, tuple(lane.layers)) for lane in lanes)
        self._held = lanes if hold else None
        self._refs = tuple((weakref.ref(l.src), weakref.ref(l.dst), l.layers) for l in lanes)
        self.decided = backend.decide_lanes(lanes_plan(lanes, device))
        self._by_class: dict[Hashable, Prepared] = {}
        # the cache, read-only outside: a warm load's look-up is one C call, no frame here
        self.prepared: Mapping[Hashable, Prepared] = MappingProxyType(self._by_class)
        self.built = 0  # prepared objects built (cache misses)

    @property
    def lanes(self) -> tuple[Lane, ...]:
        """The lanes (their tables must still be alive)."""
        if self._held is not None:
            return self._held
        return tuple(Lane(src(), dst(), layers) for src, dst, layers in self._refs)

    @property
    def alive(self) -> bool:
        """True while every table of the route is alive."""
        return all(src() is not None and dst() is not None for src, dst, _ in self._refs)

    def holds(self, jobs: Sequence[PlannedJob]) -> bool:
        """True when ``jobs`` are this route's lanes (same table objects, same layers)."""
        if len(jobs) != len(self._refs):
            return False
        for job, (src, dst, layers) in zip(jobs, self._refs):
            if src() is not job.src or dst() is not job.dst or job.layers != layers:
                return False
        return True

    def prepare(self, key: Hashable, plan: CopyPlan, groups: LaunchGroups, tag: Any = None) -> Prepared:
        """Build the size class ``key``'s prepared object from ``plan`` (its first load: the
        lanes with its rows) and ``groups``, and keep it (``prepared[key]`` from now on;
        the oldest class goes beyond `CACHE_SIZE`). The newest class's prepared object is
        offered to the backend (`CopyBackend.lay_out`'s ``like``): what does not depend on
        the size class is shared with it where it fits, not built again.

        Under the backend's lock: threads that miss the same class at once build it once.

        Args:
            tag: kept on the prepared object for its caller (e.g. its groups' model-layer
                bounds).
        """
        with self.backend.lock:
            got = self._by_class.get(key)
            if got is not None:
                return got
            like = next(reversed(self._by_class.values()), None)  # the newest class, offered
            got = self.backend.lay_out(plan, groups, self.decided, self._held is not None, like)
            got.tag = tag
            self.built += 1
            if len(self._by_class) >= CACHE_SIZE:
                del self._by_class[next(iter(self._by_class))]
            self._by_class[key] = got
        return got

    def plan(self, src_rows: Sequence[torch.Tensor], dst_rows: Sequence[torch.Tensor]) -> CopyPlan:
        """The plan of one load: the lanes with these rows (trusted: the caller derived them
        from indices it validated)."""
        return CopyPlan(tuple(PlannedJob(l.src, l.dst, s, d, l.layers)
                              for l, s, d in zip(self.lanes, src_rows, dst_rows)), self.device)


def lanes_plan(lanes: Sequence[Lane], device: torch.device) -> CopyPlan:
    """The lanes as a plan without rows: what a backend decides and checks from."""
    empty = torch.empty(0, dtype=torch.int64)
    return CopyPlan(tuple(PlannedJob(l.src, l.dst, empty, empty, tuple(l.layers)) for l in lanes),
                    device)
