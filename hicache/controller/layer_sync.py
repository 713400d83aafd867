"""`LayerDoneCounter`: per-layer completion events of a batch being loaded.

The load stream records one event per launch group of consecutive model layers as their
rows land (``record_span``; one event serves every layer of the group); the model's
compute stream waits for layer ``i`` right before it reads layer ``i``, so attention on
early layers overlaps the copies of later ones. A small ring of event sets lets the next
batch start loading while the previous one is still being consumed. The CPU never blocks.

    producer (load stream):  begin() -> k   record_span(0, 2, k) record_span(2, 3, k) ...
                             (a load: group_events(k, bounds), recorded by its launch loop)
    consumer (compute):      wait_until(0, k) ... wait_until(L-1, k)
    ring:  k = 0, 1, ..., ring-1, 0, ...   (a slot is reused ring batches later)

In CPU mode copies are synchronous: every method is a no-op apart from the bookkeeping.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from transfer_kernels import runtime


class LayerDoneCounter:
    """Ring of per-layer event sets shared by the load stream and the compute stream.

    Args:
        num_layers: model layers per batch.
        device: ``cpu`` (no events) or a CUDA device.
        ring: event sets in flight at once (>= 1).
        stream: the stream records go to (the controller's load stream), resolved once:
            a record then looks nothing up; ``None``: the current stream.
    Not thread-safe: driven by the scheduler thread.
    """

    def __init__(self, num_layers: int, device: torch.device | str = "cpu", ring: int = 3,
                 stream: Any = None) -> None:
        if num_layers < 0:
            raise ValueError(f"num_layers: must be >= 0, got {num_layers}")
        if ring < 1:
            raise ValueError(f"ring: must be >= 1, got {ring}")
        self.num_layers, self.ring = num_layers, ring
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._events = ([[torch.cuda.Event() for _ in range(num_layers)] for _ in range(ring)]
                        if self._cuda else None)
        # per slot, the event each layer waits on (a group's layers share its first's)
        self._waits = [list(events) for events in self._events] if self._cuda else None
        self._next = 0
        self.consumer = 0
        self.stream = stream

    def begin(self) -> int:
        """Take the next ring slot for a new batch; returns its consumer index."""
        k = self._next
        self._next = (k + 1) % self.ring
        return k

    def record(self, layer: int, index: int) -> None:
        """Mark ``layer`` of batch ``index`` done on the current (load) stream."""
        self.record_span(layer, layer + 1, index)

    def record_span(self, first: int, end: int, index: int) -> None:
        """Mark layers ``[first, end)`` of batch ``index`` done on ``stream`` (the load
        stream; ``None``: the current one): one event record for all of them, made through
        ``runtime.record`` on the CPU too (a record of no event), so the call count is
        the same on every device."""
        if end <= first:
            return
        if not self._cuda:
            runtime.record(None, None)
            return
        event = self._events[index][first]
        runtime.record(event, self.stream)
        self._waits[index][first:end] = (event,) * (end - first)

    def group_events(self, index: int, bounds: Sequence[int]) -> Sequence[Any]:
        """The events a load of batch ``index`` records, one per launch group: group ``g``
        (model layers ``bounds[g] .. bounds[g + 1] - 1``) records its first layer's event,
        which every layer of the group waits on (``record_span`` made by the loader's own
        loop: `transfer_kernels` ``Launches.run``). On the CPU ``None`` per group (a record
        of no event)."""
        if not self._cuda:
            return (None,) * (len(bounds) - 1)
        events, waits, out = self._events[index], self._waits[index], []
        for first, end in zip(bounds, bounds[1:]):
            event = events[first]
            waits[first:end] = (event,) * (end - first)
            out.append(event)
        return out

    def record_all(self, index: int) -> None:
        """Mark every layer of batch ``index`` done now (a rolled-back batch: waiters
        must not hang, nor pass before what was already enqueued has finished)."""
        self.record_span(0, self.num_layers, index)

    def event(self, layer: int, index: int | None = None) -> Any:
        """The CUDA event ``wait_until(layer, index)`` waits on (``None`` on CPU): for
        benchmarks and tests that time or synchronize on a layer."""
        if not self._cuda:
            return None
        return self._waits[self.consumer if index is None else index][layer]

    def set_consumer(self, index: int) -> None:
        """Select the batch the compute stream waits on by default."""
        if not 0 <= index < self.ring:
            raise ValueError(f"index: must be in [0, {self.ring}), got {index}")
        self.consumer = index

    def wait_until(self, layer: int, index: int | None = None) -> None:
        """Make the *current* (compute) stream wait until ``layer`` of the batch has landed.

        Raises:
            ValueError: ``layer`` outside ``[0, num_layers)``.
        """
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer: must be in [0, {self.num_layers}), got {layer}")
        if self._cuda:
            k = self.consumer if index is None else index
            torch.cuda.current_stream(self.device).wait_event(self._waits[k][layer])


class OnStream:
    """Make ``stream`` current, ordered after the current stream (kept as ``outer``), and
    restore ``outer`` on exit; a no-op on CPU (``stream`` is ``None``).

    Reusable, not re-entrant (the controller keeps one per copy stream): its ordering
    event is created once and recorded anew on each entry (a wait sees the latest record
    made before it). When the current device is the stream's, entering costs one stream
    lookup, one record, one wait and one ``set_stream`` (``torch.cuda.stream()`` and
    ``wait_stream`` would add a lookup, a set and an event creation), and the stream is
    declared to ``transfer_kernels.runtime`` meanwhile (launches then look up neither the
    stream nor the device); on another device it falls back to ``torch.cuda.stream``.
    """

    def __init__(self, stream: Any) -> None:
        self.stream, self.ctx, self.outer, self._declared = stream, None, None, None
        self._order = torch.cuda.Event() if stream is not None else None
        # (device index, raw handle): declared to ``runtime`` while current (no lookups)
        self._bound = None if stream is None else (stream.device.index, stream.cuda_stream)

    def __enter__(self) -> "OnStream":
        if self.stream is None:
            return self
        outer = torch.cuda.current_stream()
        if outer.device != self.stream.device:  # another device is current: the full switch
            outer = torch.cuda.current_stream(self.stream.device)
            self.ctx = torch.cuda.stream(self.stream)
        self.outer = outer
        runtime.record(self._order, outer)
        self.stream.wait_event(self._order)
        if self.ctx is not None:
            self.ctx.__enter__()
        else:  # the current device is the stream's: declared, launches look nothing up
            torch.cuda.set_stream(self.stream)
            self._declared = runtime.bind_stream(self._bound)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.stream is None:
            return
        if self.ctx is not None:
            ctx, self.ctx = self.ctx, None
            ctx.__exit__(*exc)
        else:
            runtime.bind_stream(self._declared)
            torch.cuda.set_stream(self.outer)
