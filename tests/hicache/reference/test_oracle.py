"""The paged reference models against transformers with the same weights (the oracle).

DeepSeek-V4 needs transformers >= 5.19 (`scripts/setup.sh` installs the pinned 5.23.0
without touching torch). Without it the tests skip with the reason, except under CI=true,
where a missing oracle fails: CI must prove the set-up, not skip it.

Every mode is compared with the oracle run the same way: one prefill, uneven chunks fed
through transformers' own cache, and token-by-token decode after a prefill. Indexer top-k
is really exercised (``index_topk`` 4 against up to 20 entries), and the smallest score gap
at the top-k boundary is checked to be far above fp32 rounding (no ties); a separate case
has ``index_topk`` >= every entry count.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hicache.build import build_device_pools
from hicache.reference import oracle
from hicache.reference.config import Dsv4Config, MhaConfig
from hicache.reference.dsv4 import Dsv4Model
from hicache.reference.paged import PagedSeq
from hicache.reference.verify import make_model
from tests.set_up import needs

WHY_NOT = oracle.missing()
pytestmark = needs(WHY_NOT, "DeepSeek-V4 oracle", "scripts/setup.sh installs it")

TOL = 1e-5
TOKENS = 80  # 2.5 pages: 20 CSA entries, 5 HCA entries
MODES = {"prefill": None, "chunks": [37, 1, 1, 22, 19], "decode": [48] + [1] * 32}


def paged_logits(model, cfg, ids: torch.Tensor, chunks: list[int] | None) -> torch.Tensor:
    """The paged model on fresh pools, its pages scattered (not slot order), its working state
    in the state root's second snapshot (``swa``, ``conv``), fed in ``chunks``."""
    stack, page = cfg.stack(), cfg.page_size
    pages = -(-ids.numel() // page)
    root, window = next(iter(stack.snapshot_slots.items()), (None, 0))
    roots = {stack.anchor.name: 2 * pages * page, root: 2 * window}
    pools = build_device_pools(stack, {p.name: roots[stack.root_of(p.name).name] // p.tokens_per_row
                                       for p in stack}, torch.device("cpu"))
    order = torch.randperm(2 * pages, generator=torch.Generator().manual_seed(7))[:pages]
    slots = (order[:, None] * page + torch.arange(page)).reshape(-1)
    seq = PagedSeq(stack, pools, slots, torch.arange(window, 2 * window) if window else None, codecs=model.codecs)
    out, start = [], 0
    for n in chunks or [ids.numel()]:
        out.append(model.forward(seq, ids[start:start + n]))
        start += n
    return torch.cat(out)


def token_ids(cfg, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (TOKENS,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=["deepseek-v4", "mha"])
def models(request):
    """(config, paged model, transformers' model with the same weights) of one arch."""
    cfg = Dsv4Config() if request.param == "deepseek-v4" else MhaConfig()
    return cfg, make_model(cfg, "cpu"), oracle.oracle_model(cfg)


@pytest.mark.parametrize("mode", MODES)
def test_paged_model_matches_transformers(models, mode):
    cfg, model, hf = models
    ids = token_ids(cfg)
    ours = paged_logits(model, cfg, ids, MODES[mode])
    theirs = oracle.oracle_logits(hf, ids, MODES[mode])
    assert (ours - theirs).abs().max().item() <= TOL
    assert theirs.std() > 0.5  # O(1) logits: a tolerance of 1e-5 means something


def test_dsv4_topk_is_exercised_without_ties():
    cfg = Dsv4Config()
    model = Dsv4Model(cfg)
    paged_logits(model, cfg, token_ids(cfg), MODES["chunks"])
    stats = model.topk
    # most queries see more CSA entries than index_topk = 4: the selection decides
    assert stats.exercised > stats.queries // 2
    # the k-th and (k+1)-th scores are never within rounding of each other
    assert stats.min_gap > 1e-4


def test_dsv4_matches_transformers_with_topk_over_every_entry():
    cfg = replace(Dsv4Config(), index_topk=TOKENS)  # >= any entry count: no selection at all
    model, hf = Dsv4Model(cfg), oracle.oracle_model(cfg)
    ids = token_ids(cfg, seed=2)
    ours = paged_logits(model, cfg, ids, MODES["chunks"])
    assert (ours - oracle.oracle_logits(hf, ids, MODES["chunks"])).abs().max().item() <= TOL
    assert model.topk.exercised == 0


def test_oracle_logits_rejects_chunks_of_another_length():
    cfg = MhaConfig(num_layers=1)
    with pytest.raises(ValueError, match="chunks: must sum to 80"):
        oracle.oracle_logits(oracle.oracle_model(cfg), token_ids(cfg), [40, 1])
