"""Reading a user's file with a bound: never more bytes than a stated limit, whatever the source.

A trace named ``/dev/zero``, a FIFO that never closes, or a 40 GB file where a few KB
were meant must be refused, not read into memory until the machine runs out. Every file
the command-line tools read (the replay's trace; the file store's markers) goes through
one of these: at most ``limit + 1`` bytes are read from the source, and one over the
limit is refused in one line naming the file, the line where the limit was crossed and
the limit. (`transfer_kernels.auto_table`, which may not import ``hicache``, bounds its
table file the same way itself.)
"""
from __future__ import annotations

from typing import BinaryIO, Iterator

__all__ = ["over_limit", "read_capped", "capped_lines"]


def over_limit(what: str, head: bytes, limit: int, kind: str) -> ValueError:
    """The refusal of a source longer than ``limit`` bytes (``head``: its first bytes).

    Args:
        what: the file as the user named it (e.g. ``"--trace /dev/zero"``).
        head: the bytes read, at least up to the limit; the line counted is the one the
            limit falls in.
        limit: the limit in bytes.
        kind: what is limited (``"a trace line"``, ``"a trace file"``).
    """
    line = head[:limit].count(b"\n") + 1
    return ValueError(f"{what}: line {line:,}: more than {limit:,} bytes, the limit of {kind}; "
                      "refused without reading further")


def read_capped(f: BinaryIO, limit: int, what: str, kind: str) -> bytes:
    """All of ``f``, at most ``limit`` bytes; reads no more than ``limit + 1``.

    Raises:
        ValueError: ``f`` holds more than ``limit`` bytes (`over_limit`).
    """
    data = f.read(limit + 1)
    if len(data) > limit:
        raise over_limit(what, data, limit, kind)
    return data


def capped_lines(f: BinaryIO, what: str, line_limit: int, total_limit: int) -> Iterator[tuple[int, bytes]]:
    """The lines of ``f`` as (number from 1, bytes with their newline), each read with a bound.

    Never holds more than one line of ``line_limit + 1`` bytes, and stops a source that
    passes ``total_limit`` bytes in all.

    Raises:
        ValueError: a line longer than ``line_limit`` bytes, or more than ``total_limit``
            bytes in all (the line and the limit named; nothing past it read).
    """
    total = 0
    lineno = 0
    while True:
        raw = f.readline(line_limit + 1)
        if not raw:
            return
        lineno += 1
        if len(raw.rstrip(b"\r\n")) > line_limit:
            raise ValueError(f"{what}: line {lineno:,}: more than {line_limit:,} bytes, the limit of one line; "
                             "refused without reading further")
        total += len(raw)
        if total > total_limit:
            raise ValueError(f"{what}: line {lineno:,}: the file passes {total_limit:,} bytes, the limit of a "
                             "whole file; refused without reading further")
        yield lineno, raw
