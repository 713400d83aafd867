"""End to end with a sliding-window model: a tiny random-weight Gemma-3 on vLLM (CPU).

The model (``hicache/integrations/vllm/tiny_swa.py``, made by ``scripts/setup_vllm.sh``)
has full-attention and 128-token sliding-window layers, so vLLM gives the plugin two KV
cache groups. Two servers, as in ``test_e2e.py``: the connector control (no host tier)
and ``hicache serve-vllm ... --hicache-ratio 4``, device cache forced small so returning
conversations' prefixes come back from the host. Greedy token ids must be identical,
and the sliding-window group must have stored only trailing windows: fewer chunks
than the full-attention group, with fewer host bytes per token. Skipped, with the reason,
when the set-up could not build the environment or the model (fails under ``CI``).
"""
from __future__ import annotations

import pytest

from hicache.integrations.vllm import env
from tests.integrations.vllm.leftovers import check_stopped_cleanly
from tests.integrations.vllm.pair import labelled, side_by_side
from tests.set_up import needs

MODEL = env.swa_model_dir()
WHY_NOT = env.missing() or (None if (MODEL / ".hicache-model").exists()
                            else f"no sliding-window model at {MODEL} (run scripts/setup_vllm.sh)")
pytestmark = needs(WHY_NOT, "vLLM integration", "make test builds it")

CONVERSATIONS, TURNS, SENTENCES, MAX_TOKENS = 3, 2, 40, 6
# 16 blocks of 128 tokens shared by both groups: one request needs its prefix's full
# blocks plus the window and a 256-token prefill chunk in the sliding group
VLLM_ARGS = ["--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "1024",
             "--max-num-batched-tokens", "256", "--num-gpu-blocks-override", "16",
             "--kv-cache-memory-bytes", str(64 << 20), "--disable-uvicorn-access-log"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with side_by_side(MODEL, VLLM_ARGS, tmp_path_factory.mktemp("vllm_swa"),
                      (CONVERSATIONS, TURNS, SENTENCES, MAX_TOKENS)) as out:
        yield out


def test_greedy_token_ids_identical_and_prefixes_came_back(runs):
    assert len(runs["hicache"]) == CONVERSATIONS * TURNS
    for i, (a, b) in enumerate(zip(runs["control"], runs["hicache"])):
        assert a == b, f"request {i}"
    m = runs["metrics"]
    assert m["hicache:loaded_blocks_total"] > 0 and m["vllm:kv_offload_load_bytes_total"] > 0


def test_the_sliding_window_group_keeps_only_trailing_windows(runs):
    used = labelled(runs["raw"], "hicache:group_chunks_used")
    total = labelled(runs["raw"], "hicache:group_chunks_total")
    per_token = labelled(runs["raw"], "hicache:host_bytes_per_token")
    assert len(total) == 2, total  # vLLM made two groups: full attention and sliding window
    full, swa = sorted(total, key=lambda g: -total[g])
    assert total[swa] < total[full] and per_token[swa] < per_token[full]
    assert 0 < used[swa] < used[full]
    assert used[swa] <= 2 * CONVERSATIONS * TURNS  # window 128 = 1 chunk (+1) per request


def test_stopped_servers_leave_nothing_in_dev_shm_and_stop_quietly(runs):
    # last in the module: it stops the servers (the fixture's stop is then a no-op)
    check_stopped_cleanly(runs["servers"], runs["held"])
