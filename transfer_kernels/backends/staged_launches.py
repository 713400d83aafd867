"""The prepared launches of the ``"dma"`` backend: per launch group, the group's DMA on
the ring's DMA stream and its one kernel launch on the caller's stream, ordered by events
(`staged`'s module docstring has the sequence and the call budget)."""
from __future__ import annotations

from transfer_kernels.backends.base import CopyBackend, Launches
from transfer_kernels.backends.ring import DmaQueue
from transfer_kernels.backends.staging import RingWork


class StagedLaunches(Launches):
    """The kernel's prepared launches with each group's DMA before (H2D) or after (D2H)
    it. Groups may launch in any order; each launches once. A launch reads its group's
    piece bounds from tuples and issues one slice: no per-launch array work.

    Args:
        backend: the ``"dma"`` backend (its launches are counted here).
        dma: its DMA calls and event ordering.
        inner: the kernel's prepared launches (scatter, gather, unstaged jobs).
        work: per direction, this plan's pieces in that direction's ring.
    """

    def __init__(self, backend: CopyBackend, dma: DmaQueue, inner: Launches,
                 work: dict[str, RingWork], num_groups: int) -> None:
        self.backend, self.dma, self.inner, self.work = backend, dma, inner, work
        self.h2d, self.d2h = work.get("h2d"), work.get("d2h")
        self._rings = tuple(w.ring for w in work.values())
        self._h2d_at = self._d2h_at = 0  # pieces issued so far, per ring
        self._launched = [False] * num_groups if self.d2h is not None else None
        self._prefix = 0  # groups 0.._prefix-1 have all launched
        self._current: int | None = None  # the caller's stream, from the first launch
        self._inner_launch = inner.launch  # bound once: no attribute chain per group
        self._h2d_ends = self.h2d.ends if self.h2d is not None else None

    @property
    def num_groups(self) -> int:
        return self.inner.num_groups

    def _launch(self, group: int) -> None:
        """Launch ``group`` with its DMA."""
        if self._current is None:
            self._start()
        else:
            for ring in self._rings:
                if ring.owner is not self:
                    raise RuntimeError("dma: a later load or backup started on this staging "
                                       "ring before this one's launches ended; launch a "
                                       "prepared plan's groups before starting another")
        try:
            ends = self._h2d_ends
            if ends is not None:
                end = ends[group]
                if end > self._h2d_at:
                    # the chunks groups up to this one read first; the caller's stream waits
                    self.dma.issue(self.h2d.ring, self.h2d.pieces[:, self._h2d_at:end], self._current)
                    self._h2d_at = end
            self._inner_launch(group)
            if self.d2h is not None:
                launched = self._launched
                launched[group] = True
                while self._prefix < len(launched) and launched[self._prefix]:
                    self._prefix += 1
                if self._prefix:
                    self._d2h(self.d2h, self.d2h.ends[self._prefix - 1])
        except BaseException:
            self._join()
            raise

    def _start(self) -> None:
        """First launch: claim the rings and order them after the caller's stream and the
        previous user."""
        b = self.dma
        for w in self.work.values():
            ring = w.ring
            ring.buffer()
            cur = self._current = ring.current()
            mark, done = ring.events
            if ring.direction == "h2d":  # the DMA writes the ring and reads the host
                b.record(ring, mark, cur)
                b.wait(ring, ring.stream, mark)
                if ring.last_stream not in (None, cur):  # an older load's scatter elsewhere
                    b.record(ring, done, ring.last_stream)
                    b.wait(ring, ring.stream, done)
            else:  # the gathers overwrite what the previous backup's DMA may still read
                b.record(ring, done, ring.stream)
                b.wait(ring, cur, done)
                if ring.last_stream not in (None, cur):  # an older backup's gathers elsewhere
                    b.record(ring, mark, ring.last_stream)
                    b.wait(ring, cur, mark)
            ring.owner, ring.last_stream = self, cur
        if self._current is None:
            self._current = 0

    def _d2h(self, w: RingWork, end: int) -> None:
        """DMA the chunks whose layers are all gathered, after the gathers; the caller's
        stream waits for it."""
        if end <= self._d2h_at:
            return
        b, ring = self.dma, w.ring
        b.record(ring, ring.events[0], self._current)
        b.wait(ring, ring.stream, ring.events[0])
        b.issue(ring, w.pieces[:, self._d2h_at:end], self._current)
        self._d2h_at = end

    def _join(self) -> None:
        """After a failure: the caller's stream waits for whatever the DMA streams hold."""
        if self._current is None:
            return
        for w in self.work.values():
            self.dma.record(w.ring, w.ring.events[1], w.ring.stream)
            self.dma.wait(w.ring, self._current, w.ring.events[1])
