"""The `hicache` command: `plan`, `replay`, `bench`, `serve-vllm` and `verify-model` subcommands."""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from typing import NoReturn

from hicache.integrations.vllm.serve import add_serve_args, run_serve
from hicache.plan import add_plan_args, run_plan
from hicache.replay.cli import add_replay_args, run_replay
from hicache.reference.cli import add_verify_args, run_verify_model  # imports torch only when run


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line naming the flag (exit status 2), no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="hicache", description="hierarchical KV cache tools")
    sub = parser.add_subparsers(dest="command", required=True)
    add_plan_args(sub.add_parser("plan", help="size device and host pools for a model"))
    add_replay_args(sub.add_parser("replay", help="replay a request trace through the cache, per host ratio"))
    bench = sub.add_parser("bench", help="run a benchmark of bench/ (source checkout)")
    bench.add_argument("name", choices=BENCHES, help="which benchmark")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own flags")
    add_serve_args(sub.add_parser(
        "serve-vllm", allow_abbrev=False,
        help="start vLLM's OpenAI server, with hicache as its host tier when enabled",
        description="Unknown flags are passed to vLLM; --enable-hierarchical-cache and the "
                    "--hicache-* flags become vLLM's --kv-transfer-config."))
    add_verify_args(sub.add_parser("verify-model", help="serve a tiny paged model through every tier and check "
                                   "its logits against an uninterrupted recompute"))
    return parser


BENCHES = ("h2d", "allocator", "controller", "tree", "replay")
BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def run_bench(args: argparse.Namespace) -> int:
    """Run ``bench/<name>.py`` as a script with the remaining arguments."""
    script = BENCH_DIR / f"{args.name}.py"
    if not script.exists():
        raise ValueError(f"bench: {script} not found; benchmarks ship with the source checkout")
    sys.argv = [str(script), *args.args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # the scripts end with sys.exit(code)
        return int(exc.code or 0)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (2: a bad flag or input, 130: Ctrl-C)."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and args.command not in ("serve-vllm", "bench"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help (0) or a usage error, already printed on one line (2)
        return int(exc.code or 0)
    try:
        if args.command == "serve-vllm":
            return run_serve(args, extra)
        if extra:  # bench: flags after the name belong to the benchmark
            args.args = [*args.args, *extra]
        return {"plan": run_plan, "replay": run_replay, "bench": run_bench,
                "verify-model": run_verify_model}[args.command](args)
    except ValueError as exc:  # bad flags and refusals: one clear line, no traceback
        print(f"hicache {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hicache {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
