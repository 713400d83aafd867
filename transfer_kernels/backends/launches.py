"""The load-time half of every backend: what a route builds once per size class
(`Prepared`: the backends' steps) and what one load of it runs (`Launches`: THE loop).

    Route --one cache--> Prepared (per size class) --start(rows)--> Launches (one load)
                         a `Kernel` step, ring layouts,           rows bound (one upload),
                         who counts                               then per group g:
        DMA slice into the ring (H2D) -> runtime.launch(launcher, g) -> DMA of the chunks
        complete after g (D2H) -> record events[g]

`Launches._go` is the library's only per-group loop and the only place launches are
counted (`LaunchCount`, once they ran). Every launch goes through ``runtime.launch``: the
public hook where tests observe them.

Threads: loads of one backend run from any number of threads (a load itself is its
caller's). A staged load holds each of its rings (`take`) from its first launch to its last
(or its failure, or its being dropped): another thread's load waits; a later load of the
SAME thread takes the ring over and the older one raises at its next launch. On CUDA the
holder records the ring's ``free`` event on its stream at release, after the last kernel
that used the ring; a holder on another stream waits for it before its first DMA (H2D) or
gather (D2H). The ring's own stream keeps the DMA in order.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from abc import ABC, abstractmethod
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from transfer_kernels.cuda import runtime
from transfer_kernels.rows import Lane

Counts = tuple  # ((LaunchCount, per group: launches or not), ...)
ENDED = "this load's launches ended (its rings may hold another load's bytes now); start a new load"
TAKEN = ("a later load or backup started on this staging ring before this one's launches ended; "
         "launch a prepared plan's groups before starting another")


class LaunchCount:
    """A backend's launch count; safe from any number of threads. Only `Launches` adds."""

    __slots__ = ("value", "_lock")

    def __init__(self) -> None:
        self.value, self._lock = 0, threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


class Kernel(ABC):
    """A size class's kernel step: ``live`` (per group: launches or not), ``counts`` (who
    counts its launches, each with its own ``live``)."""

    live: Sequence = ()
    counts: Counts = ()

    @abstractmethod
    def bind(self, lanes: Sequence[Lane], src_rows: Sequence[torch.Tensor],
             dst_rows: Sequence[torch.Tensor]) -> Any:
        """One load's launcher (``launch(g)`` enqueues group g on the current stream), or
        ``None`` when no group launches."""


class Upload(Kernel):
    """A kernel whose launches read one int64 buffer: ``head``, the load's rows (per job of
    ``order``: its (src, dst) rows, or (dst, src) when the flag is False), ``tail``, moved in
    ONE upload. With ``keep`` (a route whose loads share one stream) the first load's
    buffer and launcher are kept, and a later load only writes its rows into it."""

    def __init__(self, device: torch.device, order: tuple[tuple[int, bool], ...],
                 head: torch.Tensor | None, tail: torch.Tensor | None, keep: bool) -> None:
        self.device, self.order, self.head, self.tail, self.keep = device, order, head, tail, keep
        self._kept: tuple[torch.Tensor, Any] | None = None  # (the rows' part of the buffer, launcher)

    def bind(self, lanes, src_rows, dst_rows) -> Any:
        if not any(self.live):
            return None
        rows = []
        for j, src_first in self.order:
            rows += (src_rows[j], dst_rows[j]) if src_first else (dst_rows[j], src_rows[j])
        kept = self._kept
        if kept is not None:  # the rows into the kept buffer: one copy
            runtime.upload(rows, self.device, out=kept[0])
            return kept[1]
        head, tail = [] if self.head is None else [self.head], [] if self.tail is None else [self.tail]
        meta = runtime.upload(head + rows + tail, self.device)
        launcher = self.launcher(meta)
        if self.keep:
            at = 0 if self.head is None else self.head.numel()
            self._kept = (meta[at:meta.numel() - (0 if self.tail is None else self.tail.numel())], launcher)
        return launcher

    @abstractmethod
    def launcher(self, meta: torch.Tensor) -> Any:
        """The pre-bound launcher over one load's buffer."""


class RingWork(NamedTuple):
    """One ring's DMA of one load: pieces in issue order and, per group, the end of the
    pieces issued by then."""

    ring: Any  # `ring.Ring`
    pieces: np.ndarray  # uint64 [3, P] (dst, src, bytes), sorted by the group issuing them
    ends: tuple[int, ...]  # per group


