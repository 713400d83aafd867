"""`HiCacheOffloadingSpec` (API) and `HiCacheOffloadingConnector`: hicache as vLLM's host tier.

vLLM (pinned: 0.32.0; its offloading API is experimental) builds one spec per process
from ``kv_connector_extra_config``: the scheduler asks it for a manager, each worker for
a worker. Both sides must agree on the host capacity, which ``--hicache-ratio`` defines
against vLLM's device block count. vLLM's ``OffloadingConfig`` does not carry that count,
so ``HiCacheOffloadingConnector`` (vLLM's ``OffloadingConnector`` and nothing more) hands
``kv_cache_config.num_blocks`` to the spec it creates; with vLLM's plain connector only
``hicache_size_gb`` sizing works, and the ratio is refused at start-up with that advice.
Every setting is validated here, at start-up, on both sides, before memory is touched.
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
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
from hicache.integrations.vllm.index import HostBlockIndex
from hicache.integrations.vllm.manager import HiCacheOffloadingManager, metric_definitions
from hicache.integrations.vllm.worker import HiCacheOffloadingWorker

_DEVICE_BLOCKS: ContextVar[int | None] = ContextVar("hicache_device_blocks", default=None)


class HiCacheOffloadingConnector(OffloadingConnector):
    """vLLM's ``OffloadingConnector`` that tells the spec how many device blocks vLLM has."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        token = _DEVICE_BLOCKS.set(getattr(kv_cache_config, "num_blocks", None))
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        finally:
            _DEVICE_BLOCKS.reset(token)


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

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        self.settings = SpecConfig.from_extra(config.extra_config)
        self.device_blocks = _DEVICE_BLOCKS.get()
        if self.device_blocks is None and self.settings.hicache.hicache_size_gb <= 0:
            raise ValueError(f"hicache_ratio: sizing by ratio needs vLLM's device block count, "
                             f"which only kv_connector {CONNECTOR_NAME!r} (module "
                             "hicache.integrations.vllm) passes; use it, or set hicache_size_gb")
        self.group_index = {g.group_id: i for i, g in enumerate(config.groups)}
        bytes_per_block = max(1, config.worker_kv_bytes_per_block)
        self.num_chunks = self.settings.host_chunks(self.device_blocks or 0, bytes_per_block,
                                                    self.blocks_per_chunk)
        host_bytes = self.num_chunks * self.blocks_per_chunk * bytes_per_block
        self.settings.check_budget({"vllm_kv": host_bytes}, config.parallel.world_size)
        self._manager: HiCacheOffloadingManager | None = None
        self._worker: HiCacheOffloadingWorker | None = None

    def _group_of(self, key: bytes) -> int:
        return self.group_index[get_offload_group_idx(key)]

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            index = HostBlockIndex(self.num_chunks, len(self.config.groups), self._group_of)
            per_chunk = [g.tokens_per_block * self.blocks_per_chunk for g in self.config.groups]
            self._manager = HiCacheOffloadingManager(
                index, per_chunk, self.kv_events_config.enable_kv_cache_events)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            blocks = {int(t.tensor.shape[0]) for t in kv_caches.tensors}
            if self.device_blocks is not None and blocks != {self.device_blocks}:
                raise ValueError(f"kv_caches: tensors have {sorted(blocks)} blocks, vLLM's "
                                 f"kv_cache_config says {self.device_blocks}")
            self._worker = HiCacheOffloadingWorker(
                kv_caches, [g.tokens_per_block for g in self.config.groups], self.num_chunks,
                self.blocks_per_chunk, self.settings, self.config.parallel.world_size)
        return self._worker
