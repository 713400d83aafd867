"""`HiCacheOffloadingManager`: vLLM's scheduler-side ``OffloadingManager`` over `HostBlockIndex`.

Translates vLLM's types (``OffloadKey``, ``LookupResult``, ``PrepareStoreOutput``, events,
``OffloadingConnectorStats``) to and from the vLLM-free index; keeps only the trailing
window of sliding-window and state groups (``window.py``); counts what the host tier
did for ``get_stats`` (exported by vLLM's ``/metrics`` as ``hicache:*``, per group where
labelled ``group``).

Cache reset: chunks whose transfer is in flight stay quarantined (``HostBlockIndex``)
until the workers are past it. vLLM >= 0.33 says so with ``on_reset_flushed()``; where the
base class has no such call (0.32), the first transfer completion after the reset is the
proof (workers wait for the jobs a reset flushed before they submit any later one), or
failing that the second schedule step after it (the flush went out with the first).
"""
from __future__ import annotations

from collections import deque
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Collection, Hashable, Iterable, Mapping, Sequence

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

from hicache.integrations.vllm.gate import paying_hit
from hicache.integrations.vllm.groups import HostLayout
from hicache.integrations.vllm.hints import HostHints
from hicache.integrations.vllm.index import HostBlockIndex, Lookup
from hicache.integrations.vllm.window import TrailingWindows

# vLLM >= 0.33 fences a cache reset and tells the manager when it is past (feature test).
RESET_FENCED = hasattr(OffloadingManager, "on_reset_flushed")

_LOOKUP = {Lookup.MISS: LookupResult.MISS, Lookup.HIT: LookupResult.HIT,
           Lookup.PENDING: LookupResult.HIT_PENDING}

# counter name -> (index counter, documentation); tokens are derived per group below
_COUNTERS = {
    "hicache:stored_blocks": ("stored", "Host chunks whose store completed."),
    "hicache:loaded_blocks": ("loaded", "Host chunks handed to loads (host-tier hits)."),
    "hicache:evicted_blocks": ("evicted", "Host chunks evicted (LRU) to make room for stores."),
    "hicache:store_refusals": ("store_refused", "Stores refused: no idle host chunk to evict."),
    "hicache:store_failures": ("store_failed", "Stores reported failed by the worker."),
    "hicache:demoted_blocks": ("demoted", "Sliding-window chunks that left their request's "
                                          "trailing window (evicted first)."),
}
_HINT_COUNTERS = {
    "hicache:hints": ("hints", "Client hint actions received (kv_transfer_params['hicache'])."),
    "hicache:hints_refused": ("hints_refused", "Client hints refused (malformed, unavailable, over the budget)."),
}
HIT_TOKENS = "hicache:hit_tokens"
RECOMPUTED_TOKENS = "hicache:recomputed_hit_tokens"
GROUP_LOADED = "hicache:group_loaded_chunks"
USED, TOTAL = "hicache:host_blocks_used", "hicache:host_blocks_total"
GROUP_USED, GROUP_TOTAL = "hicache:group_chunks_used", "hicache:group_chunks_total"
BYTES_PER_TOKEN = "hicache:host_bytes_per_token"
_GROUP = ("group",)


def metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """Every metric the manager emits (vLLM registers them with Prometheus)."""
    defs: dict[str, OffloadingMetricMetadata] = {
        name: OffloadingCounterMetadata(documentation=doc) for name, (_, doc) in (_COUNTERS | _HINT_COUNTERS).items()}
    defs[HIT_TOKENS] = OffloadingCounterMetadata(
        documentation="Prefix tokens loaded from the host tier, counted once however many KV cache "
                      "groups' chunks served them.")
    defs[RECOMPUTED_TOKENS] = OffloadingCounterMetadata(
        documentation="Host-tier hit tokens recomputed instead of loaded: the load policy cost estimated "
                      "recomputing them faster on its device profile.")
    defs[GROUP_LOADED] = OffloadingCounterMetadata(
        documentation="Host chunks handed to loads, per KV cache group.", labelnames=_GROUP)
    defs[USED] = OffloadingGaugeMetadata(documentation="Host chunks in use, all groups.")
    defs[TOTAL] = OffloadingGaugeMetadata(documentation="Host chunk capacity, all groups.")
    defs[GROUP_USED] = OffloadingGaugeMetadata(documentation="Host chunks in use, per KV cache "
                                               "group.", labelnames=_GROUP)
    defs[GROUP_TOTAL] = OffloadingGaugeMetadata(documentation="Host chunk capacity, per KV cache "
                                                "group.", labelnames=_GROUP)
    defs[BYTES_PER_TOKEN] = OffloadingGaugeMetadata(
        documentation="Host bytes per cached prefix token, per KV cache group (a sliding-window "
                      "group keeps only trailing windows).", labelnames=_GROUP)
    return defs


INFO_KEYS = ("hicache_groups", "hicache_host_chunks", "hicache_host_bytes",
             "hicache_bytes_per_token", "hicache_io_backend")


def config_info(layout: HostLayout, io_backend: str) -> dict[str, str | int | float]:
    """The ``vllm:kv_offload_config_info`` labels (vLLM >= 0.33): one value per ``INFO_KEYS``."""
    per_token = layout.bytes_per_token()
    return {"hicache_groups": ",".join(g.kind if g.window is None else f"window{g.window}"
                                       for g in layout.groups),
            "hicache_host_chunks": ",".join(str(c) for c in layout.chunks),
            "hicache_host_bytes": sum(g.host_bytes or 0 for g in layout.groups),
            "hicache_bytes_per_token": round(sum(b or 0.0 for b in per_token), 1),
            "hicache_io_backend": io_backend}


class JobEpochs:
    """The reset epoch each pending store or load of a (request, key) was prepared in,
    oldest first: vLLM's completions name keys only, and one of a job that was in flight
    at a reset must not complete the key's new entry (`HostBlockIndex.epoch`)."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, str, Hashable], deque[int]] = {}

    def add(self, kind: str, req_id: str, keys: Iterable[Hashable], epoch: int) -> None:
        for key in keys:
            self._pending.setdefault((kind, req_id, key), deque()).append(epoch)

    def take(self, kind: str, req_id: str, keys: Iterable[Hashable]) -> dict[int | None, list[Hashable]]:
        """``keys`` by the epoch their oldest pending job was prepared in (``None``: unknown)."""
        out: dict[int | None, list[Hashable]] = {}
        for key in keys:
            queue = self._pending.get((kind, req_id, key))
            epoch = queue.popleft() if queue else None
            if queue is not None and not queue:
                del self._pending[(kind, req_id, key)]
            out.setdefault(epoch, []).append(key)
        return out

    def forget_before(self, epoch: int) -> None:
        """Drop jobs of older epochs: past the reset's fence, vLLM reports none of them."""
        for ident, queue in list(self._pending.items()):
            while queue and queue[0] < epoch:
                queue.popleft()
            if not queue:
                del self._pending[ident]

    def __len__(self) -> int:
        return sum(len(q) for q in self._pending.values())


class HostChunksSpec(BlockIDsLoadStoreSpec):
    """Where blocks live on the host: chunk ids (one id space per KV cache group)."""


