"""`HiCacheOffloadingWorker`: vLLM's worker-side ``OffloadingWorker`` over `BlockMover`.

vLLM hands over ``CanonicalKVCaches``: unique ``[num_blocks, page_bytes]`` int8 tensors
and, per KV cache group, one reference (tensor index, unpadded page bytes) per layer.
Each reference becomes one layer of the group's device ``RowTable`` (a uint8 view of the
first ``page_bytes`` of every block: padding is never copied).
"""
from __future__ import annotations

import logging
from typing import Sequence

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

from hicache.integrations.vllm.config import SpecConfig
from hicache.integrations.vllm.host_codec import Vector
from hicache.integrations.vllm.manager import HostChunksSpec
from hicache.integrations.vllm.mover import BlockMover

log = logging.getLogger("vllm.hicache")  # under vLLM's logger: printed with its own lines


def group_views(kv_caches: CanonicalKVCaches) -> list[list[torch.Tensor]]:
    """Per group, per layer: a uint8 ``[num_blocks, page_bytes]`` view of vLLM's cache."""
    out = []
    for refs in kv_caches.group_data_refs:
        views = []
        for ref in refs:
            tensor = kv_caches.tensors[ref.tensor_idx].tensor
            views.append(tensor.view(torch.uint8)[:, :ref.page_size_bytes])
        out.append(views)
    return out


class HiCacheOffloadingWorker(OffloadingWorker):
    """The worker side of the plugin (constructed by ``HiCacheOffloadingSpec.get_worker``).

    Args:
        kv_caches: vLLM's canonical KV cache tensors and per-group references.
        tokens_per_block: per group.
        num_chunks: host chunks, per group or one for all (the scheduler's index uses the
            same numbers).
        blocks_per_chunk: vLLM blocks per host chunk.
        config: the plugin settings.
        world_size: vLLM workers sharing the host (budget split).
        vectors: per group, the K/V vectors an int8 host tier quantizes (``None``: exact).
    Raises:
        ValueError: views that do not fit (names group and layer); HostMemoryError: over
            the host budget.
    """

    def __init__(self, kv_caches: CanonicalKVCaches, tokens_per_block: Sequence[int],
                 num_chunks: int | Sequence[int], blocks_per_chunk: int, config: SpecConfig,
                 world_size: int = 1, vectors: Sequence[Vector | None] | None = None) -> None:
        self.mover = BlockMover(group_views(kv_caches), tokens_per_block, num_chunks,
                                blocks_per_chunk, config, world_size, vectors=vectors)
        log.info("hicache host pools: %s B per group (%s chunks)%s",
                 self.mover.group_host_bytes(), self.mover.chunks_per_group,
                 "" if not vectors or not any(vectors) else
                 f"; int8 host blocks per group (vectors, None = exact): {list(vectors)}")
        if len(kv_caches.tensors) == 1 and len(kv_caches.group_data_refs) > 1:
            log.warning("hicache: vLLM packs every group's layers into one block (e.g. DeepSeek-V4): "
                        "each group's host chunk holds the whole packed block, not its own layers")

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        """Device blocks -> host chunks, asynchronously; failures come back from get_finished."""
        _check(src_spec, dst_spec, "src_spec", "dst_spec")
        self.mover.submit(job_id, "store", src_spec.block_ids, src_spec.group_sizes,
                          src_spec.block_indices, dst_spec.block_ids)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        """Host chunks -> device blocks, asynchronously; failures come back from get_finished.

        ``expedited`` (vLLM >= 0.33, loads it waits on within the step): on its own stream."""
        _check(dst_spec, src_spec, "dst_spec", "src_spec")
        self.mover.submit(job_id, "load", dst_spec.block_ids, dst_spec.group_sizes,
                          dst_spec.block_indices, src_spec.block_ids, expedited=expedited)
        return True

    def get_finished(self) -> list[TransferResult]:
        return [TransferResult(job_id=f.job_id, success=f.ok, transfer_size=f.nbytes,
                               transfer_time=f.seconds) for f in self.mover.finished()]

    def wait(self, job_ids: set[int]) -> None:
        self.mover.wait(job_ids)

    def shutdown(self) -> None:
        self.mover.close()


def _check(device: object, host: object, device_arg: str, host_arg: str) -> None:
    if not isinstance(device, GPULoadStoreSpec):
        raise TypeError(f"{device_arg}: must be a GPULoadStoreSpec, got {type(device).__name__}")
    if not isinstance(host, HostChunksSpec):
        raise TypeError(f"{host_arg}: must be a HostChunksSpec, got {type(host).__name__}")
