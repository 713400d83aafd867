"""The results of `hicache replay`: JSON rows, the tables, the summary and the verdict."""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from hicache.replay.bounds import Bounds
from hicache.replay.stats import UNLIMITED_TOKENS, RunStats
from hicache.replay.timing import SUMMARY_KEYS, ttft_table

JSON_KEYS = ("hicache_ratio", "eviction_policy", "hit_rate", "device_hit_rate", "host_hit_rate", "storage_hit_rate",
             "tokens_total", "tokens_recomputed", "bytes_h2d", "bytes_d2h", "bytes_storage_read",
             "bytes_storage_written", "storage_bytes_per_hit_token", "storage_read_gbps", "storage_write_gbps",
             "transfers_failed", "mismatches",
             "host_dtype", "host_capacity_bytes", "peak_host_bytes", "capacity_tokens", "bound_lru", "bound_belady",
             "bound_infinite", "hints", "hints_sent", "hint_states", "state_interval", "snapshots",
             "snapshot_bytes", "bytes_d2h_state", "bound_lru_snapshots", "bound_infinite_snapshots",
             "live_score", "score_switches", "score_why", "policy_memory_bytes",
             "load_policy", "device_profile", *SUMMARY_KEYS)
HINT_SUFFIX = {"on": "+h", "wrong": "+w"}  # a policy's column label with the trace's hints, or wrong ones
BOUNDS_LEGEND = ("bounds, from the trace alone at each row's device + host (+ storage) tokens (hicache.replay.bounds): ideal LRU = "
                 "what LRU reaches without a server's constraints; Belady = no eviction policy can beat it; "
                 "infinite = no cache can; hybrid stacks also under the snapshot rule (+snap: a hit ends where a "
                 "prefill saved a state snapshot, which leaves with its page)")


class Verdict(NamedTuple):
    """The replay's verdict: one word for scripts (``--json``'s ``verdict``) and its line."""

    word: str  # OK, NOT CHECKED, FAILED, MISMATCH, NO MEMORY, INTERRUPTED
    line: str


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds else 0.0


def bytes_per_storage_hit_token(st: RunStats) -> float | None:
    """Storage bytes written per prompt token served from storage (the wear per hit), or
    ``None`` when nothing was served from storage."""
    return st.bytes_storage_written / st.storage_hit_tokens if st.storage_hit_tokens else None


def json_row(st: RunStats, bound: Bounds | None = None) -> dict:
    """One run as the JSON row (keys in `JSON_KEYS` order; storage ones 0 without a storage
    tier, bound ones None without ``bound``)."""
    total = max(st.tokens_total, 1)
    hit = st.device_hit_tokens + st.host_hit_tokens + st.storage_hit_tokens
    return {"hicache_ratio": st.hicache_ratio, "eviction_policy": st.eviction_policy, "hit_rate": hit / total,
            "device_hit_rate": st.device_hit_tokens / total, "host_hit_rate": st.host_hit_tokens / total,
            "storage_hit_rate": st.storage_hit_tokens / total,
            "tokens_total": st.tokens_total, "tokens_recomputed": st.tokens_recomputed,
            "bytes_h2d": st.bytes_h2d, "bytes_d2h": st.bytes_d2h,
            "bytes_storage_read": st.bytes_storage_read, "bytes_storage_written": st.bytes_storage_written,
            "storage_bytes_per_hit_token": bytes_per_storage_hit_token(st),
            "storage_read_gbps": _gbps(st.bytes_storage_read, st.seconds_storage_read),
            "storage_write_gbps": _gbps(st.bytes_storage_written, st.seconds_storage_write),
            "transfers_failed": st.transfers_failed, "mismatches": st.mismatches, "host_dtype": st.host_dtype,
            "host_capacity_bytes": st.host_capacity_bytes, "peak_host_bytes": st.peak_host_bytes,
            "capacity_tokens": st.capacity_tokens, "bound_lru": bound and bound.lru,
            "bound_belady": bound and bound.belady, "bound_infinite": bound and bound.infinite,
            "hints": st.hints, "hints_sent": st.hints_sent, "hint_states": dict(st.hint_states),
            "state_interval": st.state_interval or None, "snapshots": st.snapshots, "snapshot_bytes": st.snapshot_bytes,
            "bytes_d2h_state": st.bytes_d2h_state, "bound_lru_snapshots": bound and bound.lru_snapshots,
            "bound_infinite_snapshots": bound and bound.infinite_snapshots,
            "live_score": st.live_score, "score_switches": st.score_switches, "score_why": st.score_why,
            "policy_memory_bytes": st.policy_memory_bytes,
            "load_policy": st.load_policy, "device_profile": st.device_profile,
            **{k: getattr(st, k) for k in SUMMARY_KEYS}}


