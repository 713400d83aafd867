"""A device profile of the machine this runs on (`hicache.cost.profile`), measured.

Question answered: what do this machine's links and prefill achieve, in the form the
time estimates read (``hicache replay --device-profile FILE``)? Used three ways:

    python bench/device_profile.py --out FILE        links (contiguous pinned H2D / D2H at
                                                     1-256 MB, fitted: GB/s + fixed cost) and
                                                     prefill rates (bf16 / fp8 GEMMs, causal
                                                     attention, an HBM copy); the quick GPU
                                                     check's ``profile`` step
    bench/load_batch.py --calibrate                  hicache's own loads and backups (each
                                                     measured job's best backend), fitted
    bench/storage.py                                 each backend's get / set, fitted

Each writes (or updates, keeping the sections it did not measure) a profile file, by
default ``bench/results/local/profile_<device>.json``; sections it did not measure come
from ``--base`` (a shipped profile) and say so in their ``source``. The fixed cost per
forward of a serving engine is not measured here (it is kept from the base).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from hicache.cost import DeviceProfile, Link, PrefillRates, Store, load_profile, save_profile  # noqa: E402

SIZES_MB = (1, 8, 64, 256)


def fit(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(GB/s, fixed seconds) of ``time = fixed + bytes / rate`` over (bytes, seconds) samples,
    least squares; the fixed cost is never below 0.

    Raises:
        ValueError: fewer than two distinct sizes, or times that do not grow with bytes.
    """
    x = np.asarray([b for b, _ in samples], float)
    y = np.asarray([s for _, s in samples], float)
    if len(set(x.tolist())) < 2:
        raise ValueError(f"samples: need at least two sizes, got {sorted(set(x.tolist()))}")
    slope, fixed = np.polyfit(x, y, 1)
    if slope <= 0:
        raise ValueError(f"samples: the time does not grow with the bytes ({samples})")
    return float(1 / slope / 1e9), max(0.0, float(fixed))


def profile_path(device: torch.device, out: str | Path | None) -> Path:
    return Path(out) if out else harness.RESULTS_DIR / f"profile_{harness.device_slug(device)}.json"


def update(path: Path, base: str, device: torch.device, storage: dict[str, Store] | None = None,
           **parts) -> Path:
    """Write the profile at ``path``: what is there (else ``base``'s, each section's source
    saying so), with ``parts`` (``h2d``, ``d2h``, ``prefill``) and ``storage`` backends replaced."""
    fresh = not path.exists()
    old = load_profile(base if fresh else path)
    note = f"not measured here: from the {base} profile ({old.device}): " if fresh else ""

    def kept(section):
        return dataclasses.replace(section, source=note + section.source) if note else section

    sections = {k: parts.get(k) or kept(getattr(old, k)) for k in ("h2d", "d2h", "prefill")}
    stores = {k: kept(v) for k, v in old.storage.items()} | (storage or {})
    measured = "h2d" in parts or (not fresh and old.measured)
    profile = DeviceProfile(f"measured-{harness.device_slug(device)}", harness.device_name(device),
                            time.strftime("%Y-%m-%d"), measured, storage=stores, **sections)
    return save_profile(profile, path)


def measure_links(device: torch.device) -> tuple[Link, Link]:
    """Contiguous pinned copies both ways at `SIZES_MB`, one-shot (from an idle device), fitted."""
    pin = device.type == "cuda"
    out = []
    for direction in ("h2d", "d2h"):
        samples = []
        for mb in SIZES_MB:
            host = torch.empty(mb << 20, dtype=torch.uint8, pin_memory=pin)
            dev = torch.empty(mb << 20, dtype=torch.uint8, device=device)
            src, dst = (host, dev) if direction == "h2d" else (dev, host)
            t = harness.time_fn(lambda: dst.copy_(src, non_blocking=pin), device, warmup=2, reps=5)
            samples.append((mb << 20, t.p50_ms / 1e3))
        gbps, fixed = fit(samples)
        where = f"contiguous {'pinned ' if pin else ''}copies of {', '.join(map(str, SIZES_MB))} MB"
        out.append(Link(gbps, fixed, 0.0, measured=True, source=(
            f"measured on {harness.device_name(device)} by bench/device_profile.py: {where} fitted as fixed + "
            f"bytes / GB/s ({time.strftime('%Y-%m-%d')})")))
    return out[0], out[1]


