"""Opening a file a user named without ever blocking on it.

``open(path)`` of a FIFO blocks until a writer comes, and a read of a pipe until its
writer writes: a FIFO with no writer, or a writer gone quiet, would hold a command forever.
`open_source` opens every file non-blocking; a regular file (or a directory, refused by
its first read) is then read as usual, anything else (a FIFO, a pipe, a terminal, a
device) through ``poll(2)`` against a `Deadline`: when the deadline passes with nothing
to read, the read raises `Stalled`. The reader restarts the deadline whenever the source
made progress it cares about (`bounded_input.reads.capped_lines`: a line with content).

    open(2) O_NONBLOCK -+- regular file / directory --> plain buffered reads
                        +- FIFO, pipe, tty, device ---> poll(deadline) -> read; nothing by
                                                        the deadline: Stalled
"""
from __future__ import annotations

import io
import math
import os
import select
import stat
import time
from typing import BinaryIO

__all__ = ["STALL_S", "Deadline", "Stalled", "open_source"]

STALL_S = 10.0  # a source that gives nothing for this long is refused (no producer pauses this long in practice)
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO opens at once, with or without a writer


class Stalled(ValueError):
    """A source gave nothing before its deadline (the reader that knows the line re-words it)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"nothing to read for {seconds:g} s")
        self.seconds = seconds


class Deadline:
    """The time by which a source must have made progress (not thread-safe: one reader's).

    Args:
        seconds: how long a source may give nothing; > 0.

    Raises:
        ValueError: ``seconds`` is not a finite number > 0.
    """

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
            raise ValueError(f"seconds: must be a finite number > 0, got {seconds!r}")
        self.seconds = float(seconds)
        self.restart()

    def restart(self) -> None:
        """Progress was made: the source has ``seconds`` again from now (mutates)."""
        self._at = time.monotonic() + self.seconds

    def left_ms(self) -> int:
        """Milliseconds left (at least 1 while any is left).

        Raises:
            Stalled: the deadline has passed.
        """
        left = self._at - time.monotonic()
        if left <= 0:
            raise Stalled(self.seconds)
        return max(1, math.ceil(left * 1000))


class _Polled(io.RawIOBase):
    """A non-blocking descriptor read only once ``poll`` says it is readable, or refused
    (`Stalled`) when the deadline passes first. A FIFO no writer ever opened polls as not
    readable (Linux), so it is waited on until the deadline, not taken as empty at once."""

    def __init__(self, fd: int, deadline: Deadline) -> None:
        super().__init__()
        self._fd, self._deadline = fd, deadline
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer) -> int:
        while True:
            if self._poll.poll(self._deadline.left_ms()):
                try:
                    return os.readv(self._fd, [buffer])  # 0: the writer closed (end of file)
                except BlockingIOError:
                    continue  # another reader took the bytes: wait again
            # nothing within the time left: the next left_ms() raises Stalled

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def open_source(path: str | os.PathLike, deadline: Deadline) -> BinaryIO:
    """A buffered binary reader of ``path`` that never blocks past ``deadline`` (module docstring).

    Args:
        path: the file as the user named it.
        deadline: how long a non-regular source may give nothing (shared with the caller,
            which restarts it on progress).

    Returns:
        The reader (the caller closes it).

    Raises:
        OSError: the file cannot be opened (missing, no permission ...).
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            os.set_blocking(fd, True)
            return open(fd, "rb")  # a directory raises IsADirectoryError here
        return io.BufferedReader(_Polled(fd, deadline))
    except BaseException:
        os.close(fd)
        raise
