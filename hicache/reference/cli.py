"""`hicache verify-model`: flags, the human and JSON reports, exit statuses.

Importing this module imports no torch (``hicache --help`` stays fast); the run imports
`hicache.reference.verify`.

Exit status: 0 every request within tolerance and some prefix restored from host or storage,
1 a mismatch (a wrong restore, or the ``--fault`` negative control caught) or a run that
restored nothing (no restore was checked; ``--allow-device-only`` accepts it), 2 a bad flag
or a fault that found no load to corrupt.
"""
from __future__ import annotations

import argparse
import json
import sys

from hicache.config import EVICTION_POLICIES, IO_BACKENDS, MEM_LAYOUTS, WRITE_POLICIES
from hicache.reference.options import (HOST_DTYPES, KV_DTYPES, LINEAR_ARCH_NAMES, MAX_KL_TOLERANCE, MEAN_KL_TOLERANCE,
                                       SIZE_LIMITS, TOLERANCE, TOP1_TOLERANCE, WRONG_BOUNDARY, VerifyOptions)

ARCH_NAMES = ("deepseek-v4", "mha", *LINEAR_ARCH_NAMES)  # = hicache.reference.config.ARCHS (torch-free here)

JSON_KEYS = ("requests", "tokens_from", "max_abs_logit_diff", "greedy_identical", "greedy_total", "ok",
             "mean_kl", "max_kl", "top1_agreement", "criterion")


def add_verify_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of ``hicache verify-model`` (defaults: `VerifyOptions`)."""
    d = VerifyOptions()
    p.description = ("A tiny random-weight paged model (DeepSeek-V4, GQA, Qwen3.5 or Nemotron-H) served multi-turn "
                     "through the "
                     "radix tree, controller, host pools and storage; every request's logits are compared "
                     f"with an uninterrupted recompute. Exit 0: all within {TOLERANCE:g}, greedy tokens "
                     "identical and some prefix restored from host or storage (a bf16 kv pool, e.g. with "
                     f"--hicache-host-dtype int8: mean KL <= {MEAN_KL_TOLERANCE:g} and top-1 agreement >= "
                     f"{TOP1_TOLERANCE:g} over requests restored from host/storage, every request's max KL <= "
                     f"{MAX_KL_TOLERANCE:g}); 1: a mismatch, or nothing restored (see --allow-device-only); "
                     "2: a bad flag.")
    p.add_argument("--arch", default=d.arch, help=f"one of {', '.join(ARCH_NAMES)} (default %(default)s)")
    p.add_argument("--layers", type=int, default=d.layers, help=f"decoder layers, {_range('--layers')} (default 4: SWA, CSA, HCA, CSA)")
    p.add_argument("--conversations", type=int, default=d.conversations, help=f"conversations, {_range('--conversations')} (default %(default)s)")
    p.add_argument("--turns", type=int, default=d.turns, help=f"turns per conversation, {_range('--turns')} (default %(default)s)")
    p.add_argument("--decode-tokens", dest="decode_tokens", type=int, default=d.decode_tokens,
                   help=f"greedy tokens decoded per request, {_range('--decode-tokens')} (default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="weights and workload seed (default %(default)s)")
    p.add_argument("--hicache-ratio", dest="hicache_ratio", type=float, default=d.hicache_ratio,
                   help="host tokens per device token (default %(default)s)")
    p.add_argument("--device-tokens", dest="device_tokens", type=int, default=d.device_tokens,
                   help=f"device anchor tokens, at most {SIZE_LIMITS['--device-tokens'][2]} (default: one page more than "
                        "the longest request)")
    p.add_argument("--hicache-storage-backend", dest="storage_backend", default=d.storage_backend,
                   choices=("none", "file"),
                   help="storage tier below the host (default %(default)s)")
    p.add_argument("--hicache-storage-dir", dest="storage_dir", default=d.storage_dir,
                   help="directory of the file store (default: a temporary one, removed at exit)")
    p.add_argument("--device", default=d.device, help="cpu (default) or cuda[:N]")
    p.add_argument("--hicache-io-backend", "--io-backend", dest="io_backend", default=d.io_backend,
                   choices=IO_BACKENDS, help="transfer backend (default auto; --io-backend is an alias)")
    p.add_argument("--hicache-write-policy", dest="write_policy", default=d.write_policy, choices=WRITE_POLICIES,
                   help="device -> host backups (default %(default)s)")
    p.add_argument("--hicache-eviction-policy", dest="eviction_policy", default=d.eviction_policy,
                   choices=EVICTION_POLICIES, help="which leaf the device and host tiers evict first "
                                                   "(default %(default)s)")
    p.add_argument("--hicache-mem-layout", dest="mem_layout", default=d.mem_layout, choices=MEM_LAYOUTS,
                   help="host pool layout (default %(default)s)")
    p.add_argument("--kv-format", dest="kv_format", default=d.kv_format,
                   help="deepseek-v4 pool rows: fp32 (default) or fp8_ds_mla (the real model's fp8 rows "
                        "with their scales; the model then computes in float64)")
    p.add_argument("--hicache-host-dtype", dest="host_dtype", default=d.host_dtype, choices=HOST_DTYPES,
                   help="host tier format: auto (the device dtype, byte-exact; default) or int8 (int8 rows + "
                        "an fp32 scale per token and head; judged by KL and top-1 agreement, see above)")
    p.add_argument("--kv-dtype", dest="kv_dtype", default=d.kv_dtype, choices=KV_DTYPES,
                   help="the mha toy's kv pool: auto (bfloat16 with --hicache-host-dtype int8, else "
                        "float32; default), float32 or bfloat16 (judged by KL and top-1 agreement)")
    p.add_argument("--fault", default=None, metavar="POOL",
                   help="negative control: corrupt what loads bring back for POOL, or (hybrid models) "
                        f"{WRONG_BOUNDARY}: resume from another boundary's snapshot; the run must fail")
    p.add_argument("--hicache-state-interval", dest="state_interval", type=int, default=d.state_interval,
                   help="tokens between the state snapshots a request saves, a multiple of the page (default: 2 "
                        "pages for qwen3.5 / nemotron-h, every page for deepseek-v4)")
    p.add_argument("--allow-device-only", action="store_true",
                   help="accept a run in which no prefix came back from host or storage (default: exit 1, "
                        "nothing was restored, so nothing was checked)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _range(flag: str) -> str:
    """``"1-64"``: a size flag's range (`SIZE_LIMITS`), for its help."""
    _, low, high = SIZE_LIMITS[flag]
    return f"{low}-{high}"


