"""Requests of `hicache replay`: Mooncake traces read with a bound, and their token ids.

A request is what a Mooncake trace line holds: ``hash_ids`` name 512-token blocks of the
prompt (equal ids = equal content, and in Mooncake an id also fixes everything before
it), ``input_length`` prompt tokens, ``output_length`` generated tokens.

    block h  -> 512 token ids, a fixed function of h (splitmix64 of h * 512 + i)
    prompt   =  concat(block(h) for h in hash_ids)[:input_length], then cut to whole pages

    tokens   |<------ block 7 ------>|<------ block 9 ------>|<-- block 4 ..-->|
             0                      512                     1024   input_length
    pages    |  p0  |  p1  |  p2  |  p3  |  p4  |  p5  |  p6  |  (drop the partial page)

A trace is read with bounds (`bounded_input`), each refusal one line naming the line and
the limit, before anything is allocated for it:

    bytes    a line over `MAX_LINE_BYTES`, a run of blank lines over the same, or a file
             passing `MAX_TRACE_BYTES` (decompressed): ``--trace /dev/zero`` or a FIFO
             that never ends costs one line of memory, not the machine
    time     no request for `TraceLimits.stall_s` seconds (``--trace-stall-timeout``): a
             FIFO with no writer, a pipe gone quiet or a bomb of blank lines ends in seconds
    JSON     deeper than 64 levels, a number of more than 64 digits (`bounded_input.parse_json`)
    prompt   ``input_length`` over `TraceLimits.prompt_tokens` (``--max-prompt-tokens``, or
             what the largest cache of the sweep holds): a 1 MiB line of ``hash_ids``
             describes a 268 M-token prompt, which would take gigabytes of token ids

``hash_ids`` past the prompt (past ``input_length``) are checked and dropped: no request
holds more ids than its prompt has blocks. The built-in workloads live in
`hicache.replay.builtin`.

A line may carry client hints on its prompt (optional field ``hints``): one envelope
(`hicache.radix.hints.envelope`) or a list of at most `MAX_LINE_HINTS`, each with an
optional ``"when"``: ``"after"`` (default: sent once the request is served, as an agent
does when its tool call starts) or ``"before"`` (sent just before it, as a prefetch is):

    {"timestamp": 61250, "input_length": 9000, "output_length": 120, "hash_ids": [...],
     "hints": [{"when": "before", "prefetch": "device"}, {"retain_s": 45, "priority": 60}]}

``timestamp`` is in milliseconds (Mooncake's unit): the hints' clock (retain deadlines)
reads it.
"""
from __future__ import annotations

import gzip
import lzma
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from bounded_input import STALL_S, Deadline, capped_lines, open_source, parse_json

from hicache.config import MAX_HINT_TTL_CEILING_S
from hicache.radix.hints.envelope import HintError, parse_envelope

BLOCK_TOKENS = 512
VOCAB = 1 << 17
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MAX_LINE_BYTES = 1 << 20  # one request: ~100k hash_ids, a 50 M-token prompt (the shipped trace's longest: 2.7 KB)
MAX_TRACE_BYTES = 256 << 20  # a whole trace, decompressed: ~900k requests (the shipped one: 1.1 MB)
MAX_PROMPT_TOKENS = 1 << 20  # --max-prompt-tokens: the longest context of the presets (DeepSeek-V4: 1M tokens)


MAX_LINE_HINTS = 8  # envelopes on one trace line
HINT_TIMES = ("after", "before")


class TraceHint(NamedTuple):
    """An envelope a trace line carries on its prompt, and when it is sent (``after`` or ``before``)."""

    when: str
    envelope: dict


class Request(NamedTuple):
    """One prompt of the workload (a Mooncake trace line; ``hints``: its client hints)."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    hints: tuple[TraceHint, ...] = ()


class TraceLimits(NamedTuple):
    """What a trace may ask for (module docstring)."""

    prompt_tokens: int = MAX_PROMPT_TOKENS  # a longer input_length is refused
    prompt_why: str = "the limit of --max-prompt-tokens"  # what sets prompt_tokens, named in the refusal
    stall_s: float = STALL_S  # seconds the trace may give no request (--trace-stall-timeout)


class FreshIds:
    """Fresh block ids, counted up from a start (ids below it belong to shared prefixes): the
    built-in workloads' generator of blocks no other request shares (not thread-safe)."""

    def __init__(self, start: int) -> None:
        self.next = start

    def extend(self, ids: list[int], length: int) -> None:
        """Append fresh ids until ``ids`` cover ``length`` tokens."""
        while len(ids) * BLOCK_TOKENS < length:
            ids.append(self.next)
            self.next += 1


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