class Prepared:
    """Everything the loads of one size class of a route reuse, built once by
    `CopyBackend.lay_out`: the kernel step and, staged, the rings' layouts (``rings``) and
    the jobs whose side the kernel reads from staging (``swaps``: (job, staging table, its
    rows 0..n-1, h2d)). `start` binds one load's rows.

    Attributes:
        counts: who counts this class's launches (the kernel's backends, then outer ones
            such as ``dma`` or ``auto``: `count_by`).
        stages: the staged jobs (for inspection: ``bench/dma_plan.py``).
        tag: what its route's caller keeps with it (`Route.prepare`).
    """

    def __init__(self, kernel: Kernel, rings: tuple = (), swaps: tuple = (), stages: tuple = (),
                 counts: Counts | None = None) -> None:
        self.kernel, self.live = kernel, kernel.live
        self.counts = kernel.counts if counts is None else counts
        self.rings, self.swaps, self.stages, self.tag = rings, swaps, stages, None

    @property
    def num_groups(self) -> int:
        return len(self.live)

    def count_by(self, *counts: LaunchCount) -> Prepared:
        """Count every launch of this class on ``counts`` too (before it is cached)."""
        self.counts += tuple((c, self.live) for c in counts)
        return self

    def start(self, lanes: Sequence[Lane], src_rows: Sequence[torch.Tensor],
              dst_rows: Sequence[torch.Tensor]) -> Launches:
        """One load: its rows (per lane, int64 1-D, of this class's counts; ``lanes``: the
        route's, alive) where the launches read them: one upload at most, one vectorized
        pass per ring. Nothing launched yet."""
        work = []
        for lay in self.rings:  # this load's host rows, concatenated (one torch call)
            h2d = lay.ring.direction == "h2d"
            rows = [(src_rows if h2d else dst_rows)[j] for j in lay.jobs]
            rows = (torch.cat(rows) if len(rows) > 1 else rows[0]).numpy()
            pieces = lay.fixed.copy()  # the fixed fields plus each piece's host row
            pieces[1 if h2d else 0] += rows[lay.row] * lay.span
            work.append(RingWork(lay.ring, pieces.view(np.uint64), lay.ends))
        if self.swaps:  # the kernel's side of each staged job is its staging table
            lanes, src_rows, dst_rows = list(lanes), list(src_rows), list(dst_rows)
            for j, staging, local, h2d in self.swaps:
                lane = lanes[j]
                if h2d:
                    lanes[j], src_rows[j] = Lane(staging, lane.dst, lane.layers), local
                else:
                    lanes[j], dst_rows[j] = Lane(lane.src, staging, lane.layers), local
        return Launches(self, self.kernel.bind(lanes, src_rows, dst_rows), tuple(work))


