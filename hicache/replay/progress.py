"""The replay's progress line on stderr, one per run."""
from __future__ import annotations

import sys

__all__ = ["Progress", "line_break"]


class Progress:
    """A one-line progress bar on stderr, redrawn about 50 times per run.

    On a terminal the line is redrawn in place; in a log (stderr not a TTY) only the
    finished line is written, so CI logs get one line per run instead of fifty. The
    finished line comes from `finish`, once the run's results are kept (so a Ctrl-C
    after it never loses that run).
    """

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.step = max(1, total // 50) if sys.stderr.isatty() else 0

    def __call__(self, done: int) -> None:
        if self.enabled and self.step and done % self.step == 0 and done < self.total:
            self._draw(done)

    def finish(self) -> None:
        if self.enabled:
            self._draw(self.total)
            print(file=sys.stderr, flush=True)

    def _draw(self, done: int) -> None:
        bar = "#" * (30 * done // max(self.total, 1))
        print(f"\r{self.label:<18} [{bar:<30}] {done}/{self.total}", end="", file=sys.stderr, flush=True)


def line_break() -> str:
    """A newline when a progress bar may have left the cursor mid-line on a terminal."""
    return "\n" if sys.stderr.isatty() else ""
