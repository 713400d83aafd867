"""``hicache replay --plot FILE``: the path checked before the first run, the plot drawn after the last.

Before any run: the folder must exist (a mistyped folder is refused, never created), the
file must be writable (opened for appending and removed again if it was not there, so a
run that ends early leaves nothing), and matplotlib must be installed and able to write
the format the file's extension names (a tiny figure is rendered in that format into
memory: ``x.txt`` or a ``.pgf`` without LaTeX is refused now, not after an hour of runs).
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

from hicache.replay.bounds import Bounds
from hicache.replay.stats import RunStats

__all__ = ["check_plot_path", "draw"]


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def check_plot_path(text: str | None) -> Path | None:
    """``--plot`` as an absolute path matplotlib can write, or None (no plot); checked now.

    Raises:
        ValueError: naming ``--plot``: a folder, a missing folder, a file that cannot be
            written, no matplotlib, or a format it cannot write (the formats it can listed).
    """
    if not text:
        return None
    path = Path(text).expanduser().resolve()
    if path.is_dir():
        raise ValueError(f"--plot: {path} is a folder; give a file name such as hit_rate.png")
    if not path.parent.is_dir():
        what = "is not a folder" if path.parent.exists() else "does not exist"
        raise ValueError(f"--plot: {path.parent} {what}; create the folder first or choose another")
    _check_format(path)
    try:
        existed = path.exists()
        with open(path, "ab"):
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        raise ValueError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
    return path


def _check_format(path: Path) -> None:
    """matplotlib is there and writes the format of ``path``'s extension."""
    try:
        plt = _pyplot()
    except ImportError:
        raise ValueError("--plot: needs matplotlib, which is not installed (`make setup` or `pip install "
                         "matplotlib` adds it); or leave --plot out") from None
    fig = plt.figure(figsize=(1, 1))
    try:
        formats = sorted(fig.canvas.get_supported_filetypes())
        ext = path.suffix[1:].lower()
        if ext not in formats:
            raise ValueError(f"--plot: {path.name}: {'.' + ext if ext else 'no extension'} is not a format "
                             f"matplotlib writes; use one of {', '.join('.' + f for f in formats)}")
        try:
            fig.savefig(io.BytesIO(), format=ext)
        except Exception as exc:  # a backend's own failure (pgf without LaTeX...): any type, one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"--plot: matplotlib cannot write .{ext} here ({first}); use .png") from None
    finally:
        plt.close(fig)


def draw(runs: Sequence[RunStats], bounds: Sequence[Bounds], path: Path, title: str = "") -> None:
    """Hit rates vs ratio (the baseline at 0), one line per policy (one policy: also its
    device and host parts), the bounds dashed; beside it, with ``--device-profile``'s
    estimates, TTFT p50 / p99 with and without the cache. Format from ``path``'s extension.

    Raises:
        OSError: the file cannot be written.
    """
    plt = _pyplot()
    timed = any(st.device_profile for st in runs)
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(12 if timed else 6.5, 4.2), squeeze=False)
    _hits(axes[0][0], runs, bounds, title)
    if timed:
        _ttft(axes[0][1], runs)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _hits(ax, runs: Sequence[RunStats], bounds: Sequence[Bounds], title: str) -> None:
    policies = list(dict.fromkeys(st.eviction_policy for st in runs))
    for policy in policies:
        mine = [st for st in runs if st.eviction_policy == policy]
        ax.plot([st.hicache_ratio for st in mine], [_hit(st) for st in mine], marker="o",
                label=f"hit ({policy})" if len(policies) > 1 else "hit (total)")
    if len(policies) == 1:
        total = [max(st.tokens_total, 1) for st in runs]
        ratios = [st.hicache_ratio for st in runs]
        ax.plot(ratios, [st.device_hit_tokens / t for st, t in zip(runs, total)], marker=".", label="device")
        ax.plot(ratios, [st.host_hit_tokens / t for st, t in zip(runs, total)], marker=".", label="host")
        if any(st.storage for st in runs):
            ax.plot(ratios, [st.storage_hit_tokens / t for st, t in zip(runs, total)], marker=".", label="storage")
    per_ratio = {st.hicache_ratio: b for st, b in zip(runs, bounds)}
    xs = sorted(per_ratio)
    for key, label, style in (("lru", "ideal LRU (bound)", ":"), ("belady", "Belady: no policy beats it", "--"),
                              ("infinite", "infinite cache", "-.")):
        ax.plot(xs, [getattr(per_ratio[x], key) for x in xs], linestyle=style, color="gray", label=label)
    ax.set_xlabel("--hicache-ratio (0 = device only)")
    ax.set_ylabel("fraction of prompt tokens served from cache")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _ttft(ax, runs: Sequence[RunStats]) -> None:
    """Estimated TTFT p50 / p99 vs ratio per policy, and without the cache (dashed)."""
    for policy in dict.fromkeys(st.eviction_policy for st in runs):
        mine = [st for st in runs if st.eviction_policy == policy]
        xs = [st.hicache_ratio for st in mine]
        for key, marker in (("ttft_p50_s", "o"), ("ttft_p99_s", "^")):
            ax.plot(xs, [getattr(st, key) * 1e3 for st in mine], marker=marker,
                    label=f"{key[5:8]} with the cache ({policy})")
    xs = [st.hicache_ratio for st in runs]
    for key, style in (("ttft_nocache_p50_s", "--"), ("ttft_nocache_p99_s", ":")):
        ax.plot(xs, [getattr(st, key) * 1e3 for st in runs], linestyle=style, color="gray",
                label=f"{key[13:16]} without a cache")
    ax.set_xlabel("--hicache-ratio (0 = device only)")
    ax.set_ylabel("time to first token, ms (estimated)")
    ax.set_title(f"ESTIMATED on {runs[0].device_profile} (load policy {runs[0].load_policy})", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _hit(st: RunStats) -> float:
    return (st.device_hit_tokens + st.host_hit_tokens + st.storage_hit_tokens) / max(st.tokens_total, 1)
