"""`RunStats`, the totals of one replay (`collect_transfers`, `host_bytes_used`: from the
controller's, the store's and the host pools' counters), and `tier_tokens`, the capacity its
bounds take."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from hicache.config import DEFAULT_EVICTION_POLICY

UNLIMITED_TOKENS = 1 << 40  # the capacity of an unlimited storage tier, in the bounds


def tier_tokens(device_tokens: int, host_tokens: int, host_bytes: int, storage_bytes: int | None) -> int:
    """Anchor tokens of a device, a host and a storage tier together (a run's capacity).

    The storage tier counts at the host format's bytes per anchor token (``host_bytes``
    over ``host_tokens``: every pool's share), so no run exceeds its Belady bound.

    Args:
        storage_bytes: the store's capacity; 0: unlimited (`UNLIMITED_TOKENS`); None: no store.
    """
    tokens = device_tokens + host_tokens
    if storage_bytes is None:
        return tokens
    per_token = host_bytes / max(1, host_tokens)
    return tokens + (int(storage_bytes / per_token) if storage_bytes else UNLIMITED_TOKENS)


@dataclass(slots=True)
class RunStats:
    """Totals of one replay (tokens are prompt tokens)."""

    hicache_ratio: float
    requests: int = 0
    tokens_total: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    tokens_recomputed: int = 0
    uncached_requests: int = 0  # prompts the device could not hold (computed, not cached)
    pages_h2d: int = 0
    pages_d2h: int = 0
    bytes_h2d: int = 0
    bytes_d2h: int = 0
    seconds_h2d: float = 0.0
    seconds_d2h: float = 0.0
    peak_host_bytes: int = 0
    bytes_checked: int = 0
    mismatches: int = 0
    wall_s: float = 0.0
    storage: bool = False  # the run had a storage tier
    storage_hit_tokens: int = 0
    bytes_storage_read: int = 0
    bytes_storage_written: int = 0
    seconds_storage_read: float = 0.0  # I/O threads busy reading (a read in flight)
    seconds_storage_write: float = 0.0  # I/O threads busy writing
    transfers_ok: int = 0  # backups and loads acked as done
    transfers_failed: int = 0  # acked as failed (rolled back)
    transfer_error: str = ""  # the first failed ack's error
    host_dtype: str = "auto"  # --hicache-host-dtype of the run
    host_capacity_bytes: int = 0  # bytes of the host pools (int8 ones counted as int8 + scales)
    eviction_policy: str = DEFAULT_EVICTION_POLICY  # --hicache-eviction-policy of the run
    capacity_tokens: int = 0  # device + host (+ storage) tokens of the anchor pool (the bounds' capacity)
    hints: str = "on"  # --hints of the run: on, off or wrong
    hints_sent: int = 0  # hints the tree got (one per action of an envelope)
    hint_states: dict = field(default_factory=dict)  # tickets per state at the end (accepted: still in force)
    state_interval: int = 0  # tokens between the snapshots a prefill saves (0: not a hybrid stack)
    snapshots: int = 0  # state snapshots the prefills saved (each its snapshot_bytes on the device)
    snapshot_bytes: int = 0  # bytes of one snapshot, all state pools and layers (device format)
    bytes_d2h_state: int = 0  # of bytes_d2h: the state pools' (snapshots backed up to the host)
    live_score: str = ""  # the eviction policy's score at the end (adaptive: the candidate it chose)
    score_switches: int = 0  # adaptive: changes of its live score
    score_why: dict = field(default_factory=dict)  # adaptive: each candidate's hit rate in its mini caches
    policy_memory_bytes: int = 0  # the policy's ghosts, checkpoints and mini caches
    # estimated on --device-profile (hicache.replay.timing; none without it): seconds
    load_policy: str = ""
    device_profile: str = ""
    ttft_p50_s: float = 0.0
    ttft_p99_s: float = 0.0
    ttft_nocache_p50_s: float = 0.0
    ttft_nocache_p99_s: float = 0.0
    prefill_gpu_s_saved: float = 0.0
    prefill_gpu_s_nocache: float = 0.0
    requests_recomputing_hits: int = 0  # requests whose found tokens the cost policy recomputed in part

    def as_dict(self) -> dict:
        return asdict(self)

    def collect_policy(self, policy: dict) -> None:
        """Which score ranked at the end and why, from the tree's ``stats()["policy"]`` (mutates)."""
        self.live_score, self.score_switches = policy["live"], policy.get("switches", 0)
        self.score_why, self.policy_memory_bytes = policy.get("why", {}), policy["memory_bytes"]


def host_bytes_used(cache: Any) -> int:
    """Host bytes the pools of ``cache`` (a `HiCache`) hold now, in the host format (int8 +
    scales when int8). Reads only."""
    stack, host = cache.stack, cache.host_group.pools
    total = 0
    for spec in stack.data_pools():
        used = host[stack.root_of(spec.name).name].allocator.used()
        total += used // spec.tokens_per_row * spec.num_layers * host[spec.name].spec.row_bytes
    return total


def collect_transfers(st: RunStats, ctrl: dict, storage: Any, stack: Any) -> None:
    """Set ``st``'s transfer totals from the controller's ``stats()`` (``ctrl``) and the
    storage tier's (``storage``: the tree's, or None). Mutates ``st``."""
    if storage is not None:
        store = storage.stats()
        st.storage = True
        st.bytes_storage_read, st.bytes_storage_written = store["bytes_read"], store["bytes_written"]
        st.seconds_storage_read, st.seconds_storage_write = store["read_busy_s"], store["write_busy_s"]
    st.transfers_ok = ctrl["d2h"]["ops"] + ctrl["h2d"]["ops"]
    st.transfers_failed = ctrl["d2h"]["failed_ops"] + ctrl["h2d"]["failed_ops"]
    st.bytes_d2h = sum(ctrl["d2h"]["bytes"].values())
    st.bytes_d2h_state = sum(n for name, n in ctrl["d2h"]["bytes"].items()
                             if stack.root_of(name).name in stack.snapshot_slots)
    st.bytes_h2d = sum(ctrl["h2d"]["bytes"].values())
    anchor, page = stack.anchor.name, stack.page_size
    st.pages_d2h = ctrl["d2h"]["tokens"].get(anchor, 0) // page
    st.pages_h2d = ctrl["h2d"]["tokens"].get(anchor, 0) // page
