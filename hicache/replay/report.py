"""The results of `hicache replay`: JSON rows, the table and the optional hit-rate plot."""
from __future__ import annotations

import torch

from hicache.replay.run import RunStats

JSON_KEYS = ("hicache_ratio", "hit_rate", "device_hit_rate", "host_hit_rate", "storage_hit_rate", "tokens_total",
             "tokens_recomputed", "bytes_h2d", "bytes_d2h", "bytes_storage_read", "bytes_storage_written",
             "storage_read_gbps", "storage_write_gbps", "transfers_failed", "mismatches", "host_dtype",
             "host_capacity_bytes", "peak_host_bytes")


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds else 0.0


def json_row(st: RunStats) -> dict:
    """One run as the JSON row (keys in `JSON_KEYS` order; storage ones 0 without a storage tier)."""
    total = max(st.tokens_total, 1)
    hit = st.device_hit_tokens + st.host_hit_tokens + st.storage_hit_tokens
    return {"hicache_ratio": st.hicache_ratio, "hit_rate": hit / total,
            "device_hit_rate": st.device_hit_tokens / total, "host_hit_rate": st.host_hit_tokens / total,
            "storage_hit_rate": st.storage_hit_tokens / total,
            "tokens_total": st.tokens_total, "tokens_recomputed": st.tokens_recomputed,
            "bytes_h2d": st.bytes_h2d, "bytes_d2h": st.bytes_d2h,
            "bytes_storage_read": st.bytes_storage_read, "bytes_storage_written": st.bytes_storage_written,
            "storage_read_gbps": _gbps(st.bytes_storage_read, st.seconds_storage_read),
            "storage_write_gbps": _gbps(st.bytes_storage_written, st.seconds_storage_write),
            "transfers_failed": st.transfers_failed, "mismatches": st.mismatches, "host_dtype": st.host_dtype,
            "host_capacity_bytes": st.host_capacity_bytes, "peak_host_bytes": st.peak_host_bytes}


def format_table(stack, runs: list[RunStats], device: torch.device | str = "cpu", storage: str = "") -> str:
    """The runs as a text table; with a storage tier (``storage`` says which) a storage
    hit column and a second table of storage bytes and GB/s."""
    with_storage = any(st.storage for st in runs)
    head = (f"{'ratio':>6}{'hit':>8}{'device':>8}{'host':>8}" + (f"{'storage':>9}" if with_storage else "")
            + f"{'recomputed':>12}{'pages h2d':>11}{'pages d2h':>11}"
            f"{'GB h2d':>9}{'GB d2h':>9}{'h2d GB/s':>10}{'d2h GB/s':>10}{'peak host GB':>14}{'wall s':>8}")
    dtypes = sorted({st.host_dtype for st in runs})
    lines = [f"model {stack.model}, page {stack.page_size} tokens, {torch.device(device).type} replay, host dtype "
             f"{'/'.join(dtypes)} (transfer GB/s: launch to completion; GB are host-format bytes)", head, "-" * len(head)]
    for st in runs:
        r = json_row(st)
        lines.append(f"{st.hicache_ratio:>6g}{r['hit_rate']:>8.3f}{r['device_hit_rate']:>8.3f}{r['host_hit_rate']:>8.3f}"
                     + (f"{r['storage_hit_rate']:>9.3f}" if with_storage else "")
                     + f"{st.tokens_recomputed:>12,}{st.pages_h2d:>11,}{st.pages_d2h:>11,}{st.bytes_h2d / 1e9:>9.3f}"
                     f"{st.bytes_d2h / 1e9:>9.3f}{_gbps(st.bytes_h2d, st.seconds_h2d):>10.2f}"
                     f"{_gbps(st.bytes_d2h, st.seconds_d2h):>10.2f}{st.peak_host_bytes / 1e9:>14.3f}"
                     f"{st.wall_s:>8.1f}")
    lines.append("every device hit and every page loaded (from host or storage) checked byte for byte: "
                 + ", ".join(f"{st.bytes_checked / 1e9:.2f} GB" for st in runs) + "; mismatches "
                 + ", ".join(str(st.mismatches) for st in runs))
    if with_storage:
        lines += ["", _storage_table(runs, storage)]
    return "\n".join(lines)


def _storage_table(runs: list[RunStats], storage: str) -> str:
    head = (f"{'ratio':>6}{'storage hit':>13}{'GB read':>10}{'GB written':>12}{'read GB/s':>11}"
            f"{'write GB/s':>12}")
    lines = [f"storage tier: {storage} (GB/s: bytes over the time the I/O threads had a read / a write "
             "in flight)", head, "-" * len(head)]
    for st in runs:
        if not st.storage:
            continue
        r = json_row(st)
        lines.append(f"{st.hicache_ratio:>6g}{r['storage_hit_rate']:>13.3f}{st.bytes_storage_read / 1e9:>10.3f}"
                     f"{st.bytes_storage_written / 1e9:>12.3f}{r['storage_read_gbps']:>11.2f}"
                     f"{r['storage_write_gbps']:>12.2f}")
    return "\n".join(lines)


def plot(runs: list[RunStats], path: str, title: str = "") -> None:
    """Hit rates vs ratio (the baseline at 0) as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json_row(st) for st in runs]
    x = [r["hicache_ratio"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    keys = [("hit_rate", "total"), ("device_hit_rate", "device"), ("host_hit_rate", "host")]
    if any(st.storage for st in runs):
        keys.append(("storage_hit_rate", "storage"))
    for key, label in keys:
        ax.plot(x, [r[key] for r in rows], marker="o", label=label)
    ax.set_xlabel("--hicache-ratio (0 = device only)")
    ax.set_ylabel("fraction of prompt tokens served from cache")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def summary(runs: list[RunStats], workload: str, status: int) -> str:
    """What the rows mean, the workload's size and one verdict line (what was checked, OK or not).

    Args:
        runs: the finished runs, the device-only baseline first.
        workload: one line saying what was replayed (requests, prompt tokens, device size).
        status: the replay's exit status so far (1: a run whose every transfer failed).
    """
    storage = any(st.storage for st in runs)
    tiers = "device + host + storage" if storage else "device + host"
    restored = sum(st.host_hit_tokens + st.storage_hit_tokens for st in runs)
    failed = sum(st.transfers_failed for st in runs)
    lines = [workload,
             "rows: ratio = host tokens per device token (0 = device only: no host or storage tier, the "
             f"baseline); hit = {tiers}, the share of prompt tokens served from cache instead of recomputed"]
    if storage:  # why the total can stop growing with the ratio while the host column still does
        lines.append("storage: the store keeps what the host drops, so once the host can stage a whole prompt the "
                     "hit is all the workload reuses; a larger host serves more of it from host instead of storage")
    checked = (f"{len(runs)} runs, every device hit and every page restored from host or storage checked byte "
               f"for byte ({sum(st.bytes_checked for st in runs) / 1e9:.2f} GB), "
               f"{sum(st.mismatches for st in runs)} mismatches")
    if status:
        verdict = f"verdict: FAILED: a run's every transfer failed (above); {checked}"
    elif restored == 0:
        verdict = (f"verdict: NOT CHECKED: nothing came back from host or storage (the workload fits the "
                   f"device; lower --device-tokens); {checked}")
    else:
        warn = f"; {failed} transfers failed and were rolled back (warnings above)" if failed else ""
        verdict = f"verdict: OK: {checked}; {restored:,} prompt tokens restored from host or storage{warn}"
    return "\n".join([*lines, verdict])
