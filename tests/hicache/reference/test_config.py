"""The reference models' configs, stacks and workload bounds."""
from __future__ import annotations

import numpy as np
import pytest

from hicache.reference.config import Dsv4Config, MhaConfig, toy_config
from hicache.reference.workload import SYSTEM_TOKENS, longest_request, schedule


def test_dsv4_layer_schedule_and_pools():
    cfg = Dsv4Config(num_layers=5)
    assert cfg.compress_ratios == (0, 4, 16, 4, 16)
    stack = cfg.stack()
    assert stack.model == cfg.identity and stack.page_size == 32
    # the HCA pool keeps its real name at ratio 16: 32 // 16 = 2 entries per page row
    assert stack.pool("c128_kv").buffers[0].row_shape == (2, 64) and stack.pool("c128_kv").layer_ids == (2, 4)
    assert stack.pool("c4_state").buffers[0].row_shape == (8, 256)  # 2 x ratio slots of [kv | gate] x 2 series
    assert stack.pool("swa").tokens_per_row == stack.pool("c4_state").tokens_per_row == 16


def test_identities_differ_by_arch_dims_and_seed():
    ids = {toy_config(a, n, s).identity for a in ("deepseek-v4", "mha") for n in (2, 3) for s in (0, 1)}
    assert len(ids) == 8
    assert MhaConfig().stack().model == MhaConfig().identity


@pytest.mark.parametrize("kw, match", [
    (dict(rope_dim=7), "rope_dim: must be even"),
    (dict(o_groups=3), "o_groups: must divide"),
    (dict(experts_per_token=5), "experts_per_token: must be <= num_experts=4"),
    (dict(hca_ratio=24), "page_size: 32 must be a multiple of hca_ratio=24"),
    (dict(window=0), "window: must be an integer >= 1"),
])
def test_dsv4_config_rejects_bad_dims(kw, match):
    with pytest.raises(ValueError, match=match):
        Dsv4Config(**kw)


def test_mha_config_rejects_heads_kv_heads_do_not_divide():
    with pytest.raises(ValueError, match="num_kv_heads: must divide num_heads=4"):
        MhaConfig(num_kv_heads=3)


@pytest.mark.parametrize("seed", range(5))
def test_no_request_exceeds_the_longest_request_bound(seed):
    system, turns = schedule(6, 4, 256, seed)
    assert system.size == SYSTEM_TOKENS
    length, longest = {}, 0
    for t in turns:
        prompt = length.get(t.conversation, SYSTEM_TOKENS) + t.user.size
        longest = max(longest, prompt + 3)  # decode 4: prompt + 3 tokens computed
        length[t.conversation] = prompt + 4
    assert longest <= longest_request(4, 4)
    assert [t.turn for t in turns if t.conversation == 0] == [0, 1, 2, 3]
    assert all(np.issubdtype(t.user.dtype, np.integer) and t.user.max() < 256 for t in turns)
