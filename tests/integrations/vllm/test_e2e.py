"""End to end: SmolLM2-135M on vLLM (CPU), greedy, with and without hicache's host tier.

Two servers start once for the module, side by side, with a device cache forced small
(16 blocks of 128 tokens) so returning conversations' prefixes are evicted from it:

    control   vLLM + its offloading connector with no host tier (NullOffloadingSpec):
              evicted prefixes are recomputed
    hicache   ``hicache serve-vllm ... --enable-hierarchical-cache --hicache-ratio 4``
              (the real CLI): evicted prefixes come back from hicache's host pools

The same multi-turn workload must give identical token ids for every request, and the
hicache server must report host-tier loads. Why the control has a connector: see
hicache/integrations/vllm/null_spec.py (vLLM's numerics change with any connector;
plain vLLM is the benchmark's baseline, next to this control). Skipped, with the reason, when ``scripts/setup_vllm.sh`` could not
build the vLLM environment here.
"""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from hicache.integrations.vllm import env
from hicache.integrations.vllm.client import VllmServer, free_port
from hicache.integrations.vllm.config import null_kv_transfer_config
from hicache.integrations.vllm.workload import run_turns
from tests.set_up import needs

WHY_NOT = env.missing()
pytestmark = needs(WHY_NOT, "vLLM integration", "make test builds it")

CONVERSATIONS, TURNS, SENTENCES, MAX_TOKENS = 4, 3, 45, 12
VLLM_ARGS = ["--host", "127.0.0.1", "--enforce-eager", "--dtype", "bfloat16",
             "--max-model-len", "1536", "--num-gpu-blocks-override", "16",
             "--kv-cache-memory-bytes", str(128 << 20), "--disable-uvicorn-access-log"]


def control_server(log_dir) -> VllmServer:
    port = free_port()
    argv = [str(env.vllm_python()), "-m", env.API_SERVER, "--model", str(env.model_dir()),
            "--port", str(port), *VLLM_ARGS, "--kv-transfer-config", null_kv_transfer_config()]
    return VllmServer(argv, log_dir / "control.log", port)


def hicache_server(log_dir) -> VllmServer:
    port = free_port()
    argv = [sys.executable, "-m", "hicache.cli", "serve-vllm", str(env.model_dir()),
            "--port", str(port), *VLLM_ARGS, "--enable-hierarchical-cache", "--hicache-ratio", "4"]
    return VllmServer(argv, log_dir / "hicache.log", port)


def replay(server: VllmServer) -> list[tuple[int, ...]]:
    ids: list[tuple[int, ...]] = []

    def ask(conversation: int, turn: int, prompt: str) -> str:
        done = server.complete(str(env.model_dir()), prompt, MAX_TOKENS)
        ids.append(done.token_ids)
        return done.text

    run_turns(CONVERSATIONS, TURNS, SENTENCES, ask)
    return ids


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("vllm")
    servers = {"control": control_server(log_dir), "hicache": hicache_server(log_dir)}
    try:
        for s in servers.values():
            s.start()
        with ThreadPoolExecutor(2) as pool:  # engine start-up is mostly single-threaded
            list(pool.map(lambda s: s.wait_ready(600), servers.values()))
        out = {name: replay(s) for name, s in servers.items()}  # one at a time: 2 cores
        out["metrics"] = servers["hicache"].metrics()
        out["control_metrics"] = servers["control"].metrics()
        yield out
    finally:
        for s in servers.values():
            s.stop()


def test_greedy_token_ids_identical_with_and_without_hicache(runs):
    assert len(runs["hicache"]) == CONVERSATIONS * TURNS
    assert all(len(ids) == MAX_TOKENS for ids in runs["hicache"])
    for i, (a, b) in enumerate(zip(runs["control"], runs["hicache"])):
        assert a == b, f"request {i} (turn {i // CONVERSATIONS}, conversation {i % CONVERSATIONS})"


def test_prefixes_came_back_from_the_host_tier(runs):
    m = runs["metrics"]
    assert m["hicache:stored_blocks_total"] > 0
    assert m["hicache:loaded_blocks_total"] > 0 and m["hicache:hit_tokens_total"] > 0
    assert m["vllm:kv_offload_load_bytes_total"] > 0
    assert m["vllm:kv_offload_load_time_total"] > 0
    # the control recomputed what hicache loaded: its own prefix cache hit less
    hits = "vllm:prefix_cache_hits_total"
    assert runs["control_metrics"][hits] <= m[hits] + m["hicache:hit_tokens_total"]
