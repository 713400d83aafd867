"""Shutdown noise of vLLM's processes, taken out of `hicache serve-vllm`'s stderr.

Two reports reach the terminal whenever vLLM 0.32 stops, however cleanly, and say nothing
the user can act on:

    nanobind: leaked 514 functions!            triton's bindings at interpreter exit (each
     - leaked function "create_fcmpUGT"        vLLM process that imported triton), up to
     ...                                       ~40 lines, the last one without a newline
    See https://nanobind.readthedocs.io/en/latest/refleaks.html
    .../resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 2
        leaked shared_memory objects to clean up at shutdown     (and its source line)

The second is multiprocessing's resource tracker cleaning up after vLLM's engine, which
vLLM's shutdown SIGKILLs; what it misses `shm.py` removes. Exactly these lines are
dropped (matched whole, text glued to the last nanobind line is kept); every other line
passes unchanged, byte for byte.
"""
from __future__ import annotations

import re
import threading
from typing import BinaryIO

NANOBIND_START = "nanobind: leaked "
NANOBIND_ITEMS = (" - leaked ", " - ... skipped remainder")
NANOBIND_CAUSE = "nanobind: this is likely caused by a reference counting issue in the binding code."
NANOBIND_SEE = "See https://nanobind.readthedocs.io/en/latest/refleaks.html"
TRACKER = re.compile(r"resource_tracker\.py:\d+: UserWarning: resource_tracker: There appear to be \d+ "
                     r"leaked (shared_memory|semaphore) objects to clean up at shutdown$")
TRACKER_SOURCE = "  warnings.warn('resource_tracker: There appear to be %d '"


class NoiseFilter:
    """Line by line: what of each stderr line to keep (`keep`)."""

    def __init__(self) -> None:
        self._in_nanobind = False
        self._after_tracker = False

    def keep(self, line: bytes) -> bytes:
        """The part of ``line`` (with its newline) to write on: all of it, or nothing for noise."""
        text = line.decode("utf-8", errors="replace").rstrip("\r\n")
        after_tracker, self._after_tracker = self._after_tracker, False
        if after_tracker and text == TRACKER_SOURCE:
            return b""
        if text.startswith(NANOBIND_START) or text == NANOBIND_CAUSE:
            self._in_nanobind = True
            return b""
        if self._in_nanobind and text.startswith(NANOBIND_ITEMS):
            return b""
        if self._in_nanobind and text.startswith(NANOBIND_SEE):
            self._in_nanobind = False
            rest = line[len(NANOBIND_SEE.encode()):]
            return self.keep(rest) if rest.strip() else b""
        self._in_nanobind = False
        if TRACKER.search(text):
            self._after_tracker = True
            return b""
        return line


def relay(source: BinaryIO, sink: BinaryIO) -> threading.Thread:
    """Copy ``source`` to ``sink`` line by line, without the noise, in a daemon thread
    (started; it ends at ``source``'s end of file)."""
    def run() -> None:
        noise = NoiseFilter()
        with source:
            for line in iter(source.readline, b""):
                kept = noise.keep(line)
                if kept:
                    sink.write(kept)
                    sink.flush()

    thread = threading.Thread(target=run, name="vllm-stderr", daemon=True)
    thread.start()
    return thread
