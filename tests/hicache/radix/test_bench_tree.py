"""`bench/tree.py` runs its workload end to end (a few conversations) on both tiers."""
from __future__ import annotations

import pytest

from bench import tree as bench_tree
from hicache.config import EVICTION_POLICIES


@pytest.mark.parametrize("host_tier", [True, False])
@pytest.mark.parametrize("page_size", [64, 1])
def test_one_pass_counts_each_turn_once(host_tier, page_size):
    convs = bench_tree.conversations()[:6, :3 * bench_tree.TURN_TOKENS]
    row = bench_tree.one_pass(convs, page_size, host_tier)  # ends with check_integrity
    assert row["tokens_counted_once"] == 6 * bench_tree.TURN_TOKENS * (1 + 2 + 3)
    assert row["mtokens_per_s"] > 0 and row["evicted_tokens"] > 0
    assert (row["poll_step_us"] is not None) == host_tier
    assert (row["backups"] > 0) == host_tier
    if host_tier:
        assert row["load_backs"] > 0


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
def test_one_pass_under_every_eviction_policy(policy):
    convs = bench_tree.conversations()[:4, :2 * bench_tree.TURN_TOKENS]
    row = bench_tree.one_pass(convs, 64, True, policy)
    assert row["evicted_tokens"] > 0 and row["load_backs"] > 0


def test_an_unknown_policy_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench_tree.main(["--hicache-eviction-policy", "lru,fifo", "--rounds", "1"])
    assert "'fifo' is not one of lru" in capsys.readouterr().err
