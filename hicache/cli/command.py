"""The `hicache` command itself: `plan`, `replay`, `bench`, `serve-vllm`, `verify-model` (and any subcommand in `SUBCOMMANDS`).

Start-up stays fast (``hicache --help`` well under a second) because nothing heavy is
imported before it is needed:

    hicache --help           this module and hicache.config only (the table's help strings)
    hicache plan --help      + the chosen subcommand's flags module (``add_args``), no torch
    hicache plan ...         + its runner module (``run``), which may import torch

A new subcommand is one `SUBCOMMANDS` entry: the module that adds its flags (keep it free
of torch, numpy-heavy modules and servers, so its ``--help`` is fast) and the function
that runs it (imported only to run). User mistakes are one line (exit 2), never a
traceback; Ctrl-C exits 130, and SIGTERM stops a subcommand the same way (its clean-ups
run: temporary folders, a store's writes in flight) with 143.
"""
from __future__ import annotations

import argparse
import importlib
import runpy
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple, NoReturn, Sequence


class Subcommand(NamedTuple):
    """One subcommand of `hicache`, loaded only when chosen."""

    help: str
    add_args: str  # "module:function(parser)"; imported to parse its flags (--help included)
    run: str  # "module:function(args) -> int", or (args, extra) with passes_extra; imported to run
    passes_extra: bool = False  # unknown flags go to the runner (vLLM's flags, a benchmark's)
    description: str | None = None
    allow_abbrev: bool = True


SUBCOMMANDS: dict[str, Subcommand] = {
    "plan": Subcommand("size device and host pools for a model (exit 1 if they do not fit)",
                       "hicache.plan:add_plan_args", "hicache.plan:run_plan"),
    "replay": Subcommand("replay a request trace through the cache, per host ratio",
                         "hicache.replay.args:add_replay_args", "hicache.replay.cli:run_replay"),
    "bench": Subcommand("run a benchmark of bench/ (source checkout)",
                        "hicache.cli.command:add_bench_args", "hicache.cli.command:run_bench", passes_extra=True),
    "serve-vllm": Subcommand(
        "start vLLM's OpenAI server, with hicache as its host tier when enabled",
        "hicache.integrations.vllm.serve:add_serve_args", "hicache.integrations.vllm.serve:run_serve",
        passes_extra=True, allow_abbrev=False,
        description="Unknown flags are passed to vLLM; --enable-hierarchical-cache and the "
                    "--hicache-* flags become vLLM's --kv-transfer-config."),
    "verify-model": Subcommand(
        "serve a tiny paged model through every tier and check its logits against an uninterrupted recompute",
        "hicache.reference.cli:add_verify_args", "hicache.reference.cli:run_verify_model"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line naming the flag (exit status 2), no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def load(target: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function (the module imported now)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word not starting with ``-``), if known."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in SUBCOMMANDS else None


def build_parser(command: str | None = None, *, every: bool = False) -> argparse.ArgumentParser:
    """The `hicache` parser: every subcommand listed, the flags of ``command`` (or of all, ``every``) added.

    Args:
        command: the subcommand whose flags module is imported and added.
        every: add every subcommand's flags (imports them all; for docs and tests).
    """
    parser = OneLineParser(prog="hicache", description="hierarchical KV cache tools")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, spec in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=spec.help, description=spec.description or spec.help,
                           allow_abbrev=spec.allow_abbrev)
        if every or name == command:
            load(spec.add_args)(p)
    return parser


BENCHES = ("load_batch", "dma_plan", "h2d", "allocator", "controller", "tree", "tree_instructions", "replay",
           "storage", "triton_grid", "vllm_multiturn", "host_dtype_accuracy", "host_dtype_replay", "gpu_quick",
           "before_after", "write_policy", "evict_latency", "state_interval", "ttft", "device_profile",
           "policy_memory")  # every runnable script of bench/ (a test keeps this list whole)
BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=BENCHES, help="which benchmark")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own flags")


def run_bench(args: argparse.Namespace, extra: Sequence[str] = ()) -> int:
    """Run ``bench/<name>.py`` as a script with the remaining arguments (flags after the name are its own)."""
    script = BENCH_DIR / f"{args.name}.py"
    if not script.exists():
        raise ValueError(f"bench: {script} not found; benchmarks ship with the source checkout")
    sys.argv = [str(script), *args.args, *extra]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # the scripts end with sys.exit(code) or sys.exit("message")
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (1: a failed check, 2: a bad flag or input, 130: Ctrl-C,
    143: SIGTERM)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = chosen_command(argv)
    parser = build_parser(command)
    try:
        args, extra = parser.parse_known_args(argv)
        spec = SUBCOMMANDS[args.command]
        if extra and not spec.passes_extra:  # point at the flags of the subcommand the user ran
            parser.exit(2, f"hicache {args.command}: error: unrecognized arguments: {' '.join(extra)} "
                           f"(see hicache {args.command} --help)\n")
    except SystemExit as exc:  # --help (0) or a usage error, already printed on one line (2)
        return int(exc.code or 0)
    from hicache.tmpdirs import Terminated, sigterm_unwinds  # after parsing: --help stays light
    try:
        run = load(spec.run)
        with sigterm_unwinds(like_ctrl_c=True):  # SIGTERM stops a subcommand as Ctrl-C does (serve-vllm: its own)
            return run(args, extra) if spec.passes_extra else run(args)
    except ValueError as exc:  # bad flags and refusals: one clear line, no traceback
        print(f"hicache {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
        if isinstance(exc, Terminated):
            print(f"hicache {args.command}: stopped by SIGTERM", file=sys.stderr)
            return exc.status
        print(f"hicache {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130

