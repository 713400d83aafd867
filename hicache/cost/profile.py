"""`DeviceProfile`: what one device's links, stores and prefill cost, read from a small JSON.

A profile is the input of every time estimate (`hicache.cost`). The shipped ones live in
``hicache/cost/profiles/`` (`PROFILE_NAMES`: ``h100`` from this project's measurements,
``h200`` and ``b200`` from public specifications, marked unmeasured); ``bench/load_batch.py
--calibrate``, ``bench/storage.py`` and ``scripts/gpu_check.sh quick`` write one of the
machine they run on. Every section says where its figures come from (``source``)::

    {"format": "hicache-device-profile", "version": 1, "name": "h100", "device": "...",
     "date": "2026-11-25", "measured": true,
     "h2d": {"gbps": 44.0, "enqueue_s": 0.0007, "first_byte_s": 0.00011, "source": "..."},
     "d2h": {...},
     "storage": {"file": {"read_gbps": ..., "write_gbps": ..., "read_latency_s": ...,
                          "write_latency_s": ..., "measured": false, "source": "..."}, ...},
     "prefill": {"bf16_tflops": ..., "fp8_tflops": ..., "attention_tflops": ..., "hbm_gbps": ...,
                 "fixed_s": ..., "measured": false, "source": "..."}}

GB/s are 1e9 bytes per second; a link moves ``n`` bytes in ``enqueue_s + first_byte_s +
n / gbps``. A file is read with a bound (`MAX_PROFILE_BYTES`); an unknown or missing key, a
wrong type or a value out of range is a ``ValueError`` naming the file and the key.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from bounded_input import STALL_S, Deadline, open_source, parse_json, read_capped
from hicache.fields import checked_value, field_kinds

FORMAT, VERSION = "hicache-device-profile", 1
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
PROFILE_NAMES = ("h100", "h200", "b200")
DEFAULT_PROFILE = "h100"
MAX_PROFILE_BYTES = 1 << 16  # a profile is ~2 KB


def _checked(obj: Any, where: str) -> None:
    """Type-check and convert every field of a frozen section; rates > 0, times >= 0."""
    for name, kind in field_kinds(type(obj)).items():
        value = checked_value(f"{where}.{name}", kind, getattr(obj, name))
        object.__setattr__(obj, name, value)
        if isinstance(value, float) and (value < 0 or (value == 0 and not name.endswith("_s"))):
            raise ValueError(f"{where}.{name}: must be {'>= 0' if name.endswith('_s') else '> 0'}, got {value}")


@dataclass(frozen=True)
class _Section:
    """What every section carries: whether its figures were measured, and where they come from."""

    measured: bool = field(default=False, kw_only=True)
    source: str = field(default="", kw_only=True)
    where: InitVar[str] = field(default="", kw_only=True)  # how errors name the section (not a field)

    def __post_init__(self, where: str) -> None:
        _checked(self, where or type(self).__name__.lower())


@dataclass(frozen=True)
class Link(_Section):
    """A host <-> device link as one load or backup sees it."""

    gbps: float  # sustained GB/s of a large transfer
    enqueue_s: float  # host time to issue one transfer (planning, launches)
    first_byte_s: float  # from issue to the first byte moving

    def seconds(self, nbytes: float) -> float:
        """Time to move ``nbytes`` as one transfer, on an idle link."""
        return self.enqueue_s + self.first_byte_s + nbytes / (self.gbps * 1e9)


@dataclass(frozen=True)
class Store(_Section):
    """A storage backend below the host, as a prefetch (read) and a backup (write) see it."""

    read_gbps: float
    write_gbps: float
    read_latency_s: float
    write_latency_s: float


@dataclass(frozen=True)
class PrefillRates(_Section):
    """What the device achieves on a prefill: GEMM TFLOPS per weight dtype, attention TFLOPS,
    HBM GB/s (a forward reads every active weight at least once) and a fixed cost per
    forward (scheduling, sampling, launches)."""

    bf16_tflops: float
    fp8_tflops: float
    attention_tflops: float
    hbm_gbps: float
    fixed_s: float


@dataclass(frozen=True)
class DeviceProfile:
    """One device: its links, its stores by backend name, its prefill rates.

    Attributes:
        name: the profile's name (``h100``, or what a bench run called it).
        device: the device in words. date: when its figures were taken.
        measured: whether the links' figures were measured on this device.
        storage: per storage backend (``file``, ``mooncake``...) its `Store`.
    """

    name: str
    device: str
    date: str
    measured: bool
    h2d: Link
    d2h: Link
    storage: Mapping[str, Store]
    prefill: PrefillRates

    def store(self, backend: str) -> Store:
        """The `Store` of ``backend``.

        Raises:
            ValueError: the profile has none for it (the ones it has named).
        """
        if backend not in self.storage:
            raise ValueError(f"device profile {self.name}: no storage figures for backend {backend!r}; "
                             f"it has {', '.join(sorted(self.storage)) or 'none'}")
        return self.storage[backend]


_SECTIONS = {"h2d": Link, "d2h": Link, "prefill": PrefillRates}
_TOP = ("format", "version", "name", "device", "date", "measured", "h2d", "d2h", "storage", "prefill")


def _check_keys(doc: dict, names: Sequence[str], optional: Sequence[str], where: str) -> None:
    """An unknown key, or a missing one that is not ``optional``: a ``ValueError`` naming it."""
    unknown = sorted(set(doc) - set(names))
    missing = [n for n in names if n not in doc and n not in optional]
    if unknown or missing:
        what = f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}"
        raise ValueError(f"{where}: {what}; keys: {', '.join(names)}")


def _section(cls: type, doc: Any, where: str) -> Any:
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: must be a JSON object, got {type(doc).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    _check_keys(doc, names, ("source", "measured"), where)
    try:
        return cls(**doc, where=where)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def profile_from_dict(doc: Any, where: str = "device profile") -> DeviceProfile:
    """A `DeviceProfile` from its JSON object (module docstring).

    Raises:
        ValueError: not a profile, an unknown or missing key, a wrong type or a value out of
            range (``where`` and the key named).
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"{where}: not a device profile (format must be {FORMAT!r}, version {VERSION})")
    _check_keys(doc, _TOP, (), where)
    for key in ("name", "device", "date"):
        if not isinstance(doc[key], str) or not doc[key]:
            raise ValueError(f"{where}: {key} must be a non-empty string, got {doc[key]!r}")
    if not isinstance(doc["measured"], bool):
        raise ValueError(f"{where}: measured must be true or false, got {doc['measured']!r}")
    if not isinstance(doc["storage"], dict):
        raise ValueError(f"{where}: storage must be a JSON object of backends")
    parts = {k: _section(cls, doc[k], f"{where}: {k}") for k, cls in _SECTIONS.items()}
    storage = {str(k): _section(Store, v, f"{where}: storage.{k}") for k, v in doc["storage"].items()}
    return DeviceProfile(doc["name"], doc["device"], doc["date"], doc["measured"], storage=storage, **parts)