def run_label(st: RunStats) -> str:
    """A run's policy, marked when client hints were sent to it (``lru+h``; wrong ones ``lru+w``)."""
    return st.eviction_policy + (HINT_SUFFIX.get(st.hints, "") if st.hints_sent else "")


def format_table(stack, runs: Sequence[RunStats], bounds: Sequence[Bounds], device: torch.device | str = "cpu",
                 storage: str = "", copy_rates: bool = False) -> str:
    """The runs as a text table, then the storage table (with a storage tier: ``storage``
    says which), the estimated time to first token (with ``--device-profile``) and the
    table of hit rates per policy against the bounds (one per run). ``copy_rates``: also
    this machine's copy GB/s (``--copy-rates``)."""
    with_storage = any(st.storage for st in runs)
    pw = max(8, 1 + max((len(run_label(st)) for st in runs), default=0))  # the policy column
    rates = f"{'h2d GB/s':>10}{'d2h GB/s':>10}" if copy_rates else ""
    head = (f"{'ratio':>6} {'policy':<{pw}}{'hit':>7}{'device':>8}{'host':>8}"
            + (f"{'storage':>9}" if with_storage else "")
            + f"{'recomputed':>12}{'pages h2d':>11}{'pages d2h':>11}"
            f"{'GB h2d':>9}{'GB d2h':>9}{rates}{'peak host GB':>14}{'wall s':>8}"
            f"  {'live score':<18}")
    dtypes = sorted({st.host_dtype for st in runs})
    lines = [f"model {stack.model}, page {stack.page_size} tokens, {torch.device(device).type} replay, host dtype "
             f"{'/'.join(dtypes)} (GB are host-format bytes" + ("; transfer GB/s: this machine's copies, launch to "
                                                                "completion)" if copy_rates else ")"),
             head, "-" * len(head)]
    for st in runs:
        r = json_row(st)
        rates = (f"{_gbps(st.bytes_h2d, st.seconds_h2d):>10.2f}{_gbps(st.bytes_d2h, st.seconds_d2h):>10.2f}"
                 if copy_rates else "")
        lines.append(f"{st.hicache_ratio:>6g} {run_label(st):<{pw}}{r['hit_rate']:>7.3f}{r['device_hit_rate']:>8.3f}"
                     f"{r['host_hit_rate']:>8.3f}" + (f"{r['storage_hit_rate']:>9.3f}" if with_storage else "")
                     + f"{st.tokens_recomputed:>12,}{st.pages_h2d:>11,}{st.pages_d2h:>11,}{st.bytes_h2d / 1e9:>9.3f}"
                     f"{st.bytes_d2h / 1e9:>9.3f}{rates}{st.peak_host_bytes / 1e9:>14.3f}{st.wall_s:>8.1f}"
                     f"  {_live(st):<18}")
    lines.append("every device hit and every page loaded (from host or storage) checked byte for byte: "
                 + ", ".join(f"{st.bytes_checked / 1e9:.2f} GB" for st in runs) + "; mismatches "
                 + ", ".join(str(st.mismatches) for st in runs))
    if with_storage:
        lines += ["", _storage_table(runs, storage)]
    if any(st.device_profile for st in runs):
        lines += ["", ttft_table(stack.model, runs)]
    return "\n".join([*lines, "", bounds_table(runs, bounds)])


def _live(st: RunStats) -> str:
    """The policy's live score at the end, with the adaptive policy's switches."""
    return st.live_score + (f" ({st.score_switches} switches)" if st.score_why else "")


def _storage_table(runs: Sequence[RunStats], storage: str) -> str:
    head = (f"{'ratio':>6} {'policy':<8}{'storage hit':>12}{'GB read':>10}{'GB written':>12}{'B/hit token':>13}"
            f"{'read GB/s':>11}{'write GB/s':>12}")
    lines = [f"storage tier: {storage} (GB written: the wear of each run; B/hit token: bytes written per prompt "
             "token served from storage; GB/s: bytes over the time the I/O threads had a read / a write in flight)",
             head, "-" * len(head)]
    for st in runs:
        if not st.storage:
            continue
        r = json_row(st)
        per_hit = r["storage_bytes_per_hit_token"]
        lines.append(f"{st.hicache_ratio:>6g} {st.eviction_policy:<8}{r['storage_hit_rate']:>12.3f}"
                     f"{st.bytes_storage_read / 1e9:>10.3f}{st.bytes_storage_written / 1e9:>12.3f}"
                     + (f"{per_hit:>13,.0f}" if per_hit is not None else f"{'-':>13}")
                     + f"{r['storage_read_gbps']:>11.2f}{r['storage_write_gbps']:>12.2f}")
    return "\n".join(lines)


