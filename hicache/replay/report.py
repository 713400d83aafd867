"""The results of `hicache replay`: JSON rows, the table and the optional hit-rate plot."""
from __future__ import annotations

from pathlib import Path

import torch

from hicache.replay.run import RunStats

JSON_KEYS = ("hicache_ratio", "hit_rate", "device_hit_rate", "host_hit_rate", "tokens_total",
             "tokens_recomputed", "bytes_h2d", "bytes_d2h", "mismatches")


def json_row(st: RunStats) -> dict:
    """One run as the JSON row (keys in `JSON_KEYS` order)."""
    total = max(st.tokens_total, 1)
    return {"hicache_ratio": st.hicache_ratio, "hit_rate": (st.device_hit_tokens + st.host_hit_tokens) / total,
            "device_hit_rate": st.device_hit_tokens / total, "host_hit_rate": st.host_hit_tokens / total,
            "tokens_total": st.tokens_total, "tokens_recomputed": st.tokens_recomputed,
            "bytes_h2d": st.bytes_h2d, "bytes_d2h": st.bytes_d2h, "mismatches": st.mismatches}


def format_table(stack, runs: list[RunStats], device: torch.device | str = "cpu") -> str:
    head = (f"{'ratio':>6}{'hit':>8}{'device':>8}{'host':>8}{'recomputed':>12}{'pages h2d':>11}{'pages d2h':>11}"
            f"{'GB h2d':>9}{'GB d2h':>9}{'h2d GB/s':>10}{'d2h GB/s':>10}{'peak host GB':>14}{'wall s':>8}")
    lines = [f"model {stack.model}, page {stack.page_size} tokens, {torch.device(device).type} replay "
             "(transfer GB/s: launch to completion)", head, "-" * len(head)]
    for st in runs:
        r = json_row(st)
        h2d = st.bytes_h2d / st.seconds_h2d / 1e9 if st.seconds_h2d else 0.0
        d2h = st.bytes_d2h / st.seconds_d2h / 1e9 if st.seconds_d2h else 0.0
        lines.append(f"{st.hicache_ratio:>6g}{r['hit_rate']:>8.3f}{r['device_hit_rate']:>8.3f}{r['host_hit_rate']:>8.3f}"
                     f"{st.tokens_recomputed:>12,}{st.pages_h2d:>11,}{st.pages_d2h:>11,}{st.bytes_h2d / 1e9:>9.3f}"
                     f"{st.bytes_d2h / 1e9:>9.3f}{h2d:>10.2f}{d2h:>10.2f}{st.peak_host_bytes / 1e9:>14.3f}"
                     f"{st.wall_s:>8.1f}")
    return "\n".join(lines)


def plot(runs: list[RunStats], path: str, title: str = "") -> None:
    """Hit rates vs ratio (the baseline at 0) as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json_row(st) for st in runs]
    x = [r["hicache_ratio"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("hit_rate", "total"), ("device_hit_rate", "device"), ("host_hit_rate", "host")):
        ax.plot(x, [r[key] for r in rows], marker="o", label=label)
    ax.set_xlabel("--hicache-ratio (0 = device only)")
    ax.set_ylabel("fraction of prompt tokens served from cache")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
