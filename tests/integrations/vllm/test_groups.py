"""Per-group host sizing and the trailing-window choice (no vLLM needed)."""
from __future__ import annotations

import pytest

from hicache.integrations.vllm.groups import plan_groups
from hicache.integrations.vllm.window import TrailingWindows


def test_windowed_groups_are_sized_by_their_window_and_the_prefix_length():
    # full (16-token chunks) + sliding window of 4 chunks; 64 full chunks = 1024 tokens
    layout = plan_groups([16, 16], [None, 4], 64, prefix_tokens=256, bytes_per_chunk=[300, 200])
    assert layout.anchor_tokens == 1024 and layout.chunks == [64, 20]  # 4 prefixes x (4 + 1)
    assert layout.bytes_per_token() == [64 * 300 / 1024, 20 * 200 / 1024]
    assert layout.groups[1].every_block_bytes_per_token == 200 / 16
    assert "group 1: window (window 4+1 chunks), 20 chunks" in layout.describe()
    # never more than covering every anchor token; a model without a full group
    assert plan_groups([16, 16], [None, 4], 64, prefix_tokens=16).chunks == [64, 64]
    swa_only = plan_groups([16, 64], [2, 1], 10, prefix_tokens=640)
    assert swa_only.anchor_tokens == 640 and swa_only.chunks == [3, 2]
    assert plan_groups([16], [None], 4, 8).bytes_per_token() == [None]  # bytes unknown here


@pytest.mark.parametrize("args, match", [
    (([16, 16], [None], 4, 8), "need one entry per group"),
    (([16], [None], 0, 8), "must be >= 1"),
    (([16], [None], 4, 0), "must be >= 1"),
    (([16], [None], 4, 8, [1, 2]), "need one entry per group"),
])
def test_bad_plans_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        plan_groups(*args)


def key(group: int, chunk: int) -> tuple:
    return (group, chunk)


def test_trailing_window_per_request_and_demotion():
    w = TrailingWindows([None, 2])  # keeps 3 chunks of group 1
    group_of, pos = (lambda k: k[0]), (lambda k: (k[1] + 1) * 16)
    keys = [key(0, c) for c in range(6)] + [key(1, c) for c in range(6)]
    first = w.select("r", keys, group_of, pos)
    assert first.offer == [key(0, c) for c in range(6)] + [key(1, 3), key(1, 4), key(1, 5)]
    assert first.demote == []
    w.commit("r", first)
    # offered out of order (vLLM re-offers a tail), then later chunks: old window demoted
    nxt = w.select("r", [key(1, 7), key(1, 6), key(0, 6)], group_of, pos)
    assert nxt.offer == [key(1, 7), key(1, 6), key(0, 6)] and nxt.demote == [key(1, 3), key(1, 4)]
    assert w.select("other", [key(1, 0)], group_of, pos).demote == []  # requests are separate
    w.commit("r", nxt)
    w.finish("r")
    assert len(w) == 0 and not TrailingWindows([None]).active


def test_keys_without_a_position_rank_by_arrival():
    w = TrailingWindows([1])  # keeps 2
    first = w.select("r", [key(0, 0), key(0, 1), key(0, 2)], lambda k: 0, lambda k: None)
    assert first.offer == [key(0, 1), key(0, 2)]
    w.commit("r", first)
    later = w.select("r", [key(0, 3)], lambda k: 0, lambda k: None)
    assert later.offer == [key(0, 3)] and later.demote == [key(0, 1)]
    with pytest.raises(ValueError, match="windows"):
        TrailingWindows([0])
