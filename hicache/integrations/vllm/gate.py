"""The load-or-recompute gate of the vLLM plugin (``hicache_load_policy``), vLLM-free.

vLLM asks the connector how many tokens past its device prefix it can load
(``get_num_new_matched_tokens``); under ``cost`` the plugin answers with the host hit only
when loading it is estimated to beat recomputing it on ``hicache_device_profile``
(`hicache.cost.LoadGate`), else 0 (vLLM recomputes the prefix). vLLM checks a hit as a
whole (its lookup verified each group's chunks, sliding windows at the hit's end), so the
plugin keeps all of it or none: the gate's cuts are the device prefix and the whole hit.

    what a load moves        full-attention groups: the hit's tokens x bytes per token;
                             windowed groups: their window chunks at the end (per load)
    what waits before it     the loads already handed to vLLM and not completed
    what recomputing costs   the model's prefill (`hicache.models.shape.shape_from_hf` of
                             vLLM's model config) on the profile

A model config the shape cannot describe, or host bytes unknown on this side, leave the
gate off (``always``) with one log line saying why.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from hicache.config import HiCacheConfig
from hicache.cost import Footprint, LoadCost, LoadGate, PrefillModel, load_profile
from hicache.integrations.vllm.groups import HostLayout
from hicache.models.shape import shape_from_hf

log = logging.getLogger("vllm.hicache")


def layout_footprint(layout: HostLayout) -> Footprint | None:
    """Bytes a load moves (module docstring), or None where a group's bytes are unknown."""
    token_bytes, per_load = 0.0, 0
    for g in layout.groups:
        if g.bytes_per_chunk is None:
            return None
        if g.window is None:
            token_bytes += g.bytes_per_chunk / g.tokens_per_chunk
        else:
            per_load += (g.window + 1) * g.bytes_per_chunk
    return Footprint(token_bytes, per_load)


def plugin_gate(config: HiCacheConfig, model_config: Mapping[str, Any] | None, layout: HostLayout,
                pending_bytes: Callable[[], float]) -> LoadGate | None:
    """The gate of ``config.load_policy`` (None: ``always``, or ``cost`` it cannot weigh).

    Args:
        config: the plugin's settings (``load_policy``, ``device_profile``).
        model_config: vLLM's model config as a dict (its ``hf_config``), or None.
        layout: the host layout (bytes per chunk of every group).
        pending_bytes: bytes of the loads handed out and not completed (the H2D backlog).
    Raises:
        ValueError: an unreadable ``device_profile`` (named): a setting, refused at start-up.
    """
    if config.load_policy != "cost":
        return None
    profile = load_profile(config.device_profile, "hicache_device_profile (--hicache-device-profile)")
    footprint = layout_footprint(layout)
    try:
        shape = shape_from_hf(model_config or {}, "the served model")
    except ValueError as exc:
        log.warning("hicache: load policy cost is off (every host hit is loaded): %s", exc)
        return None
    if footprint is None:
        log.warning("hicache: load policy cost is off (every host hit is loaded): host bytes per token unknown "
                    "on the scheduler side")
        return None
    cost = LoadCost(PrefillModel(shape, profile.prefill), footprint, profile.h2d, None,
                    hybrid=footprint.snapshot_bytes > 0)
    log.info("hicache: load policy cost on %s: %.0f B per token, %d B per load", profile.name,
             footprint.token_bytes, footprint.snapshot_bytes)
    h2d = profile.h2d.gbps * 1e9
    return LoadGate(cost, 1, lambda link: pending_bytes() / h2d if link == "h2d" else 0.0)


def paying_hit(gate: LoadGate, prompt: int, computed: int, hit: int) -> int:
    """``hit`` when loading it beats recomputing it, else 0 (all or none: module docstring)."""
    full = computed + hit
    return hit if gate.end(prompt, computed, full, None, [full]) == full else 0
