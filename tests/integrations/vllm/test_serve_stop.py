"""How `hicache serve-vllm` stops (issue 28, items 11, 15, 16), with a stand-in for vLLM
(`fake_vllm.py`: no vLLM needed):

- Ctrl-C exits 130, SIGTERM 143, SIGHUP 129 (vLLM itself exits 0 after them), and the
  stop ends with one line of ours; vLLM's shutdown noise (nanobind's leak report, the
  resource tracker's warning) is dropped, a real error line is not;
- the shared memory vLLM's processes held (``psm_*``, ``sem.mp-*``) is gone after the stop,
  while an entry of another process, held or not, stays;
- a SIGKILLed launcher's temporary folder is swept by a later start once vLLM's group has
  ended, and not while it runs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import pytest

from hicache.integrations.vllm import env
from hicache.integrations.vllm.process import ServerGroup
from hicache.tmpdirs import sweep
from tests.integrations.vllm.fake_vllm import REAL, make_stand_in

SHM = Path("/dev/shm")
WAIT_S = 120  # a bound on the stand-in's start and stop (never reached); not a timing assumption
needs_shm = pytest.mark.skipif(not SHM.is_dir() or not Path("/proc/self/maps").exists(),
                               reason="needs Linux's /dev/shm and /proc")


class Launch:
    """``hicache serve-vllm <folder> --vllm-python <stand-in>`` with its own TMPDIR."""

    def __init__(self, tmp_path: Path) -> None:
        self.system_tmp, self.ready = tmp_path / "tmp", tmp_path / "ready.json"
        self.system_tmp.mkdir()
        run_env = {**os.environ, "TMPDIR": str(self.system_tmp), "HICACHE_TEST_READY": str(self.ready)}
        self.proc = subprocess.Popen([sys.executable, "-m", "hicache.cli", "serve-vllm", str(tmp_path),
                                      "--vllm-python", str(make_stand_in(tmp_path))],
                                     env=run_env, cwd=env.REPO_ROOT, stderr=subprocess.PIPE)

    def started(self) -> dict:
        deadline = time.monotonic() + WAIT_S
        while not self.ready.exists():
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.05)
        return json.loads(self.ready.read_text())

    def stop(self, sig: int) -> tuple[int, str]:
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=WAIT_S)
        return self.proc.returncode, err.decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()  # (vLLM's processes may still hold the pipe)


@needs_shm
@pytest.mark.parametrize("sig,status,said", [(signal.SIGINT, 130, "Ctrl-C (SIGINT)"),
                                             (signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP")])
def test_a_signal_stops_vllm_with_its_status_one_line_and_nothing_left(tmp_path, sig, status, said):
    launch = Launch(tmp_path)
    try:
        made = launch.started()
        assert all((SHM / name).exists() for name in made["shm"])  # a psm_ segment and a semaphore
        code, err = launch.stop(sig)
    finally:
        launch.kill()
    assert code == status
    assert err.splitlines()[-1] == f"hicache serve-vllm: stopped by {said}, exit {status}"
    if sig != signal.SIGHUP:  # vLLM (and the stand-in) handle SIGINT and SIGTERM, and die of SIGHUP
        assert REAL.strip() in err.splitlines()  # a real error line passes
    assert "nanobind" not in err and "resource_tracker" not in err, err
    assert not [n for n in made["shm"] if (SHM / n).exists()]
    assert list(launch.system_tmp.iterdir()) == []


@needs_shm
def test_shared_memory_of_other_processes_stays(tmp_path):
    # Made during the server's run by another process: one held (mapped) here, one held by
    # nobody; neither was the server group's, so neither is removed.
    launch = Launch(tmp_path)
    held = loose = None
    try:
        launch.started()
        held = shared_memory.SharedMemory(create=True, size=4096)
        loose = shared_memory.SharedMemory(create=True, size=4096)
        resource_tracker.unregister(loose._name, "shared_memory")
        loose.close()
        code, _ = launch.stop(signal.SIGTERM)
        assert code == 143
        assert (SHM / held._name.lstrip("/")).exists() and (SHM / loose._name.lstrip("/")).exists()
    finally:
        launch.kill()
        if held is not None:
            held.close()
            held.unlink()
        if loose is not None:
            (SHM / loose._name.lstrip("/")).unlink(missing_ok=True)


def test_a_killed_launchers_folder_is_swept_once_vllm_has_ended(tmp_path):
    launch = Launch(tmp_path)
    try:
        made = launch.started()
        launch.kill()  # SIGKILL: no clean-up; the stand-in (its own group) runs on
        folder = Path(made["tmp"])
        assert folder.exists() and folder.parent == launch.system_tmp
        assert sweep(ServerGroup.PREFIX, launch.system_tmp) == [] and folder.exists()  # vLLM still runs
        os.killpg(made["pid"], signal.SIGKILL)
        deadline = time.monotonic() + WAIT_S
        while sweep(ServerGroup.PREFIX, launch.system_tmp) != [folder]:  # the group's end is asynchronous
            assert time.monotonic() < deadline, "the folder was never swept"
            time.sleep(0.05)
        assert not folder.exists()
    finally:
        launch.kill()
        for name in json.loads(launch.ready.read_text())["shm"] if launch.ready.exists() else []:
            (SHM / name).unlink(missing_ok=True)  # a SIGKILLed launcher cannot release them
