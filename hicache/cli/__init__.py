"""The `hicache` command line: the subcommand table and its runner, and the flag checks subcommands share.

`python -m hicache.cli` and the `hicache` script (`hicache.cli:main`) both run `main`.
Importing this package stays light (no torch): the command table loads a subcommand's
modules only when it is chosen; `checks` (which imports torch) only when a subcommand's
runner asks for it.
"""
from __future__ import annotations

from hicache.cli.command import SUBCOMMANDS, OneLineParser, Subcommand, build_parser, chosen_command, load, main

__all__ = ["SUBCOMMANDS", "OneLineParser", "Subcommand", "build_parser", "chosen_command", "load", "main"]