def run_verify_model(args: argparse.Namespace) -> int:
    """Run one verification from parsed flags; returns the exit status.

    Raises:
        ValueError: a bad flag (one line naming it; `hicache.cli` prints it, status 2).
    """
    import torch

    from hicache.reference.progress import RunProgress
    from hicache.reference.verify import run_verify
    from hicache.storage import StorageUnavailableError
    from hicache.tmpdirs import sigterm_unwinds

    fields = VerifyOptions.__dataclass_fields__
    opts = VerifyOptions(**{k: v for k, v in vars(args).items() if k in fields})
    if opts.device == "cpu":
        torch.set_num_threads(1)  # the model's ops are tiny: threads only add contention
    try:
        with sigterm_unwinds():  # a SIGTERM still removes the temporary store (exit 143)
            report = run_verify(opts, progress=RunProgress(opts))  # a long run says how far it is, on stderr
    except StorageUnavailableError as exc:
        raise ValueError(str(exc.__cause__ or exc)) from None  # the store's own message, without the
        # --hicache-storage-optional advice of a server (verify-model has no such flag)
    if opts.fault and not report.fault_rows:
        what = "no request resumed from a snapshot" if opts.fault == WRONG_BOUNDARY else "no load brought that pool back"
        raise ValueError(f"--fault {opts.fault}: {what}, nothing was corrupted "
                         "(use more --conversations or a smaller --hicache-ratio)")
    unrestored = _nothing_restored(report, args)
    if args.json:
        print(json.dumps(report.as_json() | {"nothing_restored": unrestored is not None}))
    else:
        print(_human(report, opts, unrestored is not None))
    if unrestored:
        print(unrestored, file=sys.stderr)
        return 1
    return 0 if report.ok else 1


def _nothing_restored(report, args: argparse.Namespace) -> str | None:
    """The line that fails a run no restore was checked in (no host or storage hit), or None."""
    t = report.tokens_from
    if t["host"] + t["storage"] > 0 or args.allow_device_only:
        return None
    return ("hicache verify-model: NOTHING RESTORED: no prefix came back from host or storage (host 0, "
            "storage 0 tokens), so no restore was checked; use a smaller --device-tokens or more "
            "--conversations, or pass --allow-device-only for a device-only run")


def _human(r, opts, unrestored: bool = False) -> str:
    t = r.tokens_from
    storage = "no storage" if opts.storage_backend == "none" else f"storage {opts.storage_backend}"
    lines = [
        f"hicache verify-model: {r.arch}{'' if opts.kv_format == 'fp32' else ' ' + opts.kv_format}, "
        f"{opts.layers} layers, seed {opts.seed}: {r.requests} requests "
        f"({opts.conversations} conversations x {opts.turns} turns), {opts.write_policy}, "
        f"eviction {opts.eviction_policy}, {opts.mem_layout}, "
        f"{storage}, device {opts.device}, io {opts.io_backend}",
        f"  prompt tokens from device {t['device']}, host {t['host']}, storage {t['storage']}, "
        f"computed {t['computed']}",
        f"  max |logit diff| vs an uninterrupted recompute: {r.max_abs_logit_diff:.2e} "
        + (f"(tolerance {r.tolerance:.0e})" if r.criterion == "exact" else "(a bf16 pool: judged by KL below)")
        + f"; greedy tokens identical: {r.greedy_identical}/{r.greedy_total}",
    ]
    if r.criterion == "distribution":
        restored = "no request restored from host or storage" if r.mean_kl is None else (
            f"{r.restored_requests} requests restored from host/storage: mean KL {r.mean_kl:.2e} (tolerance "
            f"{MEAN_KL_TOLERANCE:g}), max KL {r.max_kl:.2e}, top-1 agreement {r.top1_agreement:.4f} "
            f"(tolerance {TOP1_TOLERANCE:g})")
        lines.append(f"  kv {r.kv_dtype}, host {r.host_dtype}: {restored}; every request's max KL <= "
                     f"{MAX_KL_TOLERANCE:g}")
    if r.topk_exercised is not None:
        gap = "" if r.topk_min_gap is None else f", smallest score gap at the boundary {r.topk_min_gap:.1e}"
        lines.append(f"  indexer top-k: {r.topk_exercised:.0%} of queries had more entries to choose from{gap}")
    if r.fault == WRONG_BOUNDARY:
        lines.append(f"  fault: {r.fault_rows} resumes from another boundary's snapshot (negative control)")
    elif r.fault:
        lines.append(f"  fault: {r.fault_rows} rows of {r.fault} corrupted on loads (negative control)")
    verdict = "OK" if r.ok else f"MISMATCH in {r.mismatched_requests} of {r.requests} requests"
    if unrestored:
        verdict = f"NOTHING RESTORED ({'logits within tolerance' if r.ok else verdict}, but no restore checked)"
    lines.append(f"  {verdict} ({r.seconds:.1f} s)")
    return "\n".join(lines)