def profile_dict(profile: DeviceProfile) -> dict[str, Any]:
    """The JSON object of ``profile`` (`profile_from_dict` reads it back equal)."""
    doc = {"format": FORMAT, "version": VERSION, "name": profile.name, "device": profile.device,
           "date": profile.date, "measured": profile.measured}
    doc |= {k: dataclasses.asdict(getattr(profile, k)) for k in ("h2d", "d2h")}
    doc["storage"] = {k: dataclasses.asdict(v) for k, v in profile.storage.items()}
    doc["prefill"] = dataclasses.asdict(profile.prefill)
    return doc


def save_profile(profile: DeviceProfile, path: str | Path) -> Path:
    """Write ``profile`` as JSON to ``path`` (its folder made); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile_dict(profile), indent=1) + "\n")
    return path


def load_profile(spec: str | Path, flag: str = "--device-profile") -> DeviceProfile:
    """A shipped profile by name (`PROFILE_NAMES`) or a profile JSON file.

    Raises:
        ValueError: neither a shipped name nor a readable profile file (``flag`` and the
            names named), or a bad file (`profile_from_dict`; over `MAX_PROFILE_BYTES`).
    """
    text = str(spec)
    path = PROFILE_DIR / f"{text}.json" if text in PROFILE_NAMES else Path(text).expanduser()
    where = f"{flag} {text}"
    try:  # without blocking on a FIFO, never past MAX_PROFILE_BYTES: a user's path
        with open_source(path, Deadline(STALL_S)) as f:
            raw = read_capped(f, MAX_PROFILE_BYTES, where, "a device profile")
    except OSError as exc:
        raise ValueError(f"{where}: not a shipped profile ({', '.join(PROFILE_NAMES)}) and not a readable file "
                         f"({exc.strerror or exc})") from None
    doc = parse_json(raw, where, max_bytes=MAX_PROFILE_BYTES)  # depth, digits, UTF-8: one line naming the flag
    return profile_from_dict(doc, where)
