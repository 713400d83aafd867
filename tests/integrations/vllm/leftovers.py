"""What a running vLLM server holds in /dev/shm, and what of it is left after it stopped
(issue 28, item 15: every server run left 2 ``psm_*`` and 1 ``sem.mp-*``). Read from
``/proc`` by inode for the server's process tree (its launcher and every descendant,
across process groups), independently of the tracker the servers stop with."""
from __future__ import annotations

import psutil

from hicache.integrations.vllm.shm import SHM_DIR, entries, held_by
from hicache.integrations.vllm.client import VllmServer


def held_by_tree(server: VllmServer) -> set[int]:
    """Inodes of /dev/shm the server's processes hold now."""
    dev = SHM_DIR.stat().st_dev
    root = psutil.Process(server.proc.pid)
    return {ino for p in [root, *root.children(recursive=True)] for ino in held_by(p.pid, dev)}


def left(inodes: set[int]) -> list[str]:
    """The /dev/shm entries (``psm_*``, ``sem.mp-*``) among ``inodes`` that still exist."""
    return sorted(name for ino, name in entries().items() if ino in inodes)


def check_stopped_cleanly(servers: dict[str, VllmServer], held: dict[str, set[int]]) -> None:
    """Stop every server; then none of what they held is left, each held some (its message
    queues and a semaphore), each `hicache serve-vllm` ended with 143 and one line and without
    shutdown noise, and no log has the old entrypoint's deprecation warning."""
    for server in servers.values():
        server.stop()
    assert all(held.values()), held
    assert left(set().union(*held.values())) == []
    for name, server in servers.items():
        log = server.log_path.read_text(errors="replace")
        assert "vllm.entrypoints.openai.api_server` is deprecated" not in log, name
        if "hicache.cli" in server.argv:  # `hicache serve-vllm`, stopped by SIGTERM
            assert "nanobind: leaked" not in log and "resource_tracker: There appear" not in log, name
            assert server.proc.returncode == 143, name
            assert log.rstrip().splitlines()[-1] == "hicache serve-vllm: stopped by SIGTERM, exit 143", name
