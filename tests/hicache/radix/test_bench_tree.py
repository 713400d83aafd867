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


def test_before_must_be_a_checkout(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench_tree.main(["--before", str(tmp_path), "--rounds", "1"])
    assert "--before: " in capsys.readouterr().err


def test_ratios_to_the_before_checkout_are_paired_per_round():
    ours = [{"mtokens_per_s": 20.0, "poll_step_us": 40.0}, {"mtokens_per_s": 10.0, "poll_step_us": 60.0},
            {"mtokens_per_s": 30.0, "poll_step_us": 30.0}]
    before = [{"mtokens_per_s": 10.0, "poll_step_us": 80.0}, {"mtokens_per_s": 10.0, "poll_step_us": 60.0},
              {"mtokens_per_s": 10.0, "poll_step_us": 60.0}]
    row = bench_tree.summary_row(("host", 64), ours, [], "lru", before)
    assert row["gain_over_before_per_round"] == [2.0, 1.0, 3.0]
    assert row["gain_over_before"] == 2.0 and row["poll_over_before"] == 0.5
    assert row["before_mtokens_per_s"] == 10.0 and row["before_poll_step_us"] == 60.0
