"""Every write policy through `hicache replay`'s machinery, with the host alone, with a file
store below it, and with a store that admits only prefixes of two requests: byte-exact
loads (every page restored from host or storage checked), the tree's invariants, no
failed transfer; admission writes less to storage. (Write-through and write-back over a
plain file store, under every eviction policy: `test_policies_replay.py`.)"""
from __future__ import annotations

import pytest

from hicache.config import WRITE_POLICIES
from tests.hicache.radix.test_write_back import replay

# (write_through_selective backs up only prefixes of two inserts: admission 2 refuses nothing more)
CASES = [(p, "host only") for p in WRITE_POLICIES] + [("write_through_selective", "file store")] + [
    (p, "file store, admission 2") for p in ("write_through", "write_back")]


@pytest.mark.parametrize(("write_policy", "storage"), CASES)
def test_every_write_policy_replays_byte_exact(write_policy, storage, tmp_path):
    with_store, admission = storage != "host only", 2 if "admission" in storage else 1
    counters: dict = {}
    ratio = 1.0 if with_store else 2.0  # a host the device's size: it gives pages up to storage early
    st = replay(write_policy, ratio, tmp_path if with_store else None, requests=40, counters=counters,
                admission=admission)
    assert st.mismatches == 0 and st.transfers_failed == 0 and st.bytes_checked > 0
    assert st.host_hit_tokens + st.storage_hit_tokens > 0 and counters["device_evicted_tokens"] > 0
    if with_store:
        assert st.storage_hit_tokens > 0 and st.bytes_storage_written > 0
        refused = counters.get("storage_refused_pages", 0) + counters.get("storage_refused_snapshots", 0)
        assert (refused > 0) == (admission > 1)
    if admission > 1 and write_policy == "write_through":  # the same replay admitting every page
        every = replay(write_policy, ratio, tmp_path / "every", requests=40)
        assert st.bytes_storage_written < every.bytes_storage_written
