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
the run with exit status 1. A run whose every transfer failed (a backend that cannot
copy) prints its rows, one line saying so, and exits 1; some failed transfers are a
warning. Every flag is checked before the first run (errors name the flag, exit status 2;
a storage flag without ``--hicache-storage-backend`` is refused, an unwritable ``--plot``
path too); Ctrl-C prints the runs finished so far and exits with 130. The flags live in
`hicache.replay.args`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from hicache.build import build, check_backend_device, check_backend_usable
from hicache.cli_checks import check_device_tokens, check_fits_device, check_sweep, parse_device, stack_from_flags
from hicache.config import HiCacheConfig, check_storage_flags
from hicache.replay.args import add_replay_args
from hicache.replay.content import ReplayMismatch
from hicache.replay.report import format_table, json_row, plot, summary
from hicache.replay.run import Replayer, RunStats
from hicache.replay.storage import fill_storage_defaults, open_run_store, probe_storage, storage_config
from hicache.replay.workload import Request, chat_workload, load_trace
from hicache.sizing import plan_sizes

__all__ = ["add_replay_args", "replay_one", "run_replay"]

MAX_THREADS = 1024  # torch takes a C int; more threads than any machine's cores is a typo


def _workload(args: argparse.Namespace) -> list[Request]:
    if args.max_requests is not None and args.max_requests < 1:
        raise ValueError(f"--max-requests: must be >= 1, got {args.max_requests}")
    if args.trace:
        return load_trace(args.trace, args.max_requests)
    reqs = chat_workload(args.seed)
    return reqs[:args.max_requests] if args.max_requests else reqs


def _describe(args: argparse.Namespace, stack, runs: list[RunStats], device_tokens: int) -> str:
    """The workload line of the summary: what was replayed and how large it is."""
    what = (f"{Path(args.trace).name}" if args.trace
            else f"the built-in multi-turn chat (64 conversations of 2-8 turns, seed {args.seed})")
    return (f"workload: {runs[0].requests:,} requests of {what}, {runs[0].tokens_total:,} prompt tokens per run; "
            f"{stack.model}, {stack.num_model_layers} layers, device {device_tokens:,} tokens")


def _config(args: argparse.Namespace, ratio: float) -> HiCacheConfig:
    # ratio 0 = device-only baseline: a ratio so small that every host pool has 0 rows
    config = HiCacheConfig(hicache_ratio=ratio if ratio > 0 else 1e-12, write_policy=args.write_policy,
                           io_backend=args.io_backend, mem_layout=args.mem_layout,
                           swa_full_tokens_ratio=args.swa_full_tokens_ratio,
                           host_dtype=getattr(args, "host_dtype", "auto"))
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
    """``--plot`` as an absolute path that can be written, or None (no plot); checked now.

    The folder must exist: a mistyped folder is refused rather than created (the plot
    writes only the file it names). The check opens the file for appending and removes
    it again if it did not exist, so a run that ends early leaves nothing behind.
    """
    if not text:
        return None
    path = Path(text).expanduser().resolve()
    if path.is_dir():
        raise ValueError(f"--plot: {path} is a folder; give a file name such as hit_rate.png")
    if not path.parent.is_dir():
        what = "is not a folder" if path.parent.exists() else "does not exist"
        raise ValueError(f"--plot: {path.parent} {what}; create the folder first or choose another")
    try:
        existed = path.exists()
        with open(path, "ab"):
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        raise ValueError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
    return path


def run_replay(args: argparse.Namespace) -> int:
    """The ``replay`` subcommand. ValueError (bad flags, bad trace lines) goes to the CLI."""
    if not 1 <= args.threads <= MAX_THREADS:
        raise ValueError(f"--threads: must be in [1, {MAX_THREADS}], got {args.threads}")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    layers = args.layers if args.layers is not None else (4 if args.model.startswith("deepseek-v4") else 2)
    stack = stack_from_flags(args.model, layers)
    check_sweep(args.hicache_ratio)
    device = parse_device(args.device)
    check_backend_device(args.io_backend, device)  # dma without CUDA, named before the memory checks
    device_tokens = check_device_tokens(args.device_tokens if args.device_tokens is not None
                                        else (1 << 20 if args.trace else 32768), stack)
    plot_path = _plot_path(args.plot)
    requests = _workload(args)  # every trace line is checked before anything replays
    fill_storage_defaults(args, stack)
    _check_sizes(args, stack, device_tokens, device)  # bad flag values fail before the first run
    check_storage_flags(args)  # after the values' own checks, which name a bad value first
    check_backend_usable(args.io_backend)  # a backend that cannot run here, before any run (build checks too)
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
    status = _transfer_status(runs)
    if not args.json:
        print(f"\n{summary(runs, _describe(args, stack, runs, device_tokens), status)}")
    if plot_path is not None:
        status = max(status, _write_plot(runs, plot_path, f"{stack.model}, {len(requests)} requests, "
                                                          f"{args.write_policy} ({device.type} replay)", args.json))
    return status


def _transfer_status(runs: list[RunStats]) -> int:
    """1 when a run's every transfer failed (said on stderr), else 0; some failures are a warning."""
    status = 0
    for st in runs:
        if not st.transfers_failed:
            continue
        label = "device only" if st.hicache_ratio == 0 else f"ratio {st.hicache_ratio:g}"
        total = st.transfers_ok + st.transfers_failed
        if st.transfers_ok == 0:
            print(f"hicache replay: error: {label}: every transfer failed ({total} backups and loads rolled "
                  f"back, the host tier never served): {st.transfer_error}", file=sys.stderr)
            status = 1
        else:
            print(f"hicache replay: warning: {label}: {st.transfers_failed} of {total} transfers failed "
                  f"(rolled back): {st.transfer_error}", file=sys.stderr)
    return status


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
