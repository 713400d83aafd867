"""`hicache replay`: replay a request trace through the hierarchical cache, per host ratio.

Every invocation first replays the device-only baseline (no host tier, ratio 0), then
each ``--hicache-ratio`` (``1,2,4`` sweeps). Per run it reports device, host and total
hit rates (fractions of prompt tokens served from cache), tokens recomputed, pages and
bytes moved each way, transfer GB/s (time from launch to completion) and the peak host
bytes in use; ``--plot FILE`` also draws hit rate vs ratio (needs matplotlib).

With ``--hicache-storage-backend file|mooncake`` every run with a host tier also has the
storage tier (`hicache.replay.storage`): storage hit rate, bytes read and written and
storage GB/s join the table and the JSON, and a second replay starts warm.

Every page brought back from the host or storage (and every device hit) is checked byte for byte
against what its prefix must hold (`hicache.replay.content`); the first mismatch stops
the run with exit status 1. Every flag is checked before the first run (errors name the
flag, exit status 2); Ctrl-C prints the runs finished so far and exits with 130.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

from hicache.build import build
from hicache.cli_checks import check_device_tokens, check_fits_device, parse_device, stack_from_flags
from hicache.config import IO_BACKENDS, MEM_LAYOUTS, WRITE_POLICIES, HiCacheConfig
from hicache.replay.content import ReplayMismatch
from hicache.replay.report import format_table, json_row, plot
from hicache.replay.run import Replayer, RunStats
from hicache.replay.storage import (add_replay_storage_args, fill_storage_defaults, open_run_store, probe_storage,
                                    storage_config)
from hicache.replay.workload import Request, chat_workload, load_trace
from hicache.sizing import plan_sizes



def _ratios(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"need numbers like 1,2,4, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"every ratio must be a finite number > 0, got {text!r}")
    return values


def add_replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", default=None, help="Mooncake JSONL trace (default: built-in chat workload)")
    p.add_argument("--model", default="deepseek-v3", help="preset name (default %(default)s)")
    p.add_argument("--layers", type=int, default=None,
                   help="use only the first N layers (default 4 for deepseek-v4-* presets, which covers "
                        "every pool family, else 2)")
    p.add_argument("--device-tokens", type=int, default=None,
                   help="device anchor tokens (default 32768; 1048576 with --trace)")
    p.add_argument("--hicache-ratio", type=_ratios, default=[1.0, 2.0, 4.0],
                   help="host/device ratio, or a list to sweep (default 1,2,4)")
    p.add_argument("--hicache-write-policy", dest="write_policy", default="write_through", help=", ".join(WRITE_POLICIES))
    p.add_argument("--hicache-io-backend", dest="io_backend", default="auto", help=", ".join(IO_BACKENDS))
    p.add_argument("--hicache-mem-layout", dest="mem_layout", default="page_first", help=", ".join(MEM_LAYOUTS))
    p.add_argument("--swa-full-tokens-ratio", type=float, default=0.1, help="DeepSeek-V4 device SWA share")
    p.add_argument("--max-requests", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--seed", type=int, default=0, help="seed of the built-in workload")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: on a shared 2-core machine more threads stall)")
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="also write a PNG of hit rate vs ratio to FILE (needs matplotlib; default: no plot)")
    p.add_argument("--json", action="store_true", help="print only the JSON results")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_replay_storage_args(p)


def _workload(args: argparse.Namespace) -> list[Request]:
    if args.max_requests is not None and args.max_requests < 1:
        raise ValueError(f"--max-requests: must be >= 1, got {args.max_requests}")
    if args.trace:
        return load_trace(args.trace, args.max_requests)
    reqs = chat_workload(args.seed)
    return reqs[:args.max_requests] if args.max_requests else reqs


def _config(args: argparse.Namespace, ratio: float) -> HiCacheConfig:
    # ratio 0 = device-only baseline: a ratio so small that every host pool has 0 rows
    config = HiCacheConfig(hicache_ratio=ratio if ratio > 0 else 1e-12, write_policy=args.write_policy,
                           io_backend=args.io_backend, mem_layout=args.mem_layout,
                           swa_full_tokens_ratio=args.swa_full_tokens_ratio)
    return storage_config(config, args, ratio)


class Progress:
    """A one-line progress bar on stderr, redrawn about 50 times per run.

    On a terminal the line is redrawn in place; in a log (stderr not a TTY) only the
    finished line is written, so CI logs get one line per run instead of fifty. The
    finished line comes from `finish`, once the run's results are kept (so a Ctrl-C
    after it never loses that run).
    """

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.step = max(1, total // 50) if sys.stderr.isatty() else 0

    def __call__(self, done: int) -> None:
        if self.enabled and self.step and done % self.step == 0 and done < self.total:
            self._draw(done)

    def finish(self) -> None:
        if self.enabled:
            self._draw(self.total)
            print(file=sys.stderr, flush=True)

    def _draw(self, done: int) -> None:
        bar = "#" * (30 * done // max(self.total, 1))
        print(f"\r{self.label:<14} [{bar:<30}] {done}/{self.total}", end="", file=sys.stderr, flush=True)


def replay_one(args: argparse.Namespace, stack, requests: list[Request], ratio: float,
               device_tokens: int, device: torch.device, progress: Progress | None = None) -> RunStats:
    """Build a fresh cache for ``ratio`` (0 = no host tier, no storage tier) and replay
    ``requests`` on it."""
    cache = build(stack, device_tokens, _config(args, ratio), device=device)
    try:
        replayer = Replayer(cache, ratio, storage=open_run_store(cache, ratio))
        try:
            return replayer.run(requests, progress)
        finally:
            replayer.close()
    finally:
        cache.close()


def _check_sizes(args: argparse.Namespace, stack, device_tokens: int, device: torch.device) -> None:
    """Every run of the sweep fits the host budget and the device, before the first one starts."""
    for ratio in [0.0, *args.hicache_ratio]:
        plan = plan_sizes(stack, device_tokens, _config(args, ratio))
        if not plan.fits:
            gib = 1 << 30
            raise ValueError(f"--hicache-ratio {ratio:g}: the host pools need {plan.host_bytes_total / gib:.2f} GiB, "
                             f"the host budget is {plan.budget.budget_bytes / gib:.2f} GiB "
                             f"({plan.budget.describe()}); lower --hicache-ratio or --device-tokens")
        check_fits_device(plan, device)


def _plot_path(text: str | None) -> Path | None:
    """``--plot`` as an absolute path whose folder can be written, or None (no plot)."""
    if not text:
        return None
    path = Path(text).expanduser().resolve()
    if path.is_dir():
        raise ValueError(f"--plot: {path} is a folder; give a file name such as hit_rate.png")
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--plot: cannot write under {folder}")
    return path


def run_replay(args: argparse.Namespace) -> int:
    """The ``replay`` subcommand. ValueError (bad flags, bad trace lines) goes to the CLI."""
    if args.threads < 1:
        raise ValueError(f"--threads: must be >= 1, got {args.threads}")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    layers = args.layers if args.layers is not None else (4 if args.model.startswith("deepseek-v4") else 2)
    stack = stack_from_flags(args.model, layers)
    device = parse_device(args.device)
    device_tokens = check_device_tokens(args.device_tokens if args.device_tokens is not None
                                        else (1 << 20 if args.trace else 32768), stack)
    plot_path = _plot_path(args.plot)
    requests = _workload(args)  # every trace line is checked before anything replays
    fill_storage_defaults(args, stack)
    _check_sizes(args, stack, device_tokens, device)  # bad flag values fail before the first run
    storage = probe_storage(args, stack, _config(args, 0.0))
    runs: list[RunStats] = []
    ratios = [0.0, *args.hicache_ratio]
    try:
        for ratio in ratios:
            label = "device only" if ratio == 0 else f"ratio {ratio:g}"
            progress = Progress(len(requests), label, not args.no_progress)
            runs.append(replay_one(args, stack, requests, ratio, device_tokens, device, progress))
            progress.finish()
    except ReplayMismatch as exc:
        print(f"hicache replay: MISMATCH: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: what finished is still worth printing
        _print_runs(args, stack, runs, device, storage)
        print(f"{_line_break()}hicache replay: interrupted (Ctrl-C) after {len(runs)} of {len(ratios)} runs; "
              f"{'the rows above are the finished runs' if runs else 'no run finished'}", file=sys.stderr)
        return 130
    _print_runs(args, stack, runs, device, storage)
    if plot_path is None:
        return 0
    return _write_plot(runs, plot_path, f"{stack.model}, {len(requests)} requests, {args.write_policy} "
                                        f"({device.type} replay)", args.json)


def _print_runs(args: argparse.Namespace, stack, runs: list[RunStats], device: torch.device,
                storage: str = "") -> None:
    if args.json:
        print(json.dumps({"runs": [json_row(st) for st in runs]}))
    elif runs:
        print(format_table(stack, runs, device, storage))


def _line_break() -> str:
    """A newline when a progress bar may have left the cursor mid-line on a terminal."""
    return "\n" if sys.stderr.isatty() else ""


def _write_plot(runs: list[RunStats], path: Path, title: str, json_only: bool) -> int:
    """Draw the plot after the results are out; a missing matplotlib is a hint, not a failure."""
    try:
        plot(runs, str(path), title)
    except ImportError:
        print("hicache replay: no plot: matplotlib is not installed (`make setup` or `pip install matplotlib` "
              "adds it); the results above are complete", file=sys.stderr)
        return 0
    except OSError as exc:
        print(f"hicache replay: error: --plot {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"plot: {path}", file=sys.stderr if json_only else sys.stdout)
    return 0
