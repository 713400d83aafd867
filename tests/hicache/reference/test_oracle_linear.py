"""The linear-attention reference models against transformers with the same weights.

transformers 5.23's ``Qwen3_5ForCausalLM`` and ``NemotronHForCausalLM`` run their pure-torch
paths here (no flash-linear-attention, causal_conv1d or mamba_ssm installed): a chunked
algorithm for a prefill, the recurrent one for a decode step, both in fp32 whatever the
model's dtype. Each mode is compared with the oracle run the same way: one prefill, uneven
chunks through transformers' own cache, token-by-token decode after a prefill.

Tolerance: the paged models compute in float64 (`hicache.reference.linear_config`), so the
distance is the oracle's own fp32 rounding. Nemotron-H's stays within 1e-5; Qwen3.5's
Gated DeltaNet kernels reach 1.6e-5 from the float64 math on these weights (seeds 1-3), and
disagree with each other by 1.1e-5 (chunked prefill against recurrent decode, the same
tokens), so its bound is 3e-5: as close to transformers as transformers is to itself.
"""
from __future__ import annotations

import pytest
import torch

from hicache.reference import oracle
from hicache.reference.linear_config import NemotronHConfig, Qwen35Config
from hicache.reference.verify import make_model
from tests.hicache.reference.test_oracle import paged_logits
from tests.set_up import needs

WHY_NOT = oracle.missing(("Qwen3_5ForCausalLM", "NemotronHForCausalLM"))
pytestmark = needs(WHY_NOT, "linear-attention oracle", "scripts/setup.sh installs transformers 5.23")

TOL = {"qwen3.5": 3e-5, "nemotron-h": 1e-5}
TOKENS = 80  # 2.5 pages
MODES = {"prefill": None, "chunks": [37, 1, 1, 22, 19], "decode": [48] + [1] * 32}


@pytest.fixture(scope="module", params=["qwen3.5", "nemotron-h"])
def models(request):
    """(config, paged model, transformers' model with the same weights) of one arch."""
    cfg = Qwen35Config() if request.param == "qwen3.5" else NemotronHConfig()
    return cfg, make_model(cfg, "cpu"), oracle.oracle_model(cfg)


@pytest.mark.parametrize("mode", MODES)
def test_paged_model_matches_transformers(models, mode):
    cfg, model, hf = models
    ids = torch.randint(0, cfg.vocab_size, (TOKENS,), generator=torch.Generator().manual_seed(1))
    ours = paged_logits(model, cfg, ids, MODES[mode])
    theirs = oracle.oracle_logits(hf, ids, MODES[mode]).double()
    assert (ours - theirs).abs().max().item() <= TOL[cfg.arch]
    assert theirs.std() > 0.5  # O(1) logits: the tolerance means something
    # a state carried across any cut gives the one-pass numbers: what a restore relies on
    assert (ours - paged_logits(model, cfg, ids, None)).abs().max().item() <= 1e-12


def test_each_layer_kind_is_in_the_toys():
    assert Qwen35Config().layer_kinds == ("linear", "linear", "linear", "full")
    assert NemotronHConfig().layer_kinds == ("linear", "mlp", "linear", "full")
    assert [p.name for p in Qwen35Config().stack()] == ["kv", "attn_kv", "conv", "recurrent"]
