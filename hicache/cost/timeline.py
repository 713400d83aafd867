"""`Timeline`: a replay's estimated time to first token, request by request, on a named device.

Each request arrives (the trace's timestamp; a workload without timestamps sends the next
request when the previous one's first token is out), finds the links as earlier requests
left them (`LinkClocks`), loads what its cut says and computes the rest; its backups then
occupy the D2H link and its storage writes the storage link for the requests after it::

    arrival ->| storage wait | read |-> h2d wait | load |-> prefill of the rest |-> first token
                                                                                 -> backup (d2h)
                                                                                 -> store write

Per request it records the estimate with the cache (what this run loaded), without it
(the whole prompt computed, nothing waited for), with everything found loaded (``always``)
and with nothing past the device loaded (``never``), and the prefill seconds the cache saved.
The GPU's own queue is not modelled (a trace of a cluster would overload one device): the
estimates are of the links and of each request's own prefill. They are estimates from the
profile, not measurements.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hicache.cost.decide import H2D, STORAGE, LoadCost
from hicache.cost.links import D2H, LinkClocks
from hicache.cost.profile import Link, Store


class RequestTime(NamedTuple):
    """One request's estimates, in seconds (module docstring)."""

    ttft_s: float
    nocache_s: float
    always_s: float
    never_s: float
    saved_gpu_s: float
    recomputed: bool  # the load gate left found tokens to recompute (estimated faster)


SUMMARY_KEYS = ("ttft_p50_s", "ttft_p99_s", "ttft_nocache_p50_s", "ttft_nocache_p99_s", "prefill_gpu_s_saved",
                "prefill_gpu_s_nocache", "requests_recomputing_hits")  # the last: requests the gate cut


class Timeline:
    """The per-request estimates of one replay run (module docstring).

    Args:
        cost: the load and prefill model of the run's model on the device.
        d2h: the device -> host link; store: the storage tier's figures (None: no tier).
        timed: arrivals from the requests' timestamps (milliseconds); else closed loop.
    Not thread-safe (the replay's loop).
    """

    def __init__(self, cost: LoadCost, d2h: Link, store: Store | None, timed: bool) -> None:
        self.cost, self.d2h, self.store, self.timed = cost, d2h, store, timed
        self.clocks = LinkClocks()
        self.times: list[RequestTime] = []
        self._next = 0.0  # closed loop: when the previous request's first token was out

    def backlog(self, link: str) -> float:
        """Seconds queued on ``link`` ahead of the current request (the gate's source)."""
        return self.clocks.backlog(link)

    def arrive(self, timestamp_ms: int) -> None:
        """The next request arrives (at its timestamp, never before the previous one)."""
        now = timestamp_ms / 1000 if self.timed else self._next
        self.clocks.now = max(self.clocks.now, now)

    def request(self, prompt: int, start: int, host_end: int, found_end: int, end: int,
                d2h_bytes: float = 0.0, store_bytes: float = 0.0, cut: bool = False) -> RequestTime:
        """Record the request that arrived last.

        Args:
            prompt: its prompt tokens; start: tokens it found on the device.
            host_end: where its host part ended (tokens past it came from storage).
            found_end: where everything it found ended (host and storage).
            end: tokens on the device before its prefill (what this run loaded to).
            d2h_bytes / store_bytes: its backups to the host and writes to storage.
            cut: the load gate left found tokens of it to recompute.
        Returns:
            Its `RequestTime`; the links advance past its transfers.
        """
        clocks, cost = self.clocks, self.cost
        waits = clocks.backlog(H2D), clocks.backlog(STORAGE)
        ttft = cost.seconds(prompt, start, end, host_end, *waits)
        always = cost.seconds(prompt, start, found_end, host_end, *waits)
        never = cost.seconds(prompt, start, start, host_end, *waits)
        nocache = cost.prefill.seconds(prompt, 0)
        saved = nocache - cost.prefill.seconds(prompt - end, end)
        self._occupy(start, end, host_end)
        first_token = clocks.now + ttft
        self._next = first_token
        if d2h_bytes:
            first_token = clocks.occupy(D2H, first_token, d2h_bytes / (self.d2h.gbps * 1e9))
        if store_bytes and self.store is not None:
            clocks.occupy(STORAGE, first_token, store_bytes / (self.store.write_gbps * 1e9))
        got = RequestTime(ttft, nocache, always, never, saved, cut)
        self.times.append(got)
        return got

    def _occupy(self, start: int, end: int, host_end: int) -> None:
        """The request's storage read, then its load, on their links."""
        if end <= start:
            return
        cost, clocks, now = self.cost, self.clocks, self.clocks.now
        snapshot = cost.hybrid
        ready = now
        if end > host_end and self.store is not None:
            read = cost.footprint.bytes(end - host_end, snapshot) / (self.store.read_gbps * 1e9)
            ready = clocks.occupy(STORAGE, now, read) + self.store.read_latency_s
        h2d = cost.h2d
        clocks.occupy(H2D, ready + h2d.enqueue_s + h2d.first_byte_s,
                      cost.footprint.bytes(end - start, snapshot) / (h2d.gbps * 1e9))

    def summary(self) -> dict[str, float | int]:
        """`SUMMARY_KEYS`: TTFT p50 / p99 with and without the cache, prefill GPU-seconds saved
        and spent without the cache, requests whose cut left hits to recompute."""
        if not self.times:
            return dict.fromkeys(SUMMARY_KEYS, 0)
        arr = np.asarray([(t.ttft_s, t.nocache_s, t.saved_gpu_s) for t in self.times])
        p = np.percentile(arr[:, :2], [50, 99], axis=0)
        return {"ttft_p50_s": float(p[0, 0]), "ttft_p99_s": float(p[1, 0]), "ttft_nocache_p50_s": float(p[0, 1]),
                "ttft_nocache_p99_s": float(p[1, 1]), "prefill_gpu_s_saved": float(arr[:, 2].sum()),
                "prefill_gpu_s_nocache": float(arr[:, 1].sum()),
                "requests_recomputing_hits": sum(t.recomputed for t in self.times)}
