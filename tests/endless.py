"""Sources that never end, for the tests that a reader stops at its limit: an in-process
stream that counts what was read, and a FIFO fed by a thread that counts what it wrote."""
from __future__ import annotations

import io
import os
import threading
from pathlib import Path

GIVE_UP = 64 << 20  # an unbounded reader fails the test here instead of eating the machine's memory


class Endless(io.RawIOBase):
    """``pattern`` again and again; ``read_bytes`` counts what was taken."""

    def __init__(self, pattern: bytes) -> None:
        self.pattern, self.read_bytes = pattern, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.read_bytes > GIVE_UP:
            raise AssertionError(f"read {self.read_bytes:,} bytes of an endless source: no bound")
        n = len(buffer)
        start = self.read_bytes % len(self.pattern)
        data = (self.pattern * (n // len(self.pattern) + 2))[start:start + n]
        buffer[:n] = data
        self.read_bytes += n
        return n


class FifoFeeder:
    """A FIFO at ``path`` that a thread fills with ``pattern`` until the reader closes it
    (or `GIVE_UP` bytes: then it closes, so an unbounded reader ends too); ``written``."""

    def __init__(self, path: Path, pattern: bytes = b"\0") -> None:
        os.mkfifo(path)
        self.path, self.pattern, self.written = path, pattern, 0
        self.thread = threading.Thread(target=self._feed, daemon=True)
        self.thread.start()

    def _feed(self) -> None:
        chunk = self.pattern * (65536 // len(self.pattern) + 1)
        try:
            with open(self.path, "wb", buffering=0) as f:
                while self.written < GIVE_UP:
                    self.written += f.write(chunk)
        except BrokenPipeError:  # the reader stopped: what we want
            pass

    def join(self) -> int:
        """Bytes written once the feeder stopped."""
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the FIFO's reader neither stopped nor finished"
        return self.written
