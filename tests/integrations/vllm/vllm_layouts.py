"""vLLM-side helpers for the adapter tests (imported only inside the vLLM environment).

Builds what vLLM hands the plugin from vLLM's own classes: an ``OffloadingConfig`` and a
``KVCacheConfig`` of KV cache groups (full attention, sliding window, DeepSeek-V4's
compressed and state groups), canonical KV tensors of random bytes, and ``Scheduler``,
the part of vLLM's offloading scheduler that turns a request's chunks into store and
load specs (keys per group in chunk order, token positions, block ids per group).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from vllm.v1.kv_offload import base as vllm_base
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

from hicache.integrations.vllm import HiCacheOffloadingSpec
from hicache.integrations.vllm import spec as spec_module
from hicache.integrations.vllm.manager import HostChunksSpec

# vLLM >= 0.33 tells the spec each group's window; 0.32 leaves it to the KV cache specs
HAS_WINDOW_FIELD = "sliding_window_size_in_chunks" in {f.name for f in dataclasses.fields(OffloadingGroupConfig)}


@dataclass(frozen=True)
class Group:
    """One KV cache group: its layers' names and vLLM spec, and its window in chunks."""

    layers: tuple[str, ...]
    spec: object
    window: int | None = None

    @property
    def tokens_per_block(self) -> int:
        return self.spec.block_size

    def page(self, layer: str) -> int:
        per_layer = getattr(self.spec, "kv_cache_specs", None)
        return (per_layer[layer] if per_layer else self.spec).real_page_size_bytes


def full(layers: Sequence[str], block: int = 16, head: int = 4) -> Group:
    return Group(tuple(layers), FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=head,
                                                  dtype=torch.bfloat16))


def sliding(layers: Sequence[str], window_tokens: int, block: int = 16, head: int = 4) -> Group:
    spec = SlidingWindowSpec(block_size=block, num_kv_heads=1, head_size=head, dtype=torch.bfloat16,
                             sliding_window=window_tokens)
    return Group(tuple(layers), spec, -(-window_tokens // block))


FLASH_LAYERS = {"swa_a": 22, "swa_b": 21, "c4_kv": 21, "c128_kv": 20, "c4_idx": 21,
                "c4_state": 21, "c4_idx_state": 21, "c128_state": 20}


def deepseek_v4(layers: dict[str, int] | None = None) -> list[Group]:
    """DeepSeek-V4's 5 groups as vLLM builds them (rebuilt from vLLM's sources, not
    captured from a live run): two SWA groups (64-token blocks, window 128, 584 B fp8
    entries), compressed KV C4 + C128 + C4 indexer (256-token blocks), C4 main + indexer
    compressor states (fp32, window 8) and C128 compressor states (window 128). One layer
    of each kind unless ``layers`` gives counts (``FLASH_LAYERS``: DeepSeek-V4 Flash)."""
    def swa_mla(block, window, head, dtype, entry=None):
        return SlidingWindowMLASpec(block_size=block, num_kv_heads=1, head_size=head, dtype=dtype,
                                    sliding_window=window, state_content_bytes=entry,
                                    model_version="deepseek_v4")

    def mla(tokens_per_state, entry):
        return MLAAttentionSpec(block_size=256, num_kv_heads=1, head_size=512, dtype=torch.uint8,
                                state_content_bytes=entry, tokens_per_state=tokens_per_state,
                                model_version="deepseek_v4")

    count = layers or {}
    names = lambda prefix: tuple(f"{prefix}{i}" for i in range(count.get(prefix, 1)))  # noqa: E731
    c4, c128, idx = names("c4_kv"), names("c128_kv"), names("c4_idx")
    compressed = {**{n: mla(4, 584) for n in c4}, **{n: mla(128, 584) for n in c128},
                  **{n: mla(4, 132) for n in idx}}
    main, idx_state = names("c4_state"), names("c4_idx_state") if layers else ()
    states = {**{n: swa_mla(4, 8, 2 * 2 * 512, torch.float32) for n in main},
              **{n: swa_mla(4, 8, 2 * 2 * 128, torch.float32) for n in idx_state}}
    c4_states = (UniformTypeKVCacheSpecs(block_size=4, kv_cache_specs=states) if idx_state
                 else states[main[0]])
    return [Group(names("swa_a"), swa_mla(64, 128, 512, torch.uint8, 584), 2),
            Group(names("swa_b"), swa_mla(64, 128, 512, torch.uint8, 584), 2),
            Group(c4 + c128 + idx, UniformTypeKVCacheSpecs(block_size=256, kv_cache_specs=compressed)),
            Group(main + idx_state, c4_states, 2),
            Group(names("c128_state"), swa_mla(8, 128, 2 * 512, torch.float32), 16)]


def offloading_config(groups: Sequence[Group], extra: dict, blocks_per_chunk: int = 1) -> OffloadingConfig:
    parallel = OffloadingParallelConfig(
        rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
        data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
        is_parallelism_agnostic=True)
    window = (lambda g: {"sliding_window_size_in_chunks": g.window}) if HAS_WINDOW_FIELD else (lambda g: {})
    configs = tuple(OffloadingGroupConfig(g.tokens_per_block, g.layers, i, **window(g))
                    for i, g in enumerate(groups))
    per_block = sum(g.page(n) for g in groups for n in g.layers)
    return OffloadingConfig(
        groups=configs, worker_kv_bytes_per_block=per_block, enable_kv_cache_events=True,
        extra_config={"spec_name": "HiCacheOffloadingSpec",
                      "spec_module_path": "hicache.integrations.vllm", "blocks_per_chunk": blocks_per_chunk,
                      **extra},
        engine_id="test", model=OffloadingModelConfig("m", "bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=min(g.tokens_per_block for g in groups),
                                    blocks_per_chunk=blocks_per_chunk), parallel=parallel)


def kv_cache_config(groups: Sequence[Group], num_blocks: int) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(list(g.layers), g.spec) for g in groups])


