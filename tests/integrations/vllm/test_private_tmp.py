"""vLLM's temporary files stay in a folder of ours, removed when the server stops (issue 23,
item 16): vLLM puts its ZMQ ``ipc://`` sockets under ``VLLM_RPC_BASE_PATH`` and torch's
``file://.../vllm_dist_*`` init files under the temporary folder, and leaves them behind.
A stand-in for vLLM's Python (a shell script) leaves such files where vLLM would, says
where, and waits to be stopped; no vLLM is needed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hicache.integrations.vllm import env
from hicache.integrations.vllm.client import VllmServer

FAKE_VLLM = """#!/bin/sh
touch "$TMPDIR/vllm_dist_0123" "$VLLM_RPC_BASE_PATH/0123-ipc-socket"
echo "$TMPDIR $VLLM_RPC_BASE_PATH" > "$HICACHE_TEST_READY.part" && mv "$HICACHE_TEST_READY.part" "$HICACHE_TEST_READY"
exec sleep 600
"""
WAIT_S = 120  # a bound on the stand-in's start (never reached); not a timing assumption


def _fake(tmp_path: Path) -> Path:
    path = tmp_path / "python"
    path.write_text(FAKE_VLLM)
    path.chmod(0o755)
    return path


def _started(ready: Path, proc: subprocess.Popen) -> list[Path]:
    """The folders the stand-in was given, once it says so."""
    deadline = time.monotonic() + WAIT_S
    while not ready.exists():
        assert proc.poll() is None, f"exited with {proc.returncode}"
        assert time.monotonic() < deadline, "the stand-in did not start"
        time.sleep(0.05)
    return [Path(p) for p in ready.read_text().split()]


def test_serve_vllm_gives_vllm_a_private_temporary_folder_removed_on_sigterm(tmp_path):
    system_tmp, ready = tmp_path / "tmp", tmp_path / "ready"
    system_tmp.mkdir()
    run_env = {**os.environ, "TMPDIR": str(system_tmp), "HICACHE_TEST_READY": str(ready)}
    proc = subprocess.Popen([sys.executable, "-m", "hicache.cli", "serve-vllm", str(tmp_path), "--vllm-python",
                             str(_fake(tmp_path))], env=run_env, cwd=env.REPO_ROOT)
    try:
        tmp, rpc = _started(ready, proc)
        assert tmp == rpc and tmp.parent == system_tmp
        assert sorted(os.listdir(tmp)) == [".hicache-owner", "0123-ipc-socket", "vllm_dist_0123"]
        proc.send_signal(signal.SIGTERM)  # e.g. `docker stop`: passed on to vLLM, then the folder goes
        assert proc.wait(WAIT_S) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert list(system_tmp.iterdir()) == []


def test_a_vllm_server_started_for_tests_leaves_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    system_tmp, ready = tmp_path / "tmp", tmp_path / "ready"
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    monkeypatch.setenv("HICACHE_TEST_READY", str(ready))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    server = VllmServer([str(_fake(tmp_path))], tmp_path / "log", 0).start()
    try:
        tmp, rpc = _started(ready, server.proc)
        assert tmp == rpc and tmp.parent == system_tmp
    finally:
        server.stop()
    assert list(system_tmp.iterdir()) == []
