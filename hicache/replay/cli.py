"""`hicache replay`: replay a request trace through the hierarchical cache, per host ratio and policy.

Every invocation first replays the device-only baseline (no host tier, ratio 0), then
each ``--hicache-ratio`` (``1,2,4`` sweeps), each with every ``--hicache-eviction-policy``
(``lru,lfu`` sweeps them side by side). Per run it reports device, host and total hit
rates (fractions of prompt tokens served from cache), tokens recomputed, pages and bytes
moved each way, transfer GB/s (time from launch to completion) and the peak host bytes in
use; and, for the run's device + host (+ storage) tokens, three bounds computed from the workload
alone (`hicache.replay.bounds`: an ideal LRU, Belady's clairvoyant cache, an infinite
cache); ``--plot FILE`` also draws them (needs matplotlib).

With ``--hicache-storage-backend file|mooncake`` every run with a host tier also has the
storage tier (`hicache.replay.storage`): storage hit rate, bytes read and written and
storage GB/s join the table and the JSON, and a second replay starts warm.

Every page brought back from the host or storage (and every device hit) is checked byte for byte
against what its prefix must hold (`hicache.replay.content`). The verdict (the summary's
last line, ``--json``'s ``verdict``) and the exit status:

    OK           0    pages came back from host or storage and every byte matched
    NOT CHECKED  1    nothing came back (the workload fits the device); 0 with --allow-device-only
    FAILED       1    a run's every transfer failed (some failed transfers are a warning)
    MISMATCH     1    a byte differs: the run stops there
    NO MEMORY    1    a run could not get its host or device memory (other processes took it)
    INTERRUPTED  130  Ctrl-C; 143 for SIGTERM, which stops the same way (the run's store
                      writes in flight end before the exit; a second SIGTERM is ignored)

Whatever stops the sweep, the rows of the runs that finished are printed (and are in
``--json``) before the one line that says why. Every flag is checked before the first run
(errors name the flag, exit status 2; a storage flag without ``--hicache-storage-backend``
is refused, a ``--plot`` path or format that cannot be written too). The flags live in
`hicache.replay.args`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from bounded_input import STALL_S
from hicache.build import build, check_backend_device, check_backend_usable
from hicache.cli.checks import (check_device_tokens, check_fits_device, check_sweep, default_layers, parse_device,
                                stack_from_flags)
from hicache.config import HiCacheConfig, check_storage_flags
from hicache.radix.hints.envelope import capabilities, capability_line
from hicache.replay.args import add_replay_args
from hicache.replay.bounds import TraceBounds
from hicache.replay.builtin import WORKLOADS
from hicache.replay.content import ReplayMismatch
from hicache.replay.plot import check_plot_path, draw
from hicache.replay.progress import Progress, line_break
from hicache.replay.report import Verdict, format_table, json_row, summary, verdict
from hicache.replay.run import Replayer
from hicache.replay.snapshots import SnapshotRule
from hicache.replay.stats import RunStats, tier_tokens
from hicache.replay.storage import fill_storage_defaults, open_run_store, probe_storage, storage_config
from hicache.replay.timing import RunTiming
from hicache.replay.workload import MAX_PROMPT_TOKENS, Request, TraceLimits, load_trace
from hicache.sizing import plan_sizes
from hicache.tmpdirs import Terminated
from host_pools.memory import HostMemoryError

__all__ = ["add_replay_args", "replay_one", "run_replay"]

MAX_THREADS = 1024  # torch takes a C int; more threads than any machine's cores is a typo
MAX_STALL_S = 24 * 3600.0  # --trace-stall-timeout: a day; more is a typo (poll takes an int of milliseconds)


def _workload(args: argparse.Namespace, capacity_tokens: int) -> tuple[list[Request], str]:
    """The requests and what they are (the summary's words); a trace's prompts at most
    ``--max-prompt-tokens`` and ``capacity_tokens`` (the sweep's largest cache) long."""
    if args.max_requests is not None and args.max_requests < 1:
        raise ValueError(f"--max-requests: must be >= 1, got {args.max_requests}")
    if args.trace:
        if args.workload:
            raise ValueError(f"--workload {args.workload}: not with --trace (the trace is the workload)")
        return load_trace(args.trace, args.max_requests, _trace_limits(args, capacity_tokens)), Path(args.trace).name
    workload = WORKLOADS[args.workload or "chat"]
    reqs = workload.make(args.seed)
    return (reqs[:args.max_requests] if args.max_requests else reqs), f"{workload.description}, seed {args.seed}"


def _config(args: argparse.Namespace, ratio: float, policy: str | None = None) -> HiCacheConfig:
    # ratio 0 = device-only baseline: a ratio so small that every host pool has 0 rows
    config = HiCacheConfig(hicache_ratio=ratio if ratio > 0 else 1e-12, write_policy=args.write_policy,
                           io_backend=args.io_backend, mem_layout=args.mem_layout,
                           swa_full_tokens_ratio=args.swa_full_tokens_ratio,
                           state_interval=getattr(args, "state_interval", 0),
                           eviction_policy=policy or args.eviction_policies[0],
                           host_headroom_gb=getattr(args, "host_headroom_gb", None),
                           host_dtype=getattr(args, "host_dtype", "auto"),
                           max_retained_ratio=getattr(args, "max_retained_ratio", 0.5), load_policy=args.load_policy,
                           device_profile=args.device_profile)
    return storage_config(config, args, ratio)


def replay_one(args: argparse.Namespace, stack, requests: list[Request], ratio: float, device_tokens: int,
               device: torch.device, progress: Progress | None = None, policy: str | None = None,
               hints: str = "on") -> RunStats:
    """Build a fresh cache for ``ratio`` (0 = no host tier, no storage tier) and eviction
    ``policy`` (None: the first of ``--hicache-eviction-policy``), and replay ``requests`` on
    it with the trace's client hints as ``hints`` says (`hicache.replay.hintplay`)."""
    cache = build(stack, device_tokens, _config(args, ratio, policy), device=device)
    try:
        replayer = Replayer(cache, ratio, storage=open_run_store(cache, ratio), hints=hints,
                            timing=RunTiming.from_args(args, stack.page_size))
        try:
            return replayer.run(requests, progress)
        finally:
            replayer.close()
    finally:
        cache.close()


def _trace_limits(args: argparse.Namespace, capacity_tokens: int) -> TraceLimits:
    """``--max-prompt-tokens`` and ``--trace-stall-timeout`` checked; the prompt limit is the
    smaller of the flag and what the sweep's largest cache holds."""
    limit = MAX_PROMPT_TOKENS if args.max_prompt_tokens is None else args.max_prompt_tokens
    if limit < 1:
        raise ValueError(f"--max-prompt-tokens: must be >= 1, got {limit}")
    stall_s = STALL_S if args.trace_stall_timeout is None else args.trace_stall_timeout
    if not 0 < stall_s <= MAX_STALL_S:
        raise ValueError(f"--trace-stall-timeout: must be in (0, {MAX_STALL_S:g}] seconds, got {stall_s:g}")
    if capacity_tokens < limit:
        return TraceLimits(capacity_tokens, "the most the largest cache of this sweep holds (device + host "
                           "+ storage anchor tokens; a longer prompt could never be served)", stall_s)
    return TraceLimits(limit, "the limit of --max-prompt-tokens", stall_s)


def _check_sizes(args: argparse.Namespace, stack, device_tokens: int, device: torch.device) -> None:
    """Every run of the sweep fits the host budget and the device, before the first one starts."""
    for ratio in [0.0, *args.hicache_ratio]:
        plan = plan_sizes(stack, device_tokens, _config(args, ratio))
        if not plan.fits:
            gib = 1 << 30
            raise ValueError(f"--hicache-ratio {ratio:g}: the host pools need {plan.host_bytes_total / gib:.2f} GiB, "
                             f"the host budget is {plan.budget.budget_bytes / gib:.2f} GiB "
                             f"({plan.budget.describe()}); lower --hicache-ratio, --device-tokens or "
                             "--hicache-host-headroom")
        check_fits_device(plan, device)


def _largest_capacity(args: argparse.Namespace, stack, device_tokens: int) -> int:
    """The largest run's capacity in anchor tokens (`tier_tokens`), from the plans alone:
    arithmetic, nothing allocated and nothing of this machine's memory checked."""
    return max(_capacity(plan_sizes(stack, device_tokens, config), stack, config)
               for config in (_config(args, ratio) for ratio in [0.0, *args.hicache_ratio]))


def _capacity(plan, stack, config: HiCacheConfig) -> int:
    """A run's anchor tokens on every tier, from its plan (nothing allocated)."""
    anchor = next(p for p in plan.pools if p.name == stack.anchor.name)
    per_row = stack.anchor.tokens_per_row
    storage = None if config.storage_backend == "none" else config.storage_capacity_bytes
    return tier_tokens(anchor.device_rows * per_row, anchor.host_rows * per_row, plan.host_bytes_total, storage)


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


class _Sweep:
    """The runs of one invocation, in order: every ratio (the baseline 0 first), each with
    every policy; what finished, and the label of the run under way."""

    def __init__(self, args: argparse.Namespace) -> None:
        modes = getattr(args, "hint_modes", ["on"])
        self.plan = [(r, p, h) for r in [0.0, *args.hicache_ratio] for p in args.eviction_policies for h in modes]
        self.several = len(args.eviction_policies) > 1
        self.modes = len(modes) > 1
        self.runs: list[RunStats] = []

    def label(self, i: int) -> str:
        ratio, policy, hints = self.plan[i]
        return (("device only" if ratio == 0 else f"ratio {ratio:g}") + (f", {policy}" if self.several else "")
                + (f", hints {hints}" if self.modes else ""))

    def stopped(self) -> str:
        """The end of the one line that says why the sweep stopped."""
        done = "the rows above are the finished runs" if self.runs else "no run finished"
        return f"after {len(self.runs)} of {len(self.plan)} runs; {done}"


def _run(args: argparse.Namespace) -> int:
    stack = stack_from_flags(args.model, args.layers if args.layers is not None else default_layers(args.model))
    check_sweep(args.hicache_ratio)
    device = parse_device(args.device)
    check_backend_device(args.io_backend, device)  # dma without CUDA, named before the memory checks
    device_tokens = check_device_tokens(args.device_tokens if args.device_tokens is not None
                                        else (1 << 20 if args.trace else 32768), stack)
    plot_path = check_plot_path(args.plot)  # the path, matplotlib and the format, before any run
    fill_storage_defaults(args, stack)
    capacity = _largest_capacity(args, stack, device_tokens)  # the longest prompt any run could serve
    requests, what = _workload(args, capacity)  # every trace line is checked before anything replays
    _check_sizes(args, stack, device_tokens, device)  # bad flag values fail before the first run
    check_storage_flags(args)  # after the values' own checks, which name a bad value first
    check_backend_usable(args.io_backend)  # a backend that cannot run here, before any run (build checks too)
    RunTiming.from_args(args, stack.page_size)  # the profile and the model's shape, before any run
    storage = probe_storage(args, stack, _config(args, 0.0))
    bounds = TraceBounds(requests, stack.page_size, SnapshotRule.of(stack, _config(args, 0.0)))
    sweep = _Sweep(args)
    out = _Output(args, stack, device, storage, bounds)
    try:
        for i, (ratio, policy, hints) in enumerate(sweep.plan):
            progress = Progress(len(requests), sweep.label(i), not args.no_progress)
            sweep.runs.append(replay_one(args, stack, requests, ratio, device_tokens, device, progress, policy,
                                         hints))
            progress.finish()
    except ReplayMismatch as exc:
        return out.stop(sweep.runs, Verdict("MISMATCH", f"hicache replay: MISMATCH: {exc}"), 1)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (Terminated): what finished is still worth printing
        stop, status = ("stopped by SIGTERM", exc.status) if isinstance(exc, Terminated) else \
            ("interrupted (Ctrl-C)", 130)
        line = f"{line_break()}hicache replay: {stop} {sweep.stopped()}"
        return out.stop(sweep.runs, Verdict("INTERRUPTED", line), status)
    except Exception as exc:
        if not _out_of_memory(exc):
            out.rows(sweep.runs)  # the finished rows, whatever the error (the CLI prints it next)
            raise
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        line = (f"{line_break()}hicache replay: error: {sweep.label(len(sweep.runs))}: cannot get its memory "
                f"({why}) {sweep.stopped()}")
        return out.stop(sweep.runs, Verdict("NO MEMORY", line), 1)
    return _finish(args, out, sweep.runs, _describe(args, stack, what, sweep.runs, device_tokens), plot_path)


def _out_of_memory(exc: BaseException) -> bool:
    """A run that could not get its memory: the host pools' reservation, or a device or
    CPU allocation (torch's CPU allocator raises a plain RuntimeError)."""
    if isinstance(exc, (HostMemoryError, MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _finish(args: argparse.Namespace, out: "_Output", runs: list[RunStats], workload: str,
            plot_path: Path | None) -> int:
    """Every run finished: rows, summary, verdict and plot; the exit status."""
    status = _transfer_status(runs)
    v = verdict(runs, status == 1, args.allow_device_only)
    out.rows(runs, v)
    if not args.json:
        print(f"\n{summary(runs, workload, v)}")
    if v.word == "NOT CHECKED" and not args.allow_device_only:
        print("hicache replay: NOT CHECKED: nothing came back from host or storage, so no restore was checked; "
              "lower --device-tokens, or pass --allow-device-only for a device-only replay", file=sys.stderr)
        status = max(status, 1)
    if plot_path is not None:
        status = max(status, out.plot(runs, plot_path))
    return status


def _describe(args: argparse.Namespace, stack, what: str, runs: list[RunStats], device_tokens: int) -> str:
    """The workload line of the summary: what was replayed and how large it is."""
    hinted = sum(st.hints_sent for st in runs)
    caps = capability_line(capabilities(getattr(args, "max_retained_ratio", 0.5), HiCacheConfig().max_hint_ttl_s))
    sent = f"client hints sent per run: {', '.join(f'{st.hints_sent:,}' for st in runs)}; " if hinted else ""
    return (f"{sent}{caps}\nworkload: {runs[0].requests:,} requests of {what}, {runs[0].tokens_total:,} prompt "
            f"tokens per run; {stack.model}, {stack.num_model_layers} layers, device {device_tokens:,} tokens")


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


class _Output:
    """Where the rows go: the tables, or one JSON object (``--json``), with their bounds."""

    def __init__(self, args: argparse.Namespace, stack, device: torch.device, storage: str,
                 bounds: TraceBounds) -> None:
        self.args, self.stack, self.device, self.storage, self.bounds = args, stack, device, storage, bounds

    def rows(self, runs: list[RunStats], v: Verdict | None = None) -> None:
        """The runs' rows (a table, or ``--json``'s object with the verdict)."""
        bounds = [self.bounds.at(st.capacity_tokens) for st in runs]
        if self.args.json:
            doc = {"runs": [json_row(st, b) for st, b in zip(runs, bounds)]}
            if v is not None:
                doc |= {"verdict": v.word, "verdict_line": v.line.strip()}
            print(json.dumps(doc))
        elif runs:
            print(format_table(self.stack, runs, bounds, self.device, self.storage, self.args.copy_rates))

    def stop(self, runs: list[RunStats], v: Verdict, status: int) -> int:
        """The sweep stopped: the finished rows, then the one line why (stderr)."""
        self.rows(runs, v)
        print(v.line, file=sys.stderr)
        return status

    def plot(self, runs: list[RunStats], path: Path) -> int:
        """Draw the plot after the results are out (its path and format were checked at start)."""
        title = (f"{self.stack.model}, {runs[0].requests} requests, {self.args.write_policy} "
                 f"({self.device.type} replay)")
        try:
            draw(runs, [self.bounds.at(st.capacity_tokens) for st in runs], path, title)
        except OSError as exc:
            print(f"hicache replay: error: --plot {path}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"plot: {path}", file=sys.stderr if self.args.json else sys.stdout)
        return 0
