"""What a route builds once per size class (`Prepared`) and what one load of it runs
(`Launches`): the load-time half of every backend.

    Route (per lane set) --one cache--> Prepared (per size class) --start(rows)--> Launches
                                        built once: layouts,          one load: indices
                                        staging, decisions            uploaded, then a
                                                                      launch per group

Every launch of every backend is counted in ONE place: :meth:`Launches.launch` (or
:meth:`Launches.run`, which counts a whole load's groups at once).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import torch

from transfer_kernels.cuda import runtime
from transfer_kernels.rows import Lane


class Launches(ABC):
    """The launch groups of one load, prepared: ``launch(g)`` enqueues group ``g`` on the
    current stream. Keeps whatever the launches read (staged indices) alive. Not
    thread-safe.

    Attributes:
        counters: the backends whose ``launches`` each counted launch increments (the
            backend that launches, and a router such as ``auto`` that chose it).
    """

    counters: tuple = ()

    @property
    @abstractmethod
    def num_groups(self) -> int:
        """How many launch groups there are."""

    def launch(self, group: int) -> None:
        """Enqueue group ``group`` (a no-op for an empty group); counted here."""
        if self.counts(group):
            for backend in self.counters:
                backend.launches += 1
            self._launch(group)

    def run(self, events: Sequence[Any], stream: Any) -> None:
        """Every group in order, each followed by a record of ``events[g]`` on ``stream``
        (``runtime.record``; ``None``: the current stream, no event on the CPU): a whole
        load. The loop a CUDA graph per size class would replace."""
        for g in range(self.num_groups):
            self.launch(g)
            runtime.record(events[g], stream)

    def counts(self, group: int) -> bool:
        """True when group ``group`` launches anything (the default: every group)."""
        return True

    def direct(self) -> Any:
        """A pre-bound launcher for ``runtime.launch(launcher, g)`` (uncounted), or ``None``
        when this object must be launched through :meth:`launch`."""
        return None

    @abstractmethod
    def _launch(self, group: int) -> None:
        """Enqueue group ``group`` (called once it counts)."""


class PartLaunches(Launches):
    """Several loads' launches over one set of groups: group ``g`` launches group ``g`` of
    every part, in order (the converting split, ``auto``'s inner backends); each part
    counts its own launches."""

    def __init__(self, parts: list[Launches], num_groups: int, counters: tuple = ()) -> None:
        self.parts, self._num_groups, self.counters = parts, num_groups, counters

    @property
    def num_groups(self) -> int:
        return self._num_groups

    def _launch(self, group: int) -> None:
        for part in self.parts:
            part.launch(group)


class Prepared(ABC):
    """Everything the loads of one size class of a route reuse, built once by
    `CopyBackend.lay_out`; :meth:`start` binds one load's rows.

    Attributes:
        counters: passed on to every `Launches` it starts.
        tag: what its route's caller keeps with it (`Route.prepare`).
    """

    counters: tuple = ()
    tag: Any = None

    @property
    @abstractmethod
    def num_groups(self) -> int:
        """How many launch groups a load of it has."""

    @abstractmethod
    def start(self, lanes: Sequence[Lane], src_rows: Sequence[torch.Tensor],
              dst_rows: Sequence[torch.Tensor]) -> Launches:
        """One load: its rows (per lane, int64 1-D, of this size class's counts) written
        where the launches read them (one upload at most); nothing launched yet.

        Args:
            lanes: the route's lanes, alive (a backend that copies through the tables reads
                them here; the kernels read only what was laid out).
        """


class PartPrepared(Prepared):
    """Several backends' prepared objects over one set of groups, each on some lanes."""

    def __init__(self, parts: list[tuple[Prepared, tuple[int, ...]]], num_groups: int) -> None:
        self.parts, self._num_groups = parts, num_groups

    @property
    def num_groups(self) -> int:
        return self._num_groups

    def start(self, lanes, src_rows, dst_rows) -> Launches:
        return PartLaunches([p.start([lanes[i] for i in idx], [src_rows[i] for i in idx],
                                     [dst_rows[i] for i in idx]) for p, idx in self.parts],
                            self._num_groups, self.counters)
