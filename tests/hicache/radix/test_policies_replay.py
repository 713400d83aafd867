"""Every eviction policy through `hicache replay`'s machinery: byte-exact loads, the tree's
invariants, on DeepSeek-V4-Flash (history and snapshots evicted as one node) with a file
store below the host, under write-through and write-back."""
from __future__ import annotations

import pytest

from hicache.config import EVICTION_POLICIES
from tests.hicache.radix.test_write_back import hit_rate, replay


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
@pytest.mark.parametrize("eviction", EVICTION_POLICIES)
def test_every_policy_replays_byte_exact(eviction, write_policy, tmp_path):
    counters: dict = {}
    st = replay(write_policy, 2.0, tmp_path, eviction=eviction, requests=40, counters=counters)
    assert st.mismatches == 0 and st.transfers_failed == 0 and st.bytes_checked > 0
    # the policy chose victims on both tiers, and the store served some of what they gave up
    assert counters["device_evicted_tokens"] > 0 and counters["host_evicted_tokens"] > 0
    assert st.host_hit_tokens > 0 and st.storage_hit_tokens > 0 and 0 < hit_rate(st) < 1
