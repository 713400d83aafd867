"""Shared benchmark harness: warm-up, p20/p50/p80 timing, GB/s, JSON rows with provenance.

Timing uses CUDA events on the current stream when the work runs on a GPU and
``time.perf_counter`` on the CPU. Every JSON file carries the device name, the torch,
triton and Python versions, the run's config and a UTC timestamp.

Where results go: ``bench/results/local/`` (`RESULTS_DIR`, git-ignored) unless a
script's ``--out`` says otherwise. The tracked files in ``bench/results/`` (`PUBLISHED_DIR`)
are the runs the README quotes; a run replaces one only when its path is given to ``--out``.
"""
from __future__ import annotations

import datetime as _dt
import json
import platform
import re
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

PUBLISHED_DIR = Path(__file__).resolve().parent / "results"  # tracked: the README's numbers
RESULTS_DIR = PUBLISHED_DIR / "local"  # git-ignored: where every run writes by default
RESULTS_MAX_BYTES = 64 << 20  # a results file read back (--resume): the largest tracked one is 0.4 MB


class Timing(NamedTuple):
    """Percentiles of one measured call, in milliseconds."""

    p20_ms: float
    p50_ms: float
    p80_ms: float


def time_fn(fn: Callable[[], Any], device: torch.device, warmup: int = 3,
            reps: int = 20, gate_cycles: int = 0) -> Timing:
    """Time ``fn`` after ``warmup`` calls; ``reps`` samples of one call each.

    Args:
        fn: the work; it must enqueue on the current stream when ``device`` is CUDA.
        device: where the work runs (CUDA events there, perf_counter on CPU).
        warmup: untimed calls first (compilation, caches), >= 0.
        reps: timed calls, >= 1.
        gate_cycles: CUDA only: a ``torch.cuda._sleep`` of this many GPU cycles before each
            sample's start event holds the GPU while the host enqueues ``fn``, so the sample
            is the GPU's time alone (0: each sample is max(host time, GPU time)).

    Returns:
        p20/p50/p80 of the per-call times.

    Raises:
        ValueError: ``reps`` < 1 or ``warmup`` < 0.
    """
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps: must be >= 1 and warmup >= 0, got {reps=} {warmup=}")
    for _ in range(warmup):
        fn()
    samples = _time_cuda(fn, reps, gate_cycles) if device.type == "cuda" else _time_cpu(fn, reps)
    p20, p50, p80 = np.percentile(np.asarray(samples), [20, 50, 80])
    return Timing(float(p20), float(p50), float(p80))


def _time_cuda(fn: Callable[[], Any], reps: int, gate_cycles: int = 0) -> list[float]:
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        if gate_cycles:
            torch.cuda._sleep(gate_cycles)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def _time_cpu(fn: Callable[[], Any], reps: int) -> list[float]:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def percentiles(samples: Sequence[float], unit: str = "us") -> dict[str, float]:
    """``{"p20_<unit>", "p50_<unit>", "p80_<unit>", "min_<unit>"}`` of ``samples``."""
    arr = np.asarray(samples, dtype=np.float64)
    p20, p50, p80 = np.percentile(arr, [20, 50, 80])
    return {f"p20_{unit}": round(float(p20), 2), f"p50_{unit}": round(float(p50), 2),
            f"p80_{unit}": round(float(p80), 2), f"min_{unit}": round(float(arr.min()), 2)}


class Memcpy:
    """The physical limit: one contiguous (pinned on CUDA) copy of the same bytes."""

    def __init__(self, max_bytes: int, device: torch.device) -> None:
        self.host = torch.empty(max_bytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
        self.dev = torch.empty(max_bytes, dtype=torch.uint8, device=device)
        self.device = device

    def fn(self, num_bytes: int, direction: str) -> Callable[[], Any]:
        h, d = self.host[:num_bytes], self.dev[:num_bytes]
        if direction == "h2d":
            return lambda: d.copy_(h, non_blocking=True)
        return lambda: h.copy_(d, non_blocking=True)

    def gbps(self, num_bytes: int, direction: str, reps: int = 10) -> float:
        """p50 GB/s of the contiguous copy of ``num_bytes`` (the limit of that size)."""
        t = time_fn(self.fn(num_bytes, direction), self.device, warmup=2, reps=reps)
        return gbps(num_bytes, t.p50_ms)


def gbps(num_bytes: int, ms: float) -> float:
    """Throughput in GB/s (1e9 bytes per second)."""
    return num_bytes / (ms * 1e-3) / 1e9 if ms > 0 else float("inf")


def device_name(device: torch.device) -> str:
    """A human-readable name of the benchmarked device."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()}".strip()


def device_slug(device: torch.device) -> str:
    """File-name-safe device label: ``nvidia_h100_80gb_hbm3`` or ``cpu``."""
    if device.type != "cuda":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "_", device_name(device).lower()).strip("_")


def environment(device: torch.device) -> dict[str, Any]:
    """Provenance of a run: device, versions, timestamp."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "device": device_name(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_json(path: Path, rows: Sequence[dict], config: dict, device: torch.device) -> Path:
    """Write ``{"environment", "config", "rows"}`` to ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"environment": environment(device), "config": config, "rows": list(rows)}
    path.write_text(json.dumps(doc, indent=1))
    return path


def format_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Rows as an aligned text table (floats with 3 significant digits)."""
    def cell(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    body = [[cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c)
              for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def eviction_policies(parser: Any, value: str, counts: dict[str, int]) -> list[str]:
    """The ``--hicache-eviction-policy`` list of a bench (``all`` or comma-separated names),
    after checking ``counts`` (flag -> value) are at least 1; `parser.error` (exit 2, one
    line) otherwise."""
    from hicache.config import EVICTION_POLICIES
    policies = list(EVICTION_POLICIES) if value == "all" else value.split(",")
    bad = [x for x in policies if x not in EVICTION_POLICIES]
    if bad:
        parser.error(f"--hicache-eviction-policy: {bad} not in {list(EVICTION_POLICIES)}")
    small = [flag for flag, n in counts.items() if n < 1]
    if small:
        parser.error(f"{', '.join(small)}: need at least 1")
    return policies
