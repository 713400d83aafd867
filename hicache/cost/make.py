"""The cost model of a named model preset on a device profile, in one call (`make_cost`)."""
from __future__ import annotations

from typing import Any

from hicache.config import HiCacheConfig
from hicache.cost.decide import LoadCost, LoadGate
from hicache.cost.footprint import Footprint
from hicache.cost.links import LiveBacklog
from hicache.cost.prefill import PrefillModel
from hicache.cost.profile import DeviceProfile, load_profile
from hicache.models.presets import PRESETS, preset
from hicache.models.shape import ModelShape


def preset_shape(model: str, flag: str = "--model") -> ModelShape:
    """The whole model's shape of the preset ``model``.

    Raises:
        ValueError: an unknown preset, or one that describes no shape (``flag`` named).
    """
    got = PRESETS.get(model)
    if got is None:
        raise ValueError(f"{flag}: unknown preset {model!r}; known presets: {', '.join(sorted(PRESETS))}")
    if got.shape is None:
        raise ValueError(f"{flag} {model}: the preset describes no compute shape (hicache.models.shape), so "
                         "its time to first token cannot be estimated")
    return got.shape


def make_cost(profile: DeviceProfile, model: str, host_dtype: str = "auto", storage_backend: str = "none") -> LoadCost:
    """The `LoadCost` of the whole preset ``model`` (every layer, whatever a replay cuts it to)
    on ``profile``, its host format ``host_dtype``, the profile's figures of
    ``storage_backend`` (``"none"``: no storage tier).

    Raises:
        ValueError: see `preset_shape`, or a storage backend the profile has no figures for.
    """
    shape = preset_shape(model)
    footprint = Footprint.of(preset(model), host_dtype)
    store = None if storage_backend == "none" else profile.store(storage_backend)
    return LoadCost(PrefillModel(shape, profile.prefill), footprint, profile.h2d, store,
                    hybrid=footprint.snapshot_bytes > 0)


def live_gate(config: HiCacheConfig, stack: Any, controller: Any, store: Any = None) -> LoadGate | None:
    """The load gate a server's tree consults (``config.load_policy`` ``cost``): the preset
    ``stack.model``'s cost on ``config.device_profile``, the controller's and ``store``'s
    queued bytes as the links' backlog (`LiveBacklog`). None under ``always``, or for a
    stack that is no preset with a shape (nothing to weigh recomputing with).

    Raises:
        ValueError: an unreadable ``device_profile`` (the flag named), or a storage backend
            the profile has no figures for.
    """
    got = PRESETS.get(getattr(stack, "model", ""))
    if config.load_policy != "cost" or got is None or got.shape is None:
        return None
    profile = load_profile(config.device_profile, "--hicache-device-profile")
    backend = config.storage_backend if store is not None else "none"
    cost = make_cost(profile, stack.model, config.host_dtype, backend)
    return LoadGate(cost, stack.page_size, LiveBacklog(controller, store, profile.h2d, cost.store))
