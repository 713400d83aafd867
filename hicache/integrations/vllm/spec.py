"""`HiCacheOffloadingSpec` (API) and `HiCacheOffloadingConnector`: hicache as vLLM's host tier.

vLLM (0.32 and 0.33; its offloading API is experimental) builds one spec per process
from ``kv_connector_extra_config``: the scheduler asks it for a manager, each worker for
a worker. Both sides must agree on the host capacity of every KV cache group, which
``--hicache-ratio`` defines against vLLM's device block count and each group's window.
vLLM's ``OffloadingConfig`` carries neither the block count nor (before 0.33) the
windows, so ``HiCacheOffloadingConnector`` (vLLM's ``OffloadingConnector`` and nothing
more) hands ``kv_cache_config`` to the spec it creates. With vLLM's plain connector
only ``hicache_size_gb`` sizing works (the ratio is refused at start-up with that
advice), and on 0.32 every group is then kept whole, as full attention.
Every setting is validated here, at start-up, on both sides, before memory is touched.
What differs between vLLM releases is feature-detected, never read from a version:
0.33's ``sliding_window_size_in_chunks``, ``on_reset_flushed``, ``expedited`` loads and
``config_info``.
"""
from __future__ import annotations

import importlib
import logging
from contextvars import ContextVar
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.v1.kv_cache_interface import iter_layer_specs
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
    get_offload_group_idx,
)
from vllm.v1.kv_offload.config import OffloadingConfig

from hicache.integrations.vllm.config import CONNECTOR_NAME, SpecConfig
from hicache.integrations.vllm.gate import plugin_gate
from hicache.integrations.vllm.groups import HostLayout, plan_groups
from hicache.integrations.vllm.host_codec import Vector, host_block_bytes
from hicache.integrations.vllm.index import HostBlockIndex
from hicache.integrations.vllm.manager import (
    INFO_KEYS,
    HiCacheOffloadingManager,
    config_info,
    metric_definitions,
)
from hicache.integrations.vllm.worker import HiCacheOffloadingWorker
from hicache.radix.hints.envelope import ENVELOPE_KEY, capability_line
from transfer_kernels.quant.reference import QUANTIZABLE

