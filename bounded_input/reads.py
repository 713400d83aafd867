"""Reading a user's file with bounds: never more bytes than a stated limit, never waiting
on a source that stalls, whatever the source.

A trace named ``/dev/zero``, a FIFO that never closes, or a 40 GB file where a few KB
were meant must be refused, not read into memory until the machine runs out; a FIFO with
no writer, or a decompression bomb of blank lines, must be refused in seconds, not after
minutes or never. Every file the project reads from a user or a disk (the replay's trace,
the file store's markers, the ``"auto"`` table, records) goes through one of these: at
most ``limit + 1`` bytes are read, and a source over the limit, or one that stalls, is
refused in one line naming the file, the line and the limit.

    bound                     refused with                                    by
    bytes of a whole file     "line N: more than L bytes, the limit of K"     read_capped, read_file
    bytes of one line         "line N: more than L bytes, the limit of one line"   capped_lines
    bytes of a run of blanks  "line N: more than L bytes of blank lines in a row"  capped_lines
    bytes in all              "line N: the file passes L bytes, ..."          capped_lines
    time without progress     "line N: nothing to read for S s, ..."          capped_lines, read_file
                              "line N: only blank lines for S s, ..."         capped_lines
"""
from __future__ import annotations

import os
from typing import BinaryIO, Iterator

from bounded_input.sources import STALL_S, Deadline, Stalled, open_source

__all__ = ["over_limit", "read_capped", "read_file", "capped_lines"]


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
        ValueError: ``f`` holds more than ``limit`` bytes (`over_limit`), or its reads
            stalled (`Stalled`, re-worded with the line it stopped in).
    """
    parts: list[bytes] = []
    size = 0
    try:
        while size <= limit:
            chunk = f.read1(limit + 1 - size)  # one read at a time: what came before a stall is kept
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
    except Stalled as e:
        raise _stalled(what, b"".join(parts).count(b"\n") + 1, e, "") from None
    data = b"".join(parts)
    if len(data) > limit:
        raise over_limit(what, data, limit, kind)
    return data


def read_file(path: str | os.PathLike, limit: int, kind: str, stall_s: float = STALL_S) -> bytes:
    """The whole file at ``path``, at most ``limit`` bytes, opened and read without blocking
    past ``stall_s`` seconds of silence (`open_source`: a FIFO with no writer is refused).

    Raises:
        OSError: it cannot be opened or read.
        ValueError: more than ``limit`` bytes, or nothing came for ``stall_s`` seconds
            (the message starts with the path and names the line).
    """
    with open_source(path, Deadline(stall_s)) as f:
        return read_capped(f, limit, str(path), kind)


def capped_lines(f: BinaryIO, what: str, line_limit: int, total_limit: int, deadline: Deadline | None = None,
                 stall_flag: str = "") -> Iterator[tuple[int, bytes]]:
    """The lines of ``f`` with content as (number from 1, bytes with their newline), each read
    with a bound; blank lines (ASCII whitespace only) are skipped, but counted.

    Never holds more than one line of ``line_limit + 1`` bytes; a run of blank lines is held
    to the same limit (a decompression bomb of newlines is refused after ``line_limit``
    bytes, not at ``total_limit``); stops a source that passes ``total_limit`` bytes in all;
    with ``deadline`` (restarted after each line handed out: the caller's time is not
    counted), stops a source that gives no line with content before it passes.

    Args:
        f: the source (`open_source` makes one whose reads honour ``deadline``).
        what: the source as the user named it (``"--trace t.jsonl"``).
        line_limit: bytes of one line, and of one run of blank lines.
        total_limit: bytes of the whole source.
        deadline: how long the source may give no line with content; None: no bound.
        stall_flag: the flag that sets the deadline, named in its refusal.

    Raises:
        ValueError: a line or a run of blank lines longer than ``line_limit`` bytes, more
            than ``total_limit`` bytes in all, or the deadline passed (the line and the
            limit named; nothing past it read).
    """
    total = lineno = blank = 0
    while True:
        try:
            raw = f.readline(line_limit + 1)
        except Stalled as e:
            raise _stalled(what, lineno + 1, e, stall_flag) from None
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
        if raw.isspace():
            blank += len(raw)
            if blank > line_limit:
                raise ValueError(f"{what}: line {lineno:,}: more than {line_limit:,} bytes of blank lines in a row, "
                                 "the limit of one line; refused without reading further")
            if deadline is not None and lineno % 1024 == 0:  # a regular file's reads never wait: look now and then
                _check(deadline, what, lineno, stall_flag)
            continue
        blank = 0
        yield lineno, raw
        if deadline is not None:
            deadline.restart()


def _check(deadline: Deadline, what: str, lineno: int, stall_flag: str) -> None:
    try:
        deadline.left_ms()
    except Stalled as e:
        raise _stalled(what, lineno, e, stall_flag, "only blank lines") from None


def _stalled(what: str, lineno: int, e: Stalled, stall_flag: str, why: str = "") -> ValueError:
    """The refusal of a source that made no progress for ``e.seconds`` (its line named)."""
    flag = f" ({stall_flag})" if stall_flag else ""
    why = why or "nothing to read (a FIFO or pipe with no writer, or a writer gone quiet)"
    return ValueError(f"{what}: line {lineno:,}: {why} for {e.seconds:g} s, the limit of a stall{flag}; "
                      "refused without waiting further")
