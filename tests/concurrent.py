"""Threads for the thread-safety tests: every worker started at once, all joined, the
first error raised after the join (never a timing assert)."""
from __future__ import annotations

import sys
import threading
from typing import Callable


def run_threads(threads: int, work: Callable[[int], None], switch_s: float | None = None) -> None:
    """Run ``work(t)`` for ``t`` in ``range(threads)``, all at once (a barrier), and join
    them; ``switch_s``: the interpreter's switch interval meanwhile (smaller: threads
    interleave more often, more chances for a race to show).

    Raises:
        AssertionError: a worker raised (the first errors listed).
    """
    start, errors = threading.Barrier(threads), []

    def run(t: int) -> None:
        try:
            start.wait()
            work(t)
        except BaseException as exc:  # reported after the join
            errors.append(exc)
    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    interval = sys.getswitchinterval()
    if switch_s is not None:
        sys.setswitchinterval(switch_s)
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
