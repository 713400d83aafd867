"""`VerifyOptions` (what ``hicache verify-model`` runs) and `verify_config`, the run's
`HiCacheConfig` built in one place. Imports no torch: the CLI's flags take their defaults here."""
from __future__ import annotations

from dataclasses import dataclass

from hicache.config import DEFAULT_EVICTION_POLICY, HOST_DTYPES, HiCacheConfig

TOLERANCE = 1e-5  # max |logit difference| (fp32; the paged models match transformers to ~4e-6)
# A bf16 kv pool (--kv-dtype bfloat16; the default with --hicache-host-dtype int8) is judged as
# distributions (`hicache.reference.agreement`): over requests restored from host or storage,
# mean KL(recompute || served) per position <= MEAN_KL_TOLERANCE (the bound SmolLM2-135M's int8
# host tier is held to by bench/host_dtype_accuracy.py) and top-1 agreement >= TOP1_TOLERANCE;
# every request's max KL <= MAX_KL_TOLERANCE. Measured on the MHA toy (seeds 0-3, int8 host):
# mean ~1.5e-6, max ~1e-5, top-1 >= 0.996; the --fault negative control: mean ~0.1, top-1 ~0.43.
MEAN_KL_TOLERANCE = 5e-4
MAX_KL_TOLERANCE = 1e-2
TOP1_TOLERANCE = 0.99
KV_DTYPES = ("auto", "float32", "bfloat16")  # --kv-dtype (auto: bfloat16 with int8 host, else float32)
# Upper bounds of the size flags (`check_sizes`, before anything is built): past them a run is
# a typo, not a deeper check. The longest run they allow still takes hours on a CPU; a long
# run prints its progress and ETA (`hicache.reference.progress`).
SIZE_LIMITS = {  # flag: (field, lowest, highest)
    "--layers": ("layers", 1, 64),  # DeepSeek-V4-Pro has 61 layers
    "--conversations": ("conversations", 1, 1024),
    "--turns": ("turns", 1, 64),
    "--decode-tokens": ("decode_tokens", 1, 1024),
    "--seed": ("seed", 0, 2**63 - 1),  # torch's generator seed is an int64
    "--device-tokens": ("device_tokens", 0, 1 << 20),  # 0: the default; the toy's whole workload fits in far less
}
SWA_FULL_TOKENS_RATIO = 1.0  # device swa tokens per anchor token: room for a snapshot per page
LINEAR_ARCH_NAMES = ("qwen3.5", "nemotron-h")  # = hicache.reference.config.LINEAR_ARCHS (torch-free here)
WRONG_BOUNDARY = "wrong-boundary"  # --fault: resume from another boundary's snapshot (hybrid stacks)
TOY_INTERVAL_PAGES = 2  # the linear toys' default snapshot interval: a boundary without one between two with


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
    eviction_policy: str = DEFAULT_EVICTION_POLICY  # the tree's device and host eviction order (hicache.config.EVICTION_POLICIES)
    mem_layout: str = "page_first"
    fault: str | None = None  # a data pool whose loads are corrupted, or WRONG_BOUNDARY (negative controls)
    state_interval: int = 0  # tokens between snapshots; 0: 2 pages (linear toys), every page (deepseek-v4)
    kv_format: str = "fp32"  # deepseek-v4 pool rows: fp32 | fp8_ds_mla
    host_dtype: str = "auto"  # auto | int8: the host tier's format of the kv pool
    kv_dtype: str = "auto"  # the MHA toy's kv pool: auto | float32 | bfloat16 (see pool_kv_dtype)


def check_sizes(opts: VerifyOptions) -> None:
    """Every size flag within `SIZE_LIMITS` (``--device-tokens``' lower bound: `verify.check_options`).

    Raises:
        ValueError: naming the flag, its range and the value given.
    """
    for flag, (field, low, high) in SIZE_LIMITS.items():
        value = getattr(opts, field)
        if not low <= value <= high:
            raise ValueError(f"{flag}: must be in [{low:,}, {high:,}], got {value:,}")


def pool_kv_dtype(opts: VerifyOptions) -> str:
    """The MHA toy's kv pool dtype: ``--kv-dtype``, or by default bfloat16 with an int8 host
    tier (it quantizes bf16/fp16 KV) and float32 otherwise.

    Raises:
        ValueError: an unknown ``--hicache-host-dtype`` / ``--kv-dtype``, or float32 KV with int8.
    """
    if opts.host_dtype not in HOST_DTYPES:
        raise ValueError(f"--hicache-host-dtype: must be one of {', '.join(HOST_DTYPES)}, got {opts.host_dtype!r}")
    if opts.kv_dtype not in KV_DTYPES:
        raise ValueError(f"--kv-dtype: must be one of {', '.join(KV_DTYPES)}, got {opts.kv_dtype!r}")
    if opts.host_dtype == "int8" and opts.arch != "mha":  # name the flag given, not the derived --kv-dtype
        pools = "float64" if opts.arch in LINEAR_ARCH_NAMES else "float32 (or --kv-format fp8_ds_mla rows)"
        raise ValueError(f"--hicache-host-dtype: int8 quantizes bf16/fp16 KV; the {opts.arch} toy's pools are "
                         f"{pools}: use --arch mha (a bfloat16 kv pool)")
    if opts.kv_dtype == "auto":
        return "bfloat16" if opts.host_dtype == "int8" else "float32"
    if opts.kv_dtype == "float32" and opts.host_dtype == "int8":
        raise ValueError("--kv-dtype: the int8 host tier quantizes bf16/fp16 KV; use bfloat16 "
                         "(the default with --hicache-host-dtype int8)")
    return opts.kv_dtype


def verify_config(opts: VerifyOptions, model_id: str, state_interval: int = 0) -> HiCacheConfig:
    """The run's `HiCacheConfig`, the one place it is built.

    Args:
        model_id: the reference model's identity (arch, dims, seed: `Dsv4Config.identity`,
            `MhaConfig.identity`); the stack's model name carries it into the storage
            namespaces.
        state_interval: tokens between snapshots (sizes a recurrent state root; 0: the
            config's default).
    Raises:
        ValueError: a flag out of range (naming it).
    """
    # The stack's name is ``model_id`` too; the config's storage identity names it as well.
    return HiCacheConfig(
        enable_hierarchical_cache=True, hicache_ratio=opts.hicache_ratio, write_policy=opts.write_policy,
        eviction_policy=opts.eviction_policy, io_backend=opts.io_backend, mem_layout=opts.mem_layout, swa_full_tokens_ratio=SWA_FULL_TOKENS_RATIO,
        host_headroom_gb=0.0,  # the pools are a few MB: no host headroom to keep
        storage_backend=opts.storage_backend, storage_dir=opts.storage_dir,
        storage_model_id=model_id,
        storage_prefetch_policy="wait_complete",  # every storage hit read: deterministic tiers
        host_dtype=opts.host_dtype, state_interval=state_interval)
