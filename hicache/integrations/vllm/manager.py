"""`HiCacheOffloadingManager`: vLLM's scheduler-side ``OffloadingManager`` over `HostBlockIndex`.

Translates vLLM's types (``OffloadKey``, ``LookupResult``, ``PrepareStoreOutput``, events,
``OffloadingConnectorStats``) to and from the vLLM-free index; counts what the host tier
did for ``get_stats`` (exported by vLLM's ``/metrics`` as ``hicache:*``).
"""
from __future__ import annotations

from typing import Collection, Iterable, Sequence

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from hicache.integrations.vllm.index import HostBlockIndex, Lookup

_LOOKUP = {Lookup.MISS: LookupResult.MISS, Lookup.HIT: LookupResult.HIT,
           Lookup.PENDING: LookupResult.HIT_PENDING}

# counter name -> (index counter, documentation); tokens are derived per group below
_COUNTERS = {
    "hicache:stored_blocks": ("stored", "Host chunks whose store completed."),
    "hicache:loaded_blocks": ("loaded", "Host chunks handed to loads (host-tier hits)."),
    "hicache:evicted_blocks": ("evicted", "Host chunks evicted (LRU) to make room for stores."),
    "hicache:store_refusals": ("store_refused", "Stores refused: no idle host chunk to evict."),
    "hicache:store_failures": ("store_failed", "Stores reported failed by the worker."),
}
HIT_TOKENS = "hicache:hit_tokens"
USED, TOTAL = "hicache:host_blocks_used", "hicache:host_blocks_total"


def metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """Every metric the manager emits (vLLM registers them with Prometheus)."""
    defs: dict[str, OffloadingMetricMetadata] = {
        name: OffloadingCounterMetadata(documentation=doc) for name, (_, doc) in _COUNTERS.items()}
    defs[HIT_TOKENS] = OffloadingCounterMetadata(
        documentation="Tokens loaded from the host tier (whole chunks).")
    defs[USED] = OffloadingGaugeMetadata(documentation="Host chunks in use, all groups.")
    defs[TOTAL] = OffloadingGaugeMetadata(documentation="Host chunk capacity, all groups.")
    return defs


class HostChunksSpec(BlockIDsLoadStoreSpec):
    """Where blocks live on the host: chunk ids (one id space per KV cache group)."""


class HiCacheOffloadingManager(OffloadingManager):
    """The scheduler side of the plugin (constructed by ``HiCacheOffloadingSpec``).

    Args:
        index: the host chunk index.
        tokens_per_chunk: tokens one chunk holds, per index group.
        enable_events: record stored/removed events for vLLM's KV event stream.
    """

    def __init__(self, index: HostBlockIndex, tokens_per_chunk: Sequence[int],
                 enable_events: bool = False) -> None:
        self.index = index
        self.tokens_per_chunk = list(tokens_per_chunk)
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self.hit_tokens = 0
        self._reported: dict[str, int] = {}

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return _LOOKUP[self.index.lookup(key)]

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> HostChunksSpec:
        keys = list(keys)
        chunks = self.index.prepare_load(keys)
        self.hit_tokens += sum(self.tokens_per_chunk[self.index.group(k)] for k in keys)
        return HostChunksSpec(chunks)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.index.touch(keys)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.index.complete_load(list(keys))

    def prepare_store(self, keys: Collection[OffloadKey],
                      req_context: ReqContext) -> PrepareStoreOutput | None:
        plan = self.index.prepare_store(list(keys))
        if plan is None:
            return None  # vLLM counts an allocation failure and retries later
        if plan.evicted:
            self._event(plan.evicted, removed=True)
        return PrepareStoreOutput(keys_to_store=plan.keys, store_spec=HostChunksSpec(plan.chunks),
                                  evicted_keys=plan.evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        stored = self.index.complete_store(list(keys), success)
        if stored:
            self._event(stored, removed=False)

    def _event(self, keys: list, removed: bool) -> None:
        if self.events is not None:
            self.events.append(OffloadingEvent(keys=list(keys), medium=Medium.CPU, removed=removed))

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events:
            yield from self.events
            self.events.clear()

    def reset_cache(self) -> None:
        self.index.reset()

    def totals(self) -> dict[str, int]:
        """Counters since start-up: the ``hicache:*`` counter names -> values."""
        out = {name: self.index.counters[key] for name, (key, _) in _COUNTERS.items()}
        out[HIT_TOKENS] = self.hit_tokens
        return out

    def get_stats(self) -> OffloadingConnectorStats:
        """Counter increments since the last call, and the current occupancy gauges."""
        stats = OffloadingConnectorStats()
        for name, value in self.totals().items():
            delta = value - self._reported.get(name, 0)
            if delta:
                stats.increase_counter(name, delta)
            self._reported[name] = value
        groups = range(self.index.num_groups)
        stats.set_gauge(USED, sum(self.index.used(g) for g in groups))
        stats.set_gauge(TOTAL, self.index.num_chunks * self.index.num_groups)
        return stats
