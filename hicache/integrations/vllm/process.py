"""`ServerGroup`: vLLM's server as a child process group that leaves nothing behind.

Started in its own session (so a signal to the group reaches vLLM's engine and workers and
nothing else) with a private temporary folder (`hicache.tmpdirs.OwnedDir`, the group
recorded in it: a folder whose launcher was SIGKILLed is swept by a later start once the
group has ended). While it runs, the shared memory its processes hold is noted
(`shm.ShmTracker`). `end` SIGKILLs what is left of the group, waits until no process of it
runs, then removes the shared memory no live process holds and the folder. `serve.py`
(`hicache serve-vllm`) and `client.py` (tests, benchmarks) both run vLLM through it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any, Sequence

from hicache.integrations.vllm import env
from hicache.integrations.vllm.shm import ShmTracker, group_pids
from hicache.tmpdirs import PENDING, OwnedDir

POLL_S = 1.0  # how often a waiting launcher notes the group's shared memory
GONE_S = 10.0  # bound on the wait for SIGKILLed processes to go (never reached in practice)


class ServerGroup:
    """One vLLM server process group (``start`` ... ``end``).

    Args:
        argv: the command (``serve.serve_command``).
    """

    PREFIX = "hicache-vllm-"

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self.proc: subprocess.Popen | None = None
        self.folder: OwnedDir | None = None
        self.shm: ShmTracker | None = None
        self._pending: list[int] = []  # signals sent before the group existed

    def start(self, **popen: Any) -> "ServerGroup":
        """Make the folder and start ``argv`` in a new session (``popen``: ``stdout``,
        ``stderr``, ``stdin`` for ``subprocess.Popen``); a signal sent before is passed on now."""
        self.folder = OwnedDir(self.PREFIX)
        self.folder.set_group(PENDING)  # a launcher killed from here on may leave vLLM running
        try:
            self.proc = subprocess.Popen(self.argv, start_new_session=True,
                                         env=env.process_env(self.folder.path), **popen)
        except BaseException:
            self.folder.remove()
            raise
        self.folder.set_group(self.proc.pid)  # start_new_session: the group id is the child's pid
        self.shm = ShmTracker(self.proc.pid)
        for sig in self._pending:
            self.signal(sig)
        return self

    @property
    def tmp_dir(self):
        """vLLM's temporary folder (``None`` before ``start``)."""
        return None if self.folder is None else self.folder.path

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole group (held until ``start`` when it has not started)."""
        if self.proc is None:
            self._pending.append(sig)
            return
        self.shm.observe()  # what it holds before it starts letting go
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass  # the group has ended

    def wait(self, timeout_s: float | None = None) -> int | None:
        """The server's exit status once it has exited (negative: killed by that signal),
        or ``None`` after ``timeout_s``; notes the group's shared memory meanwhile."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self.shm.observe()
            step = POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
            try:
                return self.proc.wait(step)
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    return None

    def end(self) -> list[str]:
        """SIGKILL what is left of the group, wait until it is gone, then remove the shared
        memory it held that no live process holds and the folder (idempotent). Returns the
        shared memory names removed."""
        removed: list[str] = []
        if self.proc is not None:
            self.shm.observe()
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            deadline = time.monotonic() + GONE_S
            while group_pids(self.proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            removed = self.shm.release()
        if self.folder is not None:
            self.folder.remove()
        return removed
