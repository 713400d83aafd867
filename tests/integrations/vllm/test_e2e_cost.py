"""End to end: the load policy ``cost`` in vLLM (SmolLM2-135M, CPU): a slow store is skipped.

Two ``hicache serve-vllm`` servers with ``--hicache-load-policy cost`` on the same small
device cache (returning conversations' prefixes are evicted to the host tier), each with
a device profile written here from the shipped ``h100``:

    slow-link   host -> device at 1 MB/s: loading a prefix never beats recomputing it, so
                every host hit is recomputed (``get_num_new_matched_tokens`` answers 0)
    slow-gpu    prefill at 0.1 TFLOPS: loading always pays, so hits are loaded

Greedy token ids must be identical, the slow-link server must store prefixes yet load none
(and count the hit tokens it recomputed), the slow-gpu one must load them. Skipped, with
the reason, when the vLLM environment could not be built (fails under ``CI``).
"""
from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from hicache.cost import load_profile, profile_dict
from hicache.integrations.vllm import env
from hicache.integrations.vllm.client import VllmServer, free_port
from tests.integrations.vllm.test_e2e import CONVERSATIONS, TURNS, VLLM_ARGS, replay
from tests.set_up import needs

pytestmark = needs(env.missing(), "vLLM integration", "make test builds it")


def profile_file(path, **changes) -> str:
    """The h100 profile with ``section=dict(field=value)`` changes, written to ``path``."""
    doc = profile_dict(load_profile("h100"))
    for section, fields in changes.items():
        doc[section] |= fields
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("vllm_cost")
    profiles = {"slow-link": profile_file(log_dir / "slow_link.json", h2d={"gbps": 0.001}),
                "slow-gpu": profile_file(log_dir / "slow_gpu.json", prefill={"bf16_tflops": 0.1, "fp8_tflops": 0.1,
                                                                             "attention_tflops": 0.1})}
    servers = {}
    for name, profile in profiles.items():
        port = free_port()
        argv = [sys.executable, "-m", "hicache.cli", "serve-vllm", str(env.model_dir()), "--port", str(port),
                *VLLM_ARGS, "--enable-hierarchical-cache", "--hicache-ratio", "4", "--hicache-load-policy", "cost",
                "--hicache-device-profile", profile]
        servers[name] = VllmServer(argv, log_dir / f"{name}.log", port)
    try:
        for s in servers.values():
            s.start()
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.wait_ready(600), servers.values()))
        out = {name: replay(s) for name, s in servers.items()}  # one at a time: 2 cores
        out["metrics"] = {name: s.metrics() for name, s in servers.items()}
        yield out
    finally:
        for s in servers.values():
            s.stop()


def test_a_slow_link_is_skipped_and_greedy_outputs_stay_identical(runs):
    assert len(runs["slow-link"]) == len(runs["slow-gpu"]) == CONVERSATIONS * TURNS
    for i, (a, b) in enumerate(zip(runs["slow-link"], runs["slow-gpu"])):
        assert a == b, f"request {i}"
    skip, load = runs["metrics"]["slow-link"], runs["metrics"]["slow-gpu"]
    assert skip["hicache:stored_blocks_total"] > 0  # the prefixes were on the host ...
    assert skip["hicache:recomputed_hit_tokens_total"] > 0  # ... found, and recomputed
    assert skip.get("hicache:loaded_blocks_total", 0) == 0 and skip.get("vllm:kv_offload_load_bytes_total", 0) == 0
    assert load["hicache:loaded_blocks_total"] > 0 and load["hicache:recomputed_hit_tokens_total"] == 0