def bounds_table(runs: Sequence[RunStats], bounds: Sequence[Bounds]) -> str:
    """Per ratio: each policy's hit rate beside the bounds at that capacity."""
    policies = list(dict.fromkeys(run_label(st) for st in runs))
    width = max(9, 1 + max(len(p) for p in policies))
    snap = any(b.lru_snapshots is not None for b in bounds)
    head = (f"{'ratio':>6}{'capacity tokens':>17}" + "".join(f"{p:>{width}}" for p in policies)
            + f" |{'ideal LRU':>10}{'Belady':>8}{'infinite':>10}"
            + (f" |{'LRU +snap':>10}{'inf +snap':>10}" if snap else ""))
    lines = ["hit rate per eviction policy against the bounds (" + BOUNDS_LEGEND.split(" (hicache", 1)[0] + ")",
             head, "-" * len(head)]
    rows: dict[float, dict] = {}
    for st, b in zip(runs, bounds):
        row = rows.setdefault(st.hicache_ratio, {"bound": b})
        row[run_label(st)] = json_row(st)["hit_rate"]
    for ratio, row in rows.items():
        b = row["bound"]
        hits = "".join(f"{row[p]:>{width}.3f}" if p in row else f"{'-':>{width}}" for p in policies)
        cap = "unlimited" if b.capacity_tokens >= UNLIMITED_TOKENS else f"{b.capacity_tokens:,}"
        lines.append(f"{ratio:>6g}{cap:>17}{hits} |{b.lru:>10.3f}{b.belady:>8.3f}{b.infinite:>10.3f}"
                     + (f" |{b.lru_snapshots:>10.3f}{b.infinite_snapshots:>10.3f}" if snap else ""))
    return "\n".join(lines)


def summary(runs: Sequence[RunStats], workload: str, verdict: Verdict) -> str:
    """What the rows mean, the workload's size and the verdict line.

    Args:
        runs: the finished runs, the device-only baseline first.
        workload: one line saying what was replayed (requests, prompt tokens, device size).
        verdict: the replay's verdict (`verdict`).
    """
    storage = any(st.storage for st in runs)
    tiers = "device + host + storage" if storage else "device + host"
    lines = [workload,
             "rows: ratio = host tokens per device token (0 = device only: no host or storage tier, the "
             f"baseline); hit = {tiers}, the share of prompt tokens served from cache instead of recomputed",
             BOUNDS_LEGEND]
    if storage:  # why the total can stop growing with the ratio while the host column still does
        lines.append("storage: the store keeps what the host drops, so once the host can stage a whole prompt the "
                     "hit is all the workload reuses; a larger host serves more of it from host instead of storage; "
                     f"{sum(st.bytes_storage_written for st in runs) / 1e9:.3f} GB written to storage in all")
    return "\n".join([*lines, verdict.line])


def verdict(runs: Sequence[RunStats], transfers_failed_all: bool, allow_device_only: bool) -> Verdict:
    """The verdict of finished runs: FAILED (a run's every transfer failed), NOT CHECKED
    (nothing came back from host or storage), else OK."""
    restored = sum(st.host_hit_tokens + st.storage_hit_tokens for st in runs)
    failed = sum(st.transfers_failed for st in runs)
    checked = (f"{len(runs)} runs, every device hit and every page restored from host or storage checked byte "
               f"for byte ({sum(st.bytes_checked for st in runs) / 1e9:.2f} GB), "
               f"{sum(st.mismatches for st in runs)} mismatches")
    if transfers_failed_all:
        return Verdict("FAILED", f"verdict: FAILED: a run's every transfer failed (above); {checked}")
    if restored == 0:
        accepted = "accepted by --allow-device-only" if allow_device_only else "exit status 1; --allow-device-only accepts it"
        return Verdict("NOT CHECKED", f"verdict: NOT CHECKED: nothing came back from host or storage (the workload "
                                      f"fits the device; lower --device-tokens; {accepted}); {checked}")
    warn = f"; {failed} transfers failed and were rolled back (warnings above)" if failed else ""
    return Verdict("OK", f"verdict: OK: {checked}; {restored:,} prompt tokens restored from host or storage{warn}")