def measure_prefill(device: torch.device, base: PrefillRates, base_name: str = "h100") -> PrefillRates:
    """bf16 (and fp8 where torch has a scaled GEMM) GEMM TFLOPS, causal attention TFLOPS and
    an HBM copy's GB/s on ``device`` (CPU: small sizes, fp32); the fixed cost kept from ``base``
    (the profile ``base_name``'s)."""
    cuda = device.type == "cuda"
    n, dtype = (8192, torch.bfloat16) if cuda else (512, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    gemm = 2 * n ** 3 / (harness.time_fn(lambda: a @ a, device, warmup=2, reps=5).p50_ms / 1e3) / 1e12
    fp8 = gemm
    if cuda and hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
        try:
            a8, one = a.to(torch.float8_e4m3fn), torch.ones((), device=device)
            b8 = a8.t().contiguous().t()  # column-major, as the scaled GEMM wants its second operand
            run = lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)  # noqa: E731
            fp8 = 2 * n ** 3 / (harness.time_fn(run, device, warmup=2, reps=5).p50_ms / 1e3) / 1e12
        except (RuntimeError, TypeError):  # no fp8 GEMM on this device or torch
            pass
    heads, seq, dim = (32, 8192, 128) if cuda else (4, 512, 64)
    q = torch.randn(1, heads, seq, dim, device=device, dtype=dtype)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ms = harness.time_fn(lambda: sdpa(q, q, q, is_causal=True), device, warmup=2, reps=5).p50_ms
    attention = 4 * heads * dim * seq * seq / 2 / (ms / 1e3) / 1e12
    big = torch.empty((1 << 30) if cuda else (64 << 20), dtype=torch.uint8, device=device)
    copy = 2 * big.numel() / (harness.time_fn(lambda: big.clone(), device, warmup=1, reps=5).p50_ms / 1e3) / 1e9
    return PrefillRates(gemm, fp8, attention, copy, base.fixed_s, measured=True, source=
                        f"measured on {harness.device_name(device)} by bench/device_profile.py "
                        f"({time.strftime('%Y-%m-%d')}): {dtype} GEMM {n}^3, fp8 scaled GEMM where available, causal "
                        f"SDPA {heads}x{seq}x{dim}, a {big.numel() >> 20} MB copy (read + write); the fixed cost per "
                        f"forward is {base_name}'s, not measured")


def fit_store(rows: Sequence[dict], backend: str) -> Store:
    """A `Store` from ``bench/storage.py`` rows of one backend (each pool's batch bytes and p50)."""
    def of(op: str) -> tuple[float, float]:
        return fit([(r["KB"] * 1024 * r["batch_pages"], r["p50_ms"] / 1e3) for r in rows
                    if r["backend"] == backend and r["op"] == op])
    (read, read_s), (write, write_s) = of("get"), of("set")
    return Store(read, write, read_s, write_s, measured=True, source=
                 f"measured by bench/storage.py ({backend}, {time.strftime('%Y-%m-%d')}): batch_get / batch_set "
                 "p50 per pool's batch, fitted as latency + bytes / GB/s")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/device_profile.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="profile file (default bench/results/local/profile_<device>.json)")
    p.add_argument("--base", default="h100", help="shipped profile the unmeasured sections come from")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    h2d, d2h = measure_links(device)
    path = profile_path(device, args.out)
    prefill = measure_prefill(device, load_profile(args.base).prefill, args.base)
    print(f"wrote {update(path, args.base, device, h2d=h2d, d2h=d2h, prefill=prefill)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
