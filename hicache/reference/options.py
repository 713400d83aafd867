"""`VerifyOptions` (what ``hicache verify-model`` runs) and `verify_config`, the run's
`HiCacheConfig` built in one place. Imports no torch: the CLI's flags take their defaults here."""
from __future__ import annotations

from dataclasses import dataclass

from hicache.config import HiCacheConfig

TOLERANCE = 1e-5  # max |logit difference| (fp32; the paged models match transformers to ~4e-6)
SWA_FULL_TOKENS_RATIO = 1.0  # device swa tokens per anchor token: room for a snapshot per page


@dataclass(frozen=True)
class VerifyOptions:
    """The flags of ``hicache verify-model`` (checked by `hicache.reference.verify.check_options`)."""

    arch: str = "deepseek-v4"  # deepseek-v4 | mha
    layers: int = 4
    conversations: int = 8
    turns: int = 4
    decode_tokens: int = 4  # greedy tokens per request
    seed: int = 0  # weights and workload
    hicache_ratio: float = 2.0
    device_tokens: int = 0  # 0: one page more than the longest request can take
    storage_backend: str = "file"  # none | file
    storage_dir: str = ""  # "": a temporary directory, removed at the end
    device: str = "cpu"
    io_backend: str = "auto"
    write_policy: str = "write_through"
    mem_layout: str = "page_first"
    fault: str | None = None  # a data pool whose loads are corrupted (negative control)
    kv_format: str = "fp32"  # deepseek-v4 pool rows: fp32 | fp8_ds_mla


def verify_config(opts: VerifyOptions, model_id: str) -> HiCacheConfig:
    """The run's `HiCacheConfig`, the one place it is built.

    Args:
        model_id: the reference model's identity (arch, dims, seed: `Dsv4Config.identity`,
            `MhaConfig.identity`); the stack's model name carries it into the storage
            namespaces.
    Raises:
        ValueError: a flag out of range (naming it).
    """
    # The stack's name is ``model_id`` too; the config's storage identity names it as well.
    return HiCacheConfig(
        enable_hierarchical_cache=True, hicache_ratio=opts.hicache_ratio, write_policy=opts.write_policy,
        io_backend=opts.io_backend, mem_layout=opts.mem_layout, swa_full_tokens_ratio=SWA_FULL_TOKENS_RATIO,
        host_headroom_gb=0.0,  # the pools are a few MB: no host headroom to keep
        storage_backend=opts.storage_backend, storage_dir=opts.storage_dir,
        storage_model_id=model_id,
        storage_prefetch_policy="wait_complete")  # every storage hit read: deterministic tiers
