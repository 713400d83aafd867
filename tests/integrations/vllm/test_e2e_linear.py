"""End to end with a linear-attention hybrid: a tiny random-weight Qwen3-Next on vLLM (CPU).

The model (``hicache/integrations/vllm/tiny_linear.py``, made by ``scripts/setup_vllm.sh``)
has three Gated DeltaNet layers and a full-attention layer; with prefix caching vLLM keeps
their state in "align" mode (a state per 640-token block) and gives the plugin four KV cache
groups: one full-attention group and a state group per DeltaNet layer. Two servers, as in
``test_e2e_swa.py``: the connector control (no host tier) and ``hicache serve-vllm ...
--hicache-ratio 4``, the device cache forced small so returning conversations' prefixes,
their DeltaNet states included, come back from the host. Greedy token ids must be
identical, and every group must have loaded chunks. Skipped, with the reason, when the
set-up could not build the environment or the model (fails under ``CI``).
"""
from __future__ import annotations

import pytest

from hicache.integrations.vllm import env
from tests.integrations.vllm.leftovers import check_stopped_cleanly
from tests.integrations.vllm.pair import labelled, side_by_side
from tests.set_up import needs

MODEL = env.linear_model_dir()
WHY_NOT = env.missing() or (None if (MODEL / ".hicache-model").exists()
                            else f"no linear-attention model at {MODEL} (run scripts/setup_vllm.sh)")
pytestmark = needs(WHY_NOT, "vLLM integration", "make test builds it")

CONVERSATIONS, TURNS, SENTENCES, MAX_TOKENS = 3, 2, 40, 6
# 16 blocks of 640 tokens (vLLM sizes the attention block to the state's page) shared by the
# four groups: returning prefixes leave the device and come back from the host
VLLM_ARGS = ["--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "1024", "--enable-prefix-caching",
             "--max-num-batched-tokens", "256", "--num-gpu-blocks-override", "16",
             "--kv-cache-memory-bytes", str(64 << 20), "--disable-uvicorn-access-log"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with side_by_side(MODEL, VLLM_ARGS, tmp_path_factory.mktemp("vllm_linear"),
                      (CONVERSATIONS, TURNS, SENTENCES, MAX_TOKENS), ready_s=900) as out:
        yield out


def test_greedy_token_ids_identical_with_states_restored_from_the_host(runs):
    assert len(runs["hicache"]) == CONVERSATIONS * TURNS
    for i, (a, b) in enumerate(zip(runs["control"], runs["hicache"])):
        assert a == b, f"request {i}"
    assert len(set(runs["control"])) > 1  # the model's output depends on its input: the check means something
    m = runs["metrics"]
    assert m["hicache:loaded_blocks_total"] > 0 and m["hicache:hit_tokens_total"] > 0


def test_every_group_state_ones_included_came_back(runs):
    loaded = labelled(runs["raw"], "hicache:group_loaded_chunks_total")
    assert len(labelled(runs["raw"], "hicache:group_chunks_total")) == 4  # 1 attention + 3 DeltaNet groups
    assert len(loaded) == 4 and all(v > 0 for v in loaded.values()), loaded


def test_stopped_servers_leave_nothing_in_dev_shm_and_stop_quietly(runs):
    # last in the module: it stops the servers (the fixture's stop is then a no-op)
    check_stopped_cleanly(runs["servers"], runs["held"])
