"""A stand-in for vLLM's server process, run by `hicache serve-vllm --vllm-python` in tests.

Like vLLM 0.32 on CPU, it leaves files in its temporary folders, creates POSIX shared
memory (a ``psm_*`` segment and a ``sem.mp-*`` semaphore) that nothing unlinks when it is
killed (its resource tracker is told to forget them, as if SIGKILLed with the group),
writes ``READY`` (a JSON of what it made) once started, and on SIGINT or SIGTERM prints a
real line, then vLLM's shutdown noise (nanobind's leak report, the resource tracker's
warning) to stderr and exits 0 without cleaning up. ``make_stand_in`` writes the
executable that ``--vllm-python`` names.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

NOISE = (
    "nanobind: leaked 4 instances!\n"
    ' - leaked instance 0x7f8b9245cb88 of type "triton._C.libtriton.ir.attribute"\n'
    "nanobind: leaked 514 functions!\n"
    ' - leaked function "create_fcmpUGT"\n'
    " - ... skipped remainder\n"
    "nanobind: this is likely caused by a reference counting issue in the binding code.\n"
    "See https://nanobind.readthedocs.io/en/latest/refleaks.html"  # no newline, as nanobind
    "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: "
    "There appear to be 1 leaked semaphore objects to clean up at shutdown\n"
    "  warnings.warn('resource_tracker: There appear to be %d '\n"
)
REAL = "ERROR a real error line that must reach the user\n"


def make_stand_in(folder: Path) -> Path:
    """An executable ``python`` in ``folder`` that runs this module with this Python."""
    path = folder / "python"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {__file__} \"$@\"\n")
    path.chmod(0o755)
    return path


def _shared_memory() -> list[str]:
    import multiprocessing
    from multiprocessing import resource_tracker, shared_memory

    seg = shared_memory.SharedMemory(create=True, size=4096)
    seg.buf[:4] = b"kv!!"
    lock = multiprocessing.get_context("spawn").Lock()
    resource_tracker.unregister(seg._name, "shared_memory")  # as if the tracker were killed
    resource_tracker.unregister(lock._semlock.name, "semaphore")
    _keep.extend([seg, lock])
    return [seg._name.lstrip("/"), "sem." + lock._semlock.name.lstrip("/")]


_keep: list = []


def main() -> None:
    tmp = Path(os.environ["TMPDIR"])
    (tmp / "vllm_dist_0123").touch()
    (Path(os.environ["VLLM_RPC_BASE_PATH"]) / "0123-ipc-socket").touch()
    stopped: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: stopped.append(s))
    made = {"pid": os.getpid(), "tmp": str(tmp), "shm": _shared_memory()}
    ready = Path(os.environ["HICACHE_TEST_READY"])
    ready.with_suffix(".part").write_text(json.dumps(made))
    ready.with_suffix(".part").rename(ready)
    while not stopped:
        time.sleep(0.05)
    sys.stderr.write(REAL)
    sys.stderr.write(NOISE)
    sys.stderr.flush()
    os._exit(0)  # no clean-up: the shared memory stays, as after vLLM's shutdown


if __name__ == "__main__":
    main()