log = logging.getLogger("vllm.hicache")  # under vLLM's logger: printed with its own lines
_KV_CACHE_CONFIG: ContextVar[Any] = ContextVar("hicache_kv_cache_config", default=None)
_MODEL_CONFIG: ContextVar[Any] = ContextVar("hicache_model_config", default=None)  # the served model's, a dict
# where vLLM keeps its own window rule (0.33: the offloading config module; 0.32: the scheduler)
_WINDOW_RULE_MODULES = ("vllm.distributed.kv_transfer.kv_connector.v1.offloading.config",
                        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler")


class HiCacheOffloadingConnector(OffloadingConnector):
    """vLLM's ``OffloadingConnector`` that shows the spec vLLM's ``kv_cache_config``
    (device block count, each group's KV cache spec) and model config, that answers
    ``get_num_new_matched_tokens`` with only a host hit that pays (``hicache_load_policy``),
    and returns a request's client-hint tickets in its response
    (``kv_transfer_params: {"hicache": {"hints": [...]}}``: vLLM's own connector returns
    nothing there)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        tokens = _KV_CACHE_CONFIG.set(kv_cache_config), _MODEL_CONFIG.set(_model_dict(vllm_config))
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        finally:
            _KV_CACHE_CONFIG.reset(tokens[0])
            _MODEL_CONFIG.reset(tokens[1])

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """vLLM's answer, less a host hit the load gate finds slower to load than to
        recompute (`hicache.integrations.vllm.gate`): then 0, and vLLM recomputes it."""
        hit, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if not hit:
            return hit, load_async
        keep = self.connector_scheduler.manager.paying_tokens(request.num_tokens, num_computed_tokens, hit)
        return (keep, load_async) if keep else (0, False)

    def request_finished(self, request: Any, *args: Any, **kwargs: Any) -> tuple[bool, dict[str, Any] | None]:
        return self._with_tickets(request, super().request_finished(request, *args, **kwargs))

    def request_finished_all_groups(self, request: Any, *args: Any,
                                    **kwargs: Any) -> tuple[bool, dict[str, Any] | None]:
        """What vLLM's scheduler calls for a connector that supports hybrid models (this one)."""
        return self._with_tickets(request, super().request_finished_all_groups(request, *args, **kwargs))

    def _with_tickets(self, request: Any, result: tuple[bool, dict[str, Any] | None]) -> tuple[bool, dict | None]:
        """vLLM's result, with ``request``'s hint tickets in the params it returns."""
        delay, params = result
        manager = getattr(getattr(self, "connector_scheduler", None), "manager", None)
        if isinstance(manager, HiCacheOffloadingManager):
            tickets = manager.hints.report(request.request_id)
            if tickets:
                params = {**(params or {}), ENVELOPE_KEY: {"hints": tickets}}
        return delay, params


def _model_dict(vllm_config: Any) -> dict | None:
    """The served model's config as a dict (its text config for a multimodal one), or None."""
    model = getattr(vllm_config, "model_config", None)
    hf = getattr(model, "hf_text_config", None) or getattr(model, "hf_config", None)
    return hf.to_dict() if hasattr(hf, "to_dict") else None


def _window_rule():
    """vLLM's ``get_sliding_window_size_in_chunks``, wherever this release keeps it."""
    for name in _WINDOW_RULE_MODULES:
        rule = getattr(importlib.import_module(name), "get_sliding_window_size_in_chunks", None)
        if rule is not None:
            return rule
    raise ImportError(f"get_sliding_window_size_in_chunks: in none of {_WINDOW_RULE_MODULES}")


def group_windows(config: OffloadingConfig, blocks_per_chunk: int,
                  kv_cache_config: Any = None) -> list[int | None]:
    """Per group, the chunks a returning prefix needs at its end (``None``: every chunk).

    vLLM >= 0.33 puts it on each group; on 0.32 it comes from the group's KV cache spec
    through vLLM's own rule, and without ``kv_cache_config`` every group counts as full.
    """
    out: list[int | None] = []
    for group in config.groups:
        if hasattr(group, "sliding_window_size_in_chunks"):
            out.append(group.sliding_window_size_in_chunks)
        elif kv_cache_config is None:
            out.append(None)
        else:
            spec = kv_cache_config.kv_cache_groups[group.group_id].kv_cache_spec
            layer = next(iter(iter_layer_specs(spec)))
            out.append(_window_rule()(layer, group.tokens_per_block * blocks_per_chunk))
    return out


def _layer_specs(kv_group: Any) -> list[Any]:
    """The KV cache spec of every layer of a vLLM KV cache group."""
    per_layer = getattr(kv_group.kv_cache_spec, "kv_cache_specs", None)
    return ([per_layer[n] for n in kv_group.layer_names] if per_layer
            else [kv_group.kv_cache_spec] * len(kv_group.layer_names))


def group_vectors(config: OffloadingConfig, kv_cache_config: Any, host_dtype: str) -> list[Vector | None]:
    """Per group, the bf16/fp16 K/V vectors an int8 host tier quantizes (``None``: exact).

    A group is int8 when every layer's spec has one bf16/fp16 ``dtype`` and ``head_size``
    (attention, sliding window, MLA in bf16); state and fp8 groups stay exact.

    Raises:
        ValueError: ``int8`` without ``kv_cache_config`` or with no such group (names the key).
    """
    if host_dtype == "auto":
        return [None] * len(config.groups)
    if kv_cache_config is None:
        raise ValueError(f"host_dtype: int8 needs each group's dtype and head size from vLLM's kv_cache_config, "
                         f"which only kv_connector {CONNECTOR_NAME!r} (module hicache.integrations.vllm) passes")
    out: list[Vector | None] = []
    for group in config.groups:
        specs = _layer_specs(kv_cache_config.kv_cache_groups[group.group_id])
        kinds = {(getattr(s, "dtype", None), getattr(s, "head_size", None)) for s in specs}
        dtype, size = kinds.pop() if len(kinds) == 1 else (None, None)
        out.append(Vector(dtype, int(size)) if dtype in QUANTIZABLE and size else None)
    if all(v is None for v in out):
        raise ValueError("host_dtype (--hicache-host-dtype): int8 has nothing to quantize here (no KV cache "
                         "group holds bf16/fp16 K/V); drop the key")
    return out


def group_chunk_bytes(config: OffloadingConfig, blocks_per_chunk: int, kv_cache_config: Any = None,
                      vectors: list[Vector | None] | None = None) -> list[int | None]:
    """Per group, host bytes of one chunk (unpadded pages of all its layers, as the
    worker copies them; int8 groups in the host format); ``None`` without ``kv_cache_config``."""
    if kv_cache_config is None:
        return [None] * len(config.groups)
    vectors = vectors or [None] * len(config.groups)
    out = []
    for group, vector in zip(config.groups, vectors):
        specs = _layer_specs(kv_cache_config.kv_cache_groups[group.group_id])
        page = sum(host_block_bytes(getattr(s, "real_page_size_bytes", s.page_size_bytes), vector)
                   for s in specs)
        out.append(page * blocks_per_chunk)
    return out


class HiCacheOffloadingSpec(OffloadingSpec):
    """hicache host pools behind vLLM's offloading connector.

    Args:
        config: vLLM's ``OffloadingConfig`` (groups, bytes per block, extra config).
    Raises:
        ValueError: an unknown or bad key in ``kv_connector_extra_config`` (named), or
            ratio sizing without the device block count.
        HostMemoryError: the host pools would exceed this rank's host budget.
    """

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        return metric_definitions()

    @classmethod
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        """vLLM >= 0.33: the labels of ``vllm:kv_offload_config_info`` the manager fills."""
        return INFO_KEYS

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        self.settings = SpecConfig.from_extra(config.extra_config)
        kv_cache_config = _KV_CACHE_CONFIG.get()
        self.model_config = _MODEL_CONFIG.get()
        self.device_blocks = getattr(kv_cache_config, "num_blocks", None)
        if self.device_blocks is None and self.settings.hicache.hicache_size_gb <= 0:
            raise ValueError(f"hicache_ratio: sizing by ratio needs vLLM's device block count, "
                             f"which only kv_connector {CONNECTOR_NAME!r} (module "
                             "hicache.integrations.vllm) passes; use it, or set hicache_size_gb")
        self.group_index = {g.group_id: i for i, g in enumerate(config.groups)}
        self.vectors = group_vectors(config, kv_cache_config, self.settings.hicache.host_dtype)
        chunk_bytes = group_chunk_bytes(config, self.blocks_per_chunk, kv_cache_config, self.vectors)
        bytes_per_block = max(1, config.worker_kv_bytes_per_block)
        if any(self.vectors):  # int8: size by the host format's bytes
            bytes_per_block = max(1, sum(chunk_bytes) // self.blocks_per_chunk)
        self.num_chunks = self.settings.host_chunks(self.device_blocks or 0, bytes_per_block,
                                                    self.blocks_per_chunk)
        self.layout: HostLayout = plan_groups(
            [g.tokens_per_block * self.blocks_per_chunk for g in config.groups],
            group_windows(config, self.blocks_per_chunk, kv_cache_config), self.num_chunks,
            self.settings.prefix_tokens, chunk_bytes)
        known = [g.host_bytes for g in self.layout.groups]
        requests = ({f"group{i}": b for i, b in enumerate(known)} if None not in known else
                    {"vllm_kv": self.num_chunks * self.blocks_per_chunk * bytes_per_block})
        self.settings.check_budget(requests, config.parallel.world_size)
        self._manager: HiCacheOffloadingManager | None = None
        self._worker: HiCacheOffloadingWorker | None = None

    def _group_of(self, key: bytes) -> int:
        return self.group_index[get_offload_group_idx(key)]

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            index = HostBlockIndex(self.layout.chunks, len(self.config.groups), self._group_of,
                                   self.settings.hicache.eviction_policy)
            info = config_info(self.layout, self.settings.hicache.io_backend)
            hi = self.settings.hicache
            self._manager = HiCacheOffloadingManager(
                index, self.layout, self.kv_events_config.enable_kv_cache_events, info,
                (hi.max_retained_ratio, hi.max_hint_ttl_s))
            self._manager.use_gate(plugin_gate(hi, self.model_config, self.layout, self._manager.pending_load_bytes))
            log.info("hicache host tier: %s", self.layout.describe())
            log.info("hicache %s", capability_line(self._manager.hints.capabilities()))
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            blocks = {int(t.tensor.shape[0]) for t in kv_caches.tensors}
            if self.device_blocks is not None and blocks != {self.device_blocks}:
                raise ValueError(f"kv_caches: tensors have {sorted(blocks)} blocks, vLLM's "
                                 f"kv_cache_config says {self.device_blocks}")
            self._worker = HiCacheOffloadingWorker(
                kv_caches, [g.tokens_per_block for g in self.config.groups], self.layout.chunks,
                self.blocks_per_chunk, self.settings, self.config.parallel.world_size, self.vectors)
        return self._worker
