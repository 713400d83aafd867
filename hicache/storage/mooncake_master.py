"""`MooncakeMaster`: start and stop a local ``mooncake_master`` (tests, benchmarks, one-box runs).

The master keeps the store's metadata; clients (every `MooncakeBackend` process)
contribute the memory. It binds 127.0.0.1 on free ports; clients reach each other with
Mooncake's ``P2PHANDSHAKE`` mode, so no separate metadata service runs.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout_s: float) -> bool:
    """Whether something accepts TCP connections on ``host:port`` within ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def master_binary() -> str:
    """Path of the ``mooncake_master`` executable shipped by the Mooncake wheel.

    Raises:
        FileNotFoundError: Mooncake is not installed (``scripts/setup.sh`` installs it).
    """
    try:
        import mooncake
        shipped = Path(mooncake.__file__).parent / "mooncake_master"
        if shipped.is_file():
            return str(shipped)
    except ImportError:
        pass
    found = shutil.which("mooncake_master")
    if found is None:
        raise FileNotFoundError("mooncake_master not found: install mooncake-transfer-engine-non-cuda "
                                "(CPU) or mooncake-transfer-engine (CUDA); scripts/setup.sh does")
    return found


class MooncakeMaster:
    """A ``mooncake_master`` child process on 127.0.0.1 (context manager).

    Args:
        port: RPC port; ``None`` picks a free one.
        extra_args: more ``--flag=value`` arguments for the master.
        log_dir: where ``mooncake_master.log`` goes (default: a temporary directory of
            its own, removed by `stop`).
    """

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = (),
                 log_dir: str | os.PathLike | None = None) -> None:
        if isinstance(extra_args, str):
            raise TypeError(f"extra_args: need a tuple of '--flag=value' strings, got the string {extra_args!r}")
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.extra_args = tuple(extra_args)
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="hicache-mooncake-"))
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        """``host:port`` for `MooncakeBackend` / ``--hicache-storage-master``."""
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / "mooncake_master.log"

    def start(self, timeout_s: float = 20.0) -> "MooncakeMaster":
        """Start the master and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not listen within ``timeout_s`` (the log tail says why).
        """
        args = [master_binary(), f"--rpc_port={self.port}", f"--rpc_address={self.host}",
                f"--metrics_port={free_port()}", f"--metrics_host={self.host}",
                "--enable_metric_reporting=false", *self.extra_args]
        self.log_dir.mkdir(parents=True, exist_ok=True)  # again after a `stop` removed its own
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if port_open(self.host, self.port, 0.2):
                return self
            time.sleep(0.05)
        self._end()
        tail = self.log_path.read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"mooncake_master did not start on {self.address}; log tail:\n{tail}")

    def kill(self) -> None:
        """SIGKILL the master (fault tests: the store vanishes mid-run)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Terminate the master (SIGTERM, then SIGKILL after 5 s) and remove its log
        directory if it made it; idempotent."""
        self._end()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def _end(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> "MooncakeMaster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
