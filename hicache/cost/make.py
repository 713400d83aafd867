"""The cost model of a named model preset on a device profile, in one call (`make_cost`)."""
from __future__ import annotations

from hicache.cost.decide import LoadCost
from hicache.cost.footprint import Footprint
from hicache.cost.prefill import PrefillModel
from hicache.cost.profile import DeviceProfile
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