class Launches:
    """One load of a `Prepared`: its launcher, its DMA work per ring, and the loop.
    `run` launches every group, each followed by its event; `launch` one group (groups in
    any order, each once). A load is its caller's; loads run from any number of threads."""

    def __init__(self, prepared: Prepared, launcher: Any, work: tuple[RingWork, ...]) -> None:
        self.prepared, self.launcher, self.work = prepared, launcher, work
        self.num_groups = len(prepared.live)
        self._h2d = next((w for w in work if w.ring.direction == "h2d"), None)
        self._d2h = next((w for w in work if w.ring.direction == "d2h"), None)
        self._h2d_at = self._d2h_at = self._prefix = 0  # pieces issued per ring; D2H: groups done
        self._done: list[bool] | None = None  # D2H: which groups launched
        self._claim: Claim | None = None
        self._left: set[int] | None = None  # `launch`: the groups not launched yet
        self._dropped: weakref.finalize | None = None  # `launch`: gives the rings back if dropped

    def run(self, events: Sequence[Any], stream: Any) -> None:
        """Every group in order, each followed by a record of ``events[g]`` on ``stream``
        (``runtime.record``; ``None``: the current stream, no event on the CPU): a whole
        load, its rings held throughout. The loop a CUDA graph per size class would replace."""
        if self.work:
            self._hold()
        self._go(range(self.num_groups), events, stream)
        if self.work:
            self._release(ENDED)

    def launch(self, group: int) -> None:
        """Launch group ``group`` (nothing for a group without launches), with its DMA; a
        staged load holds its rings until its last group (or until it is dropped)."""
        if not self.work:
            self._go((group,), None, None)
            return
        first = self._claim is None
        self._hold()
        self._go((group,), None, None)
        if self._left is None:
            self._left = set(range(self.num_groups))
        self._left.discard(group)
        if not self._left:
            self._release(ENDED)
        elif first:  # a load dropped before its last group gives its rings back
            self._dropped = weakref.finalize(self, _drop, self._claim, tuple(w.ring for w in self.work))

    def _go(self, groups: Sequence[int], events: Sequence[Any] | None, stream: Any) -> None:
        """THE loop (module docstring), counted once it ran."""
        launcher, live, launch, record = self.launcher, self.prepared.live, runtime.launch, runtime.record
        h2d, d2h, done = self._h2d, self._d2h, 0
        try:
            for g in groups:
                if h2d is not None and h2d.ends[g] > self._h2d_at:
                    end = h2d.ends[g]  # the chunks groups up to g read first; the caller waits
                    h2d.ring.dma.issue(h2d.ring, h2d.pieces[:, self._h2d_at:end], self._claim.stream)
                    self._h2d_at = end
                if live[g]:
                    launch(launcher, g)
                if d2h is not None:
                    self._gathered(d2h, g)
                if events is not None:
                    record(events[g], stream)
                done += 1
        except BaseException:
            self._count(groups, done)
            if self.work:
                self._join()
                self._release("this load failed at a launch: its rings went back; start a new load")
            raise
        self._count(groups, done)

    def _count(self, groups: Sequence[int], done: int) -> None:
        """The launches of ``groups[:done]``, for every backend counting this load's."""
        for count, live in self.prepared.counts:
            n = sum(1 for g in groups[:done] if live[g])
            if n:
                count.add(n)

    def _gathered(self, w: RingWork, group: int) -> None:
        """D2H: DMA the chunks whose layers are all gathered now, after the gathers (the
        caller's stream waits for it)."""
        if self._done is None:
            self._done = [False] * self.num_groups
        done = self._done
        done[group] = True
        while self._prefix < len(done) and done[self._prefix]:
            self._prefix += 1
        end = w.ends[self._prefix - 1] if self._prefix else 0
        if end > self._d2h_at:
            ring, cur = w.ring, self._claim.stream
            ring.dma.record(ring, ring.events[0], cur)
            ring.dma.wait(ring, ring.stream, ring.events[0])
            ring.dma.issue(ring, w.pieces[:, self._d2h_at:end], cur)
            self._d2h_at = end

    def _hold(self) -> None:
        """Hold every ring of the load (`take`; h2d, then d2h: one order for every load),
        once; later, refuse a load whose rings were taken or that ended."""
        claim = self._claim
        if claim is None:
            self._claim = claim = Claim(threading.get_ident(), runtime.stream_handle(self.work[0].ring.device))
            for w in self.work:
                take(w.ring, claim)
        elif claim.ended:
            raise RuntimeError(f"dma: {claim.ended}")

    def _release(self, why: str) -> None:
        self._claim.ended = self._claim.ended or why
        for w in self.work:
            give(w.ring, self._claim)
        if self._dropped is not None:
            self._dropped.detach()

    def _join(self) -> None:
        """After a failure: the caller's stream waits for whatever the DMA streams hold."""
        for w in self.work:
            w.ring.dma.record(w.ring, w.ring.events[1], w.ring.stream)
            w.ring.dma.wait(w.ring, self._claim.stream, w.ring.events[1])


class Claim:
    """A load's hold on its rings: its thread and stream; why it may launch no more."""

    __slots__ = ("thread", "stream", "ended")

    def __init__(self, thread: int, stream: int) -> None:
        self.thread, self.stream, self.ended = thread, stream, ""


def take(ring: Any, claim: Claim) -> None:
    """Hold ``ring`` for ``claim``'s load, ordered after its previous holder (module
    docstring): wait while another thread's load holds it; take it from this thread's."""
    with ring.cond:
        while ring.holder is not None and ring.holder.thread != claim.thread:
            ring.cond.wait()
        old, ring.holder = ring.holder, claim
        if old is not None:  # this thread's load that has not ended: it comes first, then stops
            old.ended = TAKEN
            _freed(ring, old)
    dma, cur, (mark, done, free) = ring.dma, claim.stream, ring.events
    if ring.direction == "h2d":  # the DMA writes the ring and reads the host
        dma.record(ring, mark, cur)
        dma.wait(ring, ring.stream, mark)
        if ring.freed_on not in (None, cur):  # the previous load's scatters ran elsewhere
            dma.wait(ring, ring.stream, free)
    else:  # the gathers overwrite what the previous backup's DMA may still read
        dma.record(ring, done, ring.stream)
        dma.wait(ring, cur, done)
        if ring.freed_on not in (None, cur):  # the previous backup's gathers ran elsewhere
            dma.wait(ring, cur, free)


def give(ring: Any, claim: Claim) -> None:
    """Release ``ring`` if ``claim`` holds it: its ``free`` event recorded on the holder's
    stream (after the last kernel that read or wrote the ring), then the next one in."""
    with ring.cond:
        if ring.holder is claim:
            _freed(ring, claim)
            ring.holder = None
            ring.cond.notify()


def _freed(ring: Any, claim: Claim) -> None:
    ring.dma.record(ring, ring.events[2], claim.stream)
    ring.freed_on = claim.stream


def _drop(claim: Claim, rings: tuple) -> None:
    """A load dropped before its last group: its rings go back (from any thread)."""
    claim.ended = claim.ended or "dropped"
    for ring in rings:
        with torch.cuda.device(ring.device) if ring.cuda else contextlib.nullcontext():
            give(ring, claim)
