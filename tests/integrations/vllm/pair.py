"""Two vLLM servers of one model side by side, for the end-to-end tests of hybrid models: the
connector control (no host tier) and ``hicache serve-vllm`` with the host tier; the same
multi-turn conversations on each, one server at a time (2 cores)."""
from __future__ import annotations

import contextlib
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Sequence

from hicache.integrations.vllm import env
from hicache.integrations.vllm.client import VllmServer, free_port
from hicache.integrations.vllm.config import null_kv_transfer_config
from hicache.integrations.vllm.workload import run_turns
from tests.integrations.vllm.leftovers import held_by_tree


@contextlib.contextmanager
def side_by_side(model: Path, vllm_args: Sequence[str], log_dir: Path, turns: tuple[int, int, int, int],
                 ready_s: float = 600) -> Iterator[dict]:
    """Serve ``turns`` = (conversations, turns, sentences, max tokens) on both servers.

    Yields ``{"control": ids, "hicache": ids, "metrics", "raw" (the /metrics text),
    "servers", "held" (their /dev/shm by inode)}``; stops both servers at the end.
    """
    conversations, n_turns, sentences, max_tokens = turns
    ports = free_port(), free_port()
    control = VllmServer([str(env.vllm_python()), "-m", env.API_SERVER, "--model", str(model),
                          "--host", "127.0.0.1", "--port", str(ports[0]), *vllm_args,
                          "--kv-transfer-config", null_kv_transfer_config()],
                         log_dir / "control.log", ports[0])
    hicache = VllmServer([sys.executable, "-m", "hicache.cli", "serve-vllm", str(model),
                          "--port", str(ports[1]), *vllm_args, "--enable-hierarchical-cache",
                          "--hicache-ratio", "4", "--hicache-prefix-tokens", "512",
                          "--hicache-load-policy", "always"],  # every hit loaded: the prefixes come back
                         log_dir / "hicache.log", ports[1])
    servers = {"control": control, "hicache": hicache}
    try:
        for s in servers.values():
            s.start()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.wait_ready(ready_s), servers.values()))
        held = {name: held_by_tree(s) for name, s in servers.items()}  # /dev/shm, by inode
        out: dict = {}
        for name, server in servers.items():
            ids: list[tuple[int, ...]] = []

            def ask(conversation: int, turn: int, prompt: str, server=server, ids=ids) -> str:
                done = server.complete(str(model), prompt, max_tokens)
                ids.append(done.token_ids)
                return done.text

            run_turns(conversations, n_turns, sentences, ask)
            out[name] = ids
        out["metrics"] = hicache.metrics()
        out["raw"] = urllib.request.urlopen(f"{hicache.url}/metrics", timeout=10).read().decode()
        out["servers"], out["held"] = servers, held
        yield out
    finally:
        for s in servers.values():
            s.stop()


def labelled(raw: str, name: str) -> dict[str, float]:
    """``{group: value}`` of a gauge labelled ``group`` in Prometheus text."""
    out = {}
    for line in raw.splitlines():
        if line.startswith(name + "{") and 'group="' in line:
            group = line.split('group="', 1)[1].split('"', 1)[0]
            out[group] = float(line.rsplit(" ", 1)[1])
    return out
