"""The `hicache` command: `plan`, `replay` and `bench` subcommands."""
from __future__ import annotations

import argparse
import sys

from hicache.plan import add_plan_args, run_plan


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hicache", description="hierarchical KV cache tools")
    sub = parser.add_subparsers(dest="command", required=True)
    add_plan_args(sub.add_parser("plan", help="size device and host pools for a model"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"plan": run_plan}[args.command](args)
    except ValueError as exc:  # bad flags and refusals: one clear line, no traceback
        print(f"hicache {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