def make_spec(groups: Sequence[Group], extra: dict, num_blocks: int | None,
              blocks_per_chunk: int = 1) -> HiCacheOffloadingSpec:
    """The spec as ``HiCacheOffloadingConnector`` creates it (``num_blocks=None``: vLLM's
    plain connector, which shows the spec no ``kv_cache_config``)."""
    kv = None if num_blocks is None else kv_cache_config(groups, num_blocks)
    token = spec_module._KV_CACHE_CONFIG.set(kv)
    try:
        return HiCacheOffloadingSpec(offloading_config(groups, extra, blocks_per_chunk))
    finally:
        spec_module._KV_CACHE_CONFIG.reset(token)


def canonical_caches(gen: torch.Generator, groups: Sequence[Group], num_blocks: int, pad: int = 32):
    """One random int8 ``[num_blocks, page + pad]`` tensor per layer, and vLLM's canonical
    view of them (padding is not part of a page). Returns (caches, {layer: tensor})."""
    tensors, refs, by_layer = [], [], {}
    for g in groups:
        group_refs = []
        for name in g.layers:
            page = g.page(name)
            t = torch.randint(-128, 128, (num_blocks, page + pad), generator=gen, dtype=torch.int8)
            tensors.append(vllm_base.CanonicalKVCacheTensor(t, page + pad))
            group_refs.append(vllm_base.CanonicalKVCacheRef(len(tensors) - 1, page))
            by_layer[name] = t
        refs.append(group_refs)
    return vllm_base.CanonicalKVCaches(tensors, refs), by_layer


class Scheduler:
    """Stores and loads one request's chunks the way vLLM's offloading scheduler does."""

    def __init__(self, spec: HiCacheOffloadingSpec, groups: Sequence[Group]) -> None:
        self.spec, self.groups = spec, groups
        self.mgr, self.jobs = spec.get_manager(), 0

    def keys(self, req: str, ctx, first: Sequence[int], count: Sequence[int]) -> list[list]:
        """Per group, keys of chunks ``first[g] .. first[g] + count[g] - 1`` of ``req``,
        with their token end positions recorded in ``ctx``."""
        out = []
        for g, (group, a, n) in enumerate(zip(self.groups, first, count)):
            tpc = group.tokens_per_block * self.spec.blocks_per_chunk
            keys = [vllm_base.make_offload_key(f"{req}:{c}".encode(), g) for c in range(a, a + n)]
            for c, key in zip(range(a, a + n), keys):
                ctx.set_offload_key_position(key, (c + 1) * tpc)
            out.append(keys)
        return out

    def store(self, worker, ctx, keys: list[list], blocks: list[list[int]]) -> set:
        """``prepare_store`` of every group's keys, then the worker's copy of those chosen;
        returns the keys stored (``blocks[g]``: device block of each key, bpc = 1)."""
        out = self.mgr.prepare_store([k for ks in keys for k in ks], ctx)
        chosen = set(out.keys_to_store)
        src, sizes, firsts = [], [], []
        for ks, bs in zip(keys, blocks):
            picked = [(i, b) for i, (k, b) in enumerate(zip(ks, bs)) if k in chosen]
            src += [b for _, b in picked]
            sizes.append(len(picked))
            firsts.append(picked[0][0] if picked else 0)
        self.jobs += 1
        assert worker.submit_store(self.jobs, vllm_base.GPULoadStoreSpec(src, sizes, firsts),
                                   out.store_spec)
        assert all(r.success for r in worker.get_finished())
        self.mgr.complete_store(out.keys_to_store, ctx)
        return chosen

    def load(self, worker, ctx, keys: list[list], blocks: list[list[int]], expedited: bool = False) -> None:
        """``prepare_load`` of every group's keys (group order), copied into ``blocks``."""
        flat = [k for ks in keys for k in ks]
        spec = self.mgr.prepare_load(flat, ctx)
        assert isinstance(spec, HostChunksSpec)
        dst = vllm_base.GPULoadStoreSpec([b for bs in blocks for b in bs], [len(ks) for ks in keys],
                                         [0] * len(keys))
        self.jobs += 1
        kwargs = {"expedited": True} if expedited else {}
        assert worker.submit_load(self.jobs, spec, dst, **kwargs)
        assert all(r.success for r in worker.get_finished())
        self.mgr.complete_load(flat, ctx)