def parse_line(line: str | bytes, lineno: int, path: str = "<trace>", limits: TraceLimits = TraceLimits()) -> Request:
    """One trace line as a `Request`.

    Raises:
        ValueError: naming the line: not JSON within `bounded_input.parse_json`'s bounds, not
            an object, a missing field, a non-integer or negative length, bad ``hash_ids``,
            blocks not covering ``input_length``, or a prompt over ``limits.prompt_tokens``.
    """
    rec = parse_json(line, f"--trace {path}", lineno)
    if not isinstance(rec, dict):
        raise _bad(lineno, path, "must be a JSON object")
    missing = [f for f in FIELDS if f not in rec]
    if missing:
        raise _bad(lineno, path, f"missing field(s) {missing}; need {list(FIELDS)}")
    ts, n_in, n_out = (_int_field(rec, f, lineno, path) for f in FIELDS[:3])
    if n_in > limits.prompt_tokens:
        raise _bad(lineno, path, f"input_length {n_in:,} is over {limits.prompt_tokens:,} tokens, "
                                 f"{limits.prompt_why}; refused before anything is allocated for it")
    ids = rec["hash_ids"]
    if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < 1 << 64
                                        for h in ids):
        raise _bad(lineno, path, "'hash_ids' must be a list of integers in [0, 2^64)")
    if len(ids) * BLOCK_TOKENS < n_in:
        raise _bad(lineno, path, f"{len(ids)} hash_ids cover {len(ids) * BLOCK_TOKENS} tokens, "
                                 f"fewer than input_length={n_in}")
    try:
        hints = trace_hints(rec.get("hints"))
    except HintError as exc:
        raise _bad(lineno, path, str(exc)) from None
    return Request(ts, n_in, n_out, tuple(ids[:-(-n_in // BLOCK_TOKENS)]), hints)  # the prompt's blocks, no more


def trace_hints(value: Any) -> tuple[TraceHint, ...]:
    """A trace line's ``hints`` field (module docstring), each envelope checked.

    Raises:
        HintError: not an object or a list of at most `MAX_LINE_HINTS` objects, a bad
            ``when`` or a malformed envelope.
    """
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not 1 <= len(items) <= MAX_LINE_HINTS:
        raise HintError(f"hints: give one envelope or a list of 1 to {MAX_LINE_HINTS}, got {len(items)}")
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise HintError(f"hints: each must be a JSON object, got {type(item).__name__}")
        when = item.get("when", "after")
        if when not in HINT_TIMES:
            raise HintError(f"hints.when: must be one of {', '.join(HINT_TIMES)}, got {str(when)[:40]!r}")
        envelope = {k: v for k, v in item.items() if k != "when"}
        parse_envelope(envelope, max_ttl_s=MAX_HINT_TTL_CEILING_S)  # the run's own limit refuses past it
        out.append(TraceHint(when, envelope))
    return tuple(out)


def _open_trace(path: str, deadline: Deadline, files: ExitStack) -> BinaryIO:
    """A binary reader of the trace, closed with ``files``: ``.xz`` and ``.gz`` files are
    decompressed on the fly (the repository ships its trace as
    ``data/mooncake_synthetic_trace.jsonl.xz``); a FIFO or pipe is read against ``deadline``."""
    raw = files.enter_context(open_source(path, deadline))
    if path.endswith(".xz"):
        return files.enter_context(lzma.open(raw, "rb"))
    if path.endswith(".gz"):
        return files.enter_context(gzip.open(raw, "rb"))
    return raw


def load_trace(path: str | Path, max_requests: int | None = None, limits: TraceLimits = TraceLimits()) -> list[Request]:
    """Parse a Mooncake JSONL trace (blank lines skipped); all lines checked before any replay.

    Args:
        path: a ``.jsonl`` file, or one compressed as ``.jsonl.xz`` / ``.jsonl.gz``.
        max_requests: stop after this many requests (None: all).
        limits: the longest prompt and the longest stall accepted (`TraceLimits`).
    Returns:
        The requests in file order.
    Raises:
        ValueError: a file that cannot be read or decompressed, a line that is not UTF-8 or
            is bad (its number in the message), a line or a run of blank lines over
            `MAX_LINE_BYTES`, a file over `MAX_TRACE_BYTES` (refused without reading
            further), no request for ``limits.stall_s`` seconds, or a file with no requests.
    """
    path = str(path)
    out: list[Request] = []
    try:
        with ExitStack() as files:
            deadline = Deadline(limits.stall_s)
            f = _open_trace(path, deadline, files)
            for lineno, raw in capped_lines(f, f"--trace {path}", MAX_LINE_BYTES, MAX_TRACE_BYTES, deadline,
                                            "--trace-stall-timeout"):
                if max_requests is not None and len(out) >= max_requests:
                    break
                out.append(parse_line(raw, lineno, path, limits))
    except OSError as exc:  # missing, a folder, no permission, not gzip data...
        raise ValueError(f"--trace {path}: cannot read it ({exc.strerror or exc})") from None
    except (lzma.LZMAError, EOFError) as exc:  # not xz data, or cut short
        raise ValueError(f"--trace {path}: cannot decompress it ({exc or 'truncated'})") from None
    if not out:
        raise ValueError(f"--trace {path}: no requests in the file")
    return out
