"""Requests of `hicache replay`: Mooncake traces read with a bound, and their token ids.

A request is what a Mooncake trace line holds: ``hash_ids`` name 512-token blocks of the
prompt (equal ids = equal content, and in Mooncake an id also fixes everything before
it), ``input_length`` prompt tokens, ``output_length`` generated tokens.

    block h  -> 512 token ids, a fixed function of h (splitmix64 of h * 512 + i)
    prompt   =  concat(block(h) for h in hash_ids)[:input_length], then cut to whole pages

    tokens   |<------ block 7 ------>|<------ block 9 ------>|<-- block 4 ..-->|
             0                      512                     1024   input_length
    pages    |  p0  |  p1  |  p2  |  p3  |  p4  |  p5  |  p6  |  (drop the partial page)

A trace is read with a bound (`hicache.bounded`): a line over `MAX_LINE_BYTES`, or a file
passing `MAX_TRACE_BYTES` (decompressed), is refused naming the line and the limit, so
``--trace /dev/zero`` or a FIFO that never ends costs one line of memory, not the machine.
The built-in workloads live in `hicache.replay.builtin`.
"""
from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hicache.bounded import capped_lines

BLOCK_TOKENS = 512
VOCAB = 1 << 17
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MAX_LINE_BYTES = 1 << 20  # one request: ~100k hash_ids, a 50 M-token prompt (the shipped trace's longest: 2.7 KB)
MAX_TRACE_BYTES = 256 << 20  # a whole trace, decompressed: ~900k requests (the shipped one: 1.1 MB)


class Request(NamedTuple):
    """One prompt of the workload (a Mooncake trace line)."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


_OFFSETS = np.arange(BLOCK_TOKENS, dtype=np.uint64)


def request_tokens(req: Request, page_size: int) -> np.ndarray:
    """The prompt's token ids (int64), truncated to ``input_length`` then to whole pages."""
    ids = np.asarray(req.hash_ids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        tokens = _splitmix64(ids[:, None] * np.uint64(BLOCK_TOKENS) + _OFFSETS) % np.uint64(VOCAB)
    n = req.input_length - req.input_length % page_size
    return tokens.reshape(-1)[:n].astype(np.int64)


def _bad(lineno: int, path: str, msg: str) -> ValueError:
    return ValueError(f"--trace {path}: line {lineno}: {msg}")


def _int_field(rec: dict, name: str, lineno: int, path: str) -> int:
    value = rec[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(lineno, path, f"{name!r} must be an integer, got {value!r}")
    if value < 0:
        raise _bad(lineno, path, f"{name!r} must be >= 0, got {value}")
    return value


def parse_line(line: str, lineno: int, path: str = "<trace>") -> Request:
    """One trace line as a `Request`.

    Raises:
        ValueError: naming the line: not a JSON object, a missing field, a non-integer or
            negative length, bad ``hash_ids``, or blocks not covering ``input_length``.
    """
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _bad(lineno, path, f"not valid JSON ({exc.msg})") from None
    if not isinstance(rec, dict):
        raise _bad(lineno, path, "must be a JSON object")
    missing = [f for f in FIELDS if f not in rec]
    if missing:
        raise _bad(lineno, path, f"missing field(s) {missing}; need {list(FIELDS)}")
    ts, n_in, n_out = (_int_field(rec, f, lineno, path) for f in FIELDS[:3])
    ids = rec["hash_ids"]
    if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < 1 << 64
                                        for h in ids):
        raise _bad(lineno, path, "'hash_ids' must be a list of integers in [0, 2^64)")
    if len(ids) * BLOCK_TOKENS < n_in:
        raise _bad(lineno, path, f"{len(ids)} hash_ids cover {len(ids) * BLOCK_TOKENS} tokens, "
                                 f"fewer than input_length={n_in}")
    return Request(ts, n_in, n_out, tuple(ids))


def _decode(raw: bytes, lineno: int, path: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(lineno, path, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                                 "a trace is JSON lines") from None


def _open_trace(path: str):
    """A binary reader of the trace: ``.xz`` and ``.gz`` files are decompressed on the fly
    (the repository ships its trace as ``data/mooncake_synthetic_trace.jsonl.xz``)."""
    if path.endswith(".xz"):
        return lzma.open(path, "rb")
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def load_trace(path: str | Path, max_requests: int | None = None) -> list[Request]:
    """Parse a Mooncake JSONL trace (blank lines skipped); all lines checked before any replay.

    Args:
        path: a ``.jsonl`` file, or one compressed as ``.jsonl.xz`` / ``.jsonl.gz``.
        max_requests: stop after this many requests (None: all).
    Returns:
        The requests in file order.
    Raises:
        ValueError: a file that cannot be read or decompressed, a line that is not UTF-8 or
            is bad (its number in the message), a line over `MAX_LINE_BYTES` or a file over
            `MAX_TRACE_BYTES` (refused without reading further), or a file with no requests.
    """
    path = str(path)
    out: list[Request] = []
    try:
        with _open_trace(path) as f:
            for lineno, raw in capped_lines(f, f"--trace {path}", MAX_LINE_BYTES, MAX_TRACE_BYTES):
                if max_requests is not None and len(out) >= max_requests:
                    break
                line = _decode(raw, lineno, path)
                if line.strip():
                    out.append(parse_line(line, lineno, path))
    except OSError as exc:  # missing, a folder, no permission, not gzip data...
        raise ValueError(f"--trace {path}: cannot read it ({exc.strerror or exc})") from None
    except (lzma.LZMAError, EOFError) as exc:  # not xz data, or cut short
        raise ValueError(f"--trace {path}: cannot decompress it ({exc or 'truncated'})") from None
    if not out:
        raise ValueError(f"--trace {path}: no requests in the file")
    return out
