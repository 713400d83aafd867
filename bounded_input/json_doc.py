"""`parse_json`: the one JSON parser for what a user or a disk hands the project.

``json.loads`` alone fails three ways no caller expects: a document nested some
thousand levels deep raises ``RecursionError`` (its C scanner recurses per level), an
integer of more than 4,300 digits a bare ``ValueError`` naming neither file nor line,
and a document of any size is parsed whole. Here the bounds are checked on the text
first, and every refusal, the parser's own included, is one ``ValueError``:

    "<what>: line N: nested deeper than 64 levels, the limit of a JSON document"
    "<what>: line N: a number of more than 64 digits, the limit of a JSON document"
    "<what>: line N: more than 1,048,576 bytes, the limit of a JSON document; ..."
    "<what>: line N: not UTF-8 text (byte 0x80 at column 85)"
    "<what>: line N: not valid JSON (Expecting value, column 12)"

Cost: two ``count`` passes and one regular-expression search over the text, all in C;
only a text with more opening brackets than the depth limit, or a run of digits longer
than the digit limit (in a string, possibly), is scanned token by token, and that scan
stops at the first excess.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

from bounded_input.reads import read_file
from bounded_input.sources import STALL_S
__all__ = ["MAX_DEPTH", "MAX_DIGITS", "MAX_JSON_BYTES", "parse_json", "read_json"]

MAX_DEPTH = 64  # every document the project reads is at most 4 deep (a vLLM stream chunk); far below recursion
MAX_DIGITS = 64  # a 64-bit hash id has 20 digits; Python's own int limit is 4,300
MAX_JSON_BYTES = 1 << 20  # the largest document read (a trace line, the auto table) is bounded to this already
_KIND = "a JSON document"
NL = "\n"
# a string (its closing quote optional: an unterminated one runs to the end, so the scan
# stays linear), a bracket, or a run of digits
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]|[0-9]+', re.DOTALL)
_LONG_DIGITS = re.compile(f"[0-9]{{{MAX_DIGITS + 1}}}")


def parse_json(data: bytes | str, what: str, line: int = 1, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value of ``data``, or one ``ValueError`` naming ``what`` and the line.

    Args:
        data: the document (bytes are decoded as UTF-8).
        what: the source as the user named it (``"--trace t.jsonl"``, a path).
        line: the line of ``what`` the document starts on (a trace line's number).
        max_bytes: the size limit (in characters for a ``str``).

    Returns:
        The parsed value (pure; thread-safe).

    Raises:
        ValueError: over ``max_bytes``, not UTF-8, nested deeper than `MAX_DEPTH`, a
            number of more than `MAX_DIGITS` digits, or not valid JSON (module docstring).
    """
    if len(data) > max_bytes:
        crossed = line + data[:max_bytes].count(NL.encode() if isinstance(data, bytes) else NL)
        raise ValueError(f"{what}: line {crossed:,}: more than {max_bytes:,} bytes, the limit of {_KIND}; "
                         "refused without parsing it")
    text = _decode(data, what, line) if isinstance(data, bytes) else data
    excess = _first_excess(text)
    if excess is not None:
        pos, why = excess
        raise ValueError(f"{what}: line {line + text.count(NL, 0, pos):,}: {why}, the limit of {_KIND}; "
                         "refused without parsing it")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: line {line + e.lineno - 1:,}: not valid JSON ({e.msg}, column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # none known past the checks above: still one line
        raise ValueError(f"{what}: line {line:,}: cannot be parsed ({type(e).__name__}: {e})") from None


def read_json(path: str | os.PathLike, kind: str, max_bytes: int = MAX_JSON_BYTES, stall_s: float = STALL_S) -> Any:
    """The JSON document in the file at ``path``: `read_file` (at most ``max_bytes``, never
    blocking past ``stall_s`` seconds of silence), then `parse_json`.

    Args:
        kind: what the file is, for a refusal over ``max_bytes`` (``"an auto table file"``).

    Raises:
        OSError: it cannot be opened or read.
        ValueError: over ``max_bytes``, stalled, or not JSON within the bounds (the path
            and the line named).
    """
    return parse_json(read_file(path, max_bytes, kind, stall_s), str(path), max_bytes=max_bytes)


def _decode(data: bytes, what: str, line: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        start = data.rfind(b"\n", 0, e.start) + 1
        lines = data.count(b"\n", 0, e.start)
        raise ValueError(f"{what}: line {line + lines:,}: not UTF-8 text (byte "
                         f"0x{data[e.start]:02x} at column {e.start - start + 1})") from None


def _first_excess(text: str) -> tuple[int, str] | None:
    """Where ``text`` first passes `MAX_DEPTH` or `MAX_DIGITS`, and which (``None``: it
    does not). Brackets and digits inside strings do not count."""
    deep = text.count("[") + text.count("{") > MAX_DEPTH
    if not deep and _LONG_DIGITS.search(text) is None:
        return None  # the common case: no token-by-token scan
    depth = 0
    for m in _TOKENS.finditer(text):
        c = text[m.start()]
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return m.start(), f"nested deeper than {MAX_DEPTH} levels"
        elif c in "]}":
            depth -= 1
        elif c != '"' and m.end() - m.start() > MAX_DIGITS:
            return m.start(), f"a number of more than {MAX_DIGITS} digits"
    return None
