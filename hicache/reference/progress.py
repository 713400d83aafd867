"""`RunProgress`: the progress line of a long ``hicache verify-model`` run, on stderr.

A run is long when its flags make it so (`work`: requests x tokens per request x layers,
against `LONG_RUN_WORK`, a few times the default run's), or when stderr is a terminal; a
short run in a log prints nothing. A long one prints, every `EVERY_S` seconds::

    hicache verify-model: 40/256 requests, 1 min 12 s, about 7 min 30 s left

The estimate assumes the remaining requests cost what the finished ones did on average
(later turns are longer, so it errs low; hence "about"). Imports no torch.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

from hicache.reference.options import VerifyOptions

EVERY_S = 10.0  # seconds between two progress lines
LONG_RUN_WORK = 150_000  # `work` above this shows progress (the default run: ~36,000, ~25 s on a 2-core VM)


def work(opts: VerifyOptions) -> int:
    """A run's size: requests x the longest request's tokens x layers."""
    from hicache.reference.workload import longest_request  # numpy: only when a run starts
    return opts.conversations * opts.turns * longest_request(opts.turns, opts.decode_tokens) * opts.layers


class RunProgress:
    """The callback `run_verify` calls after each request: ``progress(done, total)``.

    Args:
        opts: the run's options (how long it will be).
        stream: where the lines go (stderr).
    """

    def __init__(self, opts: VerifyOptions, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = work(opts) > LONG_RUN_WORK or self.stream.isatty()
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or done >= total:
            return
        now = time.monotonic()
        if now - self.last < EVERY_S:
            return
        self.last = now
        elapsed = now - self.start
        left = elapsed / done * (total - done)
        print(f"hicache verify-model: {done}/{total} requests, {duration(elapsed)}, about {duration(left)} left",
              file=self.stream, flush=True)


def duration(seconds: float) -> str:
    """``"42 s"``, ``"3 min 5 s"``, ``"2 h 10 min"``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