class HiCacheOffloadingManager(OffloadingManager):
    """The scheduler side of the plugin (constructed by ``HiCacheOffloadingSpec``).

    Args:
        index: the host chunk index (its per-group capacity from ``layout``).
        layout: every group's tokens per chunk, window and host bytes.
        enable_events: record stored/removed events for vLLM's KV event stream.
        info: the ``config_info()`` labels.
        hints: the client hints' limits, (``max_retained_ratio``, ``max_hint_ttl_s``).
    """

    def __init__(self, index: HostBlockIndex, layout: HostLayout, enable_events: bool = False,
                 info: Mapping[str, Any] | None = None, hints: tuple[float, float] = (0.5, 86400.0)) -> None:
        self.index, self.layout = index, layout
        self.tokens_per_chunk = [g.tokens_per_chunk for g in layout.groups]
        self.hints = HostHints(index, *hints, self.tokens_per_chunk)
        self.windows = TrailingWindows([g.window for g in layout.groups])
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self.hit_tokens = 0
        self.group_loaded = [0] * len(layout.groups)
        self._reported: dict[tuple[str, tuple], int] = {}
        self._info = dict(info or {})
        self._steps_since_reset: int | None = None  # vLLM 0.32: steps since an unfenced reset
        self.jobs = JobEpochs()
        self.recomputed_tokens = 0
        self._gate: Any = None  # `use_gate`: the load-or-recompute gate (None: load every hit)
        self._load_bytes = 0.0  # bytes of the loads handed out and not completed (the gate's backlog)

    def use_gate(self, gate: Any) -> None:
        """Weigh each host hit with ``gate`` (`hicache.integrations.vllm.gate`); None: load all."""
        self._gate = gate

    def pending_load_bytes(self) -> float:
        """Host bytes of the loads prepared and not completed yet."""
        return self._load_bytes

    def paying_tokens(self, prompt: int, computed: int, hit: int) -> int:
        """Of a lookup's ``hit`` tokens past the ``computed`` ones, those to load: all when
        loading them beats recomputing them (or without a gate), else none (counted)."""
        if self._gate is None or hit <= 0:
            return hit
        keep = paying_hit(self._gate, prompt, computed, hit)
        self.recomputed_tokens += hit - keep
        return keep

    def _chunk_bytes(self, keys: Iterable[OffloadKey]) -> float:
        groups = self.layout.groups
        return float(sum(groups[self.index.group(k)].bytes_per_chunk or 0 for k in keys))

    @property
    def lock(self) -> AbstractContextManager:
        """vLLM >= 0.33 holds this across a lookup HIT and its ``prepare_load``; a no-op,
        as in vLLM's default: nothing but vLLM's scheduler thread enters this manager."""
        return nullcontext()

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self.hints.start(req_context.req_id, req_context.kv_transfer_params, getattr(req_context, "kv_hints", None))
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self.index.lookup(key)
        if found is not Lookup.MISS:
            self.hints.saw(req_context.req_id, (key,))
        return _LOOKUP[found]

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> HostChunksSpec:
        keys = list(keys)
        chunks = self.index.prepare_load(keys)
        self.jobs.add("load", req_context.req_id, keys, self.index.epoch)
        self._load_bytes += self._chunk_bytes(keys)
        per_group = [0] * len(self.group_loaded)
        for key in keys:
            per_group[self.index.group(key)] += 1
        for g, count in enumerate(per_group):
            self.group_loaded[g] += count
        # the prefix's tokens once: every group's chunks cover (a trailing part of) the same
        # prefix, so the group covering the most tokens says how long it is (a full-attention one)
        self.hit_tokens += max(c * t for c, t in zip(per_group, self.tokens_per_chunk))
        return HostChunksSpec(chunks)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.index.touch(keys)
        self.hints.saw(req_context.req_id, keys)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        jobs = self.jobs.take("load", req_context.req_id, keys)  # before a fence forgets their epochs
        self._load_bytes = max(0.0, self._load_bytes - self._chunk_bytes(keys))
        self._transfer_ended()
        for epoch, done in jobs.items():
            self.index.complete_load(done, epoch)

    def prepare_store(self, keys: Collection[OffloadKey],
                      req_context: ReqContext) -> PrepareStoreOutput | None:
        """Host chunks for ``keys``: all of a full-attention group's, a windowed group's
        trailing window only (the rest is not stored: ``keys_to_store`` leaves it out)."""
        position = getattr(req_context, "get_offload_key_position", lambda key: None)
        choice = self.windows.select(req_context.req_id, list(keys), self.index.group, position)
        plan = self.index.prepare_store(choice.offer)
        if plan is None:
            return None  # vLLM counts an allocation failure and retries later
        self.windows.commit(req_context.req_id, choice)
        self.hints.saw(req_context.req_id, plan.keys)
        self.jobs.add("store", req_context.req_id, plan.keys, plan.epoch)
        self.index.demote(choice.demote)
        if plan.evicted:
            self._event(plan.evicted, removed=True)
        return PrepareStoreOutput(keys_to_store=plan.keys, store_spec=HostChunksSpec(plan.chunks),
                                  evicted_keys=plan.evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        jobs = self.jobs.take("store", req_context.req_id, keys)  # before a fence forgets their epochs
        self._transfer_ended()
        stored = [key for epoch, done in jobs.items() for key in self.index.complete_store(done, success, epoch)]
        if stored:
            self._event(stored, removed=False)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.windows.finish(req_context.req_id)
        self.hints.finish(req_context.req_id)

    def _event(self, keys: list, removed: bool) -> None:
        if self.events is not None:
            self.events.append(OffloadingEvent(keys=list(keys), medium=Medium.CPU, removed=removed))

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events:
            yield from self.events
            self.events.clear()

    def reset_cache(self) -> None:
        """Forget every key; chunks with a transfer in flight wait for the fence (module docstring)."""
        self.index.reset()
        self.windows.clear()
        if not RESET_FENCED:
            self._steps_since_reset = 0

    def on_reset_flushed(self) -> None:
        """vLLM >= 0.33: every job in flight at the last reset has been reported."""
        self._release()

    def _transfer_ended(self) -> None:
        """vLLM 0.32: a job completed after an unfenced reset, so the workers are past it."""
        if self._steps_since_reset is not None:
            self._steps_since_reset = None
            self._release()

    def _release(self) -> None:
        """The reset's fence is passed: its quarantined chunks and pending jobs are forgotten."""
        self.index.release_reset()
        self.jobs.forget_before(self.index.epoch)

    def on_schedule_end(self, context: Any) -> None:
        self.hints.expire()
        if self._steps_since_reset is not None:
            self._steps_since_reset += 1
            if self._steps_since_reset >= 2:
                self._transfer_ended()

    def config_info(self) -> Sequence[Mapping[str, Any]]:
        """vLLM >= 0.33's ``vllm:kv_offload_config_info`` series (``INFO_KEYS``)."""
        return [self._info]

    def totals(self) -> dict[str, int]:
        """Counters since start-up: the ``hicache:*`` counter names -> values."""
        out = {name: self.index.counters[key] for name, (key, _) in _COUNTERS.items()}
        out |= {name: self.hints.counters[key] for name, (key, _) in _HINT_COUNTERS.items()}
        out[HIT_TOKENS] = self.hit_tokens
        out[RECOMPUTED_TOKENS] = self.recomputed_tokens
        return out

    def _increase(self, stats: OffloadingConnectorStats, name: str, value: int, label: tuple = ()) -> None:
        """Add a counter's increment since the last report to ``stats``."""
        delta = value - self._reported.get((name, label), 0)
        if delta:
            stats.increase_counter(name, delta, label)
        self._reported[(name, label)] = value

    def get_stats(self) -> OffloadingConnectorStats:
        """Counter increments since the last call, and the current occupancy gauges."""
        stats = OffloadingConnectorStats()
        for name, value in self.totals().items():
            self._increase(stats, name, value)
        for g, value in enumerate(self.group_loaded):
            self._increase(stats, GROUP_LOADED, value, (str(g),))
        groups = range(self.index.num_groups)
        stats.set_gauge(USED, sum(self.index.used(g) for g in groups))
        stats.set_gauge(TOTAL, self.index.num_chunks)
        for g, per_token in zip(groups, self.layout.bytes_per_token()):
            label = (str(g),)
            stats.set_gauge(GROUP_USED, self.index.used(g), label)
            stats.set_gauge(GROUP_TOTAL, self.index.chunks_per_group[g], label)
            if per_token is not None:
                stats.set_gauge(BYTES_PER_TOKEN, per_token, label)
        return stats
