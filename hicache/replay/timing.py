"""A replay run's estimated time to first token and its load gate (``--device-profile``,
``--hicache-load-policy``), composed from `hicache.cost`.

Per request the replay tells `RunTiming` when it arrives (before its match: the gate reads
the links' backlog at that moment) and, once served, what it found and loaded; the
backups and storage writes it caused are read from the controller's and the tree's
counters (in the whole model's bytes: the cost model is of every layer, whatever
``--layers`` cuts the replayed stack to). The figures are estimates from the profile.
"""
from __future__ import annotations

import argparse
from typing import Any, Sequence

from hicache.cost import SUMMARY_KEYS, DeviceProfile, LoadCost, LoadGate, Timeline, load_profile, make_cost
from hicache.replay.workload import Request


class RunTiming:
    """The `Timeline` of one run and, under ``cost``, the `LoadGate` its tree consults.

    Args:
        cost: the whole model's load and prefill model on the profile.
        profile: the device profile (its D2H link for backups).
        policy: ``--hicache-load-policy`` (``cost`` builds the gate).
        page: tokens per page; timed: the requests carry real timestamps (a trace).
    """

    def __init__(self, cost: LoadCost, profile: DeviceProfile, policy: str, page: int, timed: bool) -> None:
        self.profile_name, self.policy = profile.name, policy
        self.timeline = Timeline(cost, profile.d2h, cost.store, timed)
        self.gate = LoadGate(cost, page, self.timeline.backlog) if policy == "cost" else None
        self._footprint, self._page = cost.footprint, page
        self._seen: tuple[int, int, int, int] = (0, 0, 0, 0)  # the counters after the last request
        self._cuts = 0  # the gate's cuts after the last request

    @classmethod
    def from_args(cls, args: argparse.Namespace, page: int) -> "RunTiming":
        """The timing of one run of ``hicache replay``'s flags (``--device-profile``, ``--model``,
        ``--hicache-host-dtype``, ``--hicache-storage-backend``, ``--hicache-load-policy``; a
        ``--trace`` has timestamps).

        Raises:
            ValueError: a profile that cannot be read, a preset without a shape, or a storage
                backend the profile has no figures for (the flag named).
        """
        profile = load_profile(args.device_profile)
        cost = make_cost(profile, args.model, args.host_dtype, args.storage_backend)
        return cls(cost, profile, args.load_policy, page, bool(args.trace))

    def arrive(self, req: Request) -> None:
        """``req`` arrives: the links' backlog is read at its timestamp."""
        self.timeline.arrive(req.timestamp)

    def record(self, req: Request, start: int, host_end: int, found_end: int, end: int, tree: Any) -> None:
        """``req`` was served: it found ``start`` tokens on the device, a host part to
        ``host_end``, everything found to ``found_end``, and had ``end`` on the device
        before its prefill. ``tree``: the run's `HiRadixCache` (its counters since the last
        request are this one's writes)."""
        seen = self._counters(tree)
        d2h_tokens, d2h_snaps, stored_pages, stored_snaps = (a - b for a, b in zip(seen, self._seen))
        self._seen = seen
        fp, cuts = self._footprint, self.gate.cuts if self.gate is not None else 0
        self.timeline.request(req.input_length, start, host_end, found_end, end,
                              d2h_tokens * fp.token_bytes + d2h_snaps * fp.snapshot_bytes,
                              stored_pages * self._page * fp.token_bytes + stored_snaps * fp.snapshot_bytes,
                              cut=cuts > self._cuts)
        self._cuts = cuts

    @staticmethod
    def _counters(tree: Any) -> tuple[int, int, int, int]:
        """(history tokens backed up, snapshots backed up, pages and snapshots written to storage)."""
        tokens = tree.ctrl.stats()["d2h"]["tokens"]
        roots = tree.state_sizes
        snaps = tokens.get(next(iter(roots)), 0) // next(iter(roots.values())) if roots else 0
        return (tokens.get(tree.anchor, 0), snaps, tree.counters["storage_write_pages"],
                tree.counters["storage_write_snapshots"])

    def summary(self) -> dict[str, Any]:
        """The run's `hicache.cost.SUMMARY_KEYS`, its profile and its load policy."""
        return {"load_policy": self.policy, "device_profile": self.profile_name, **self.timeline.summary()}


def ttft_table(model: str, runs: Sequence[Any]) -> str:
    """The runs' estimated time to first token and prefill GPU-seconds, one row per run
    (`RunStats` with ``device_profile`` set)."""
    runs = [st for st in runs if st.device_profile]
    profiles = "/".join(sorted({st.device_profile for st in runs}))
    head = (f"{'ratio':>6} {'policy':<8}{'load':>7}{'TTFT p50 ms':>13}{'p99 ms':>9}{'no cache p50':>14}{'p99 ms':>9}"
            f"{'GPU s saved':>13}{'of GPU s':>10}{'cut':>6}")
    lines = [f"time to first token on {profiles}, ESTIMATED from the device profile (its links and prefill rates; "
             f"hicache/cost), not measured: the whole {model} model on one device, loads queued on their links in "
             "arrival order; 'of GPU s': prefill seconds without any cache; 'cut': requests whose found tokens "
             "were partly recomputed because that was estimated faster", head, "-" * len(head)]
    for st in runs:
        ms = [x * 1e3 for x in (st.ttft_p50_s, st.ttft_p99_s, st.ttft_nocache_p50_s, st.ttft_nocache_p99_s)]
        lines.append(f"{st.hicache_ratio:>6g} {st.eviction_policy:<8}{st.load_policy:>7}{ms[0]:>13.1f}{ms[1]:>9.1f}"
                     f"{ms[2]:>14.1f}{ms[3]:>9.1f}{st.prefill_gpu_s_saved:>13.2f}{st.prefill_gpu_s_nocache:>10.2f}"
                     f"{st.requests_recomputing_hits:>6,}")
    return "\n".join(lines)


__all__ = ["RunTiming", "SUMMARY_KEYS", "ttft_table"]
