"""The hint envelope: one JSON object, the same for the Python API, a vLLM request's
``kv_transfer_params`` and a replay trace line; its checks and the capability report.

    {"hicache": {                     the key a request's kv_transfer_params carries it under
       "version": 1,                  optional; 1 is the only version
       "retain_s": 600,               retain: keep the prefix in its tier for 600 s (each hit
       "priority": 5,                 restarts it), priority 0-100 (default 50) among retains
       "release": true,               the prefix is first to go
       "demote": true,                device -> host now
       "prefetch": "device",          or "host": bring it up before the next turn
       "persist": true,               write it to the storage tier now
       "tokens": 4096}}               optional: the first 4096 tokens of the prompt (default all)

One envelope may carry several actions (``retain_s`` and ``demote``: keep the context,
on the host, through a long tool call); contradictions (``retain_s`` with ``release``,
``demote`` with ``prefetch: "device"``) are refused. The Python API takes one action per
call (`check_hint`); both check the same rules and refuse with one line naming the key
and what it allows (`HintError`). Torch-free.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, NamedTuple

ACTIONS = ("retain", "demote", "prefetch", "persist", "release")
PREFETCH_TO = ("device", "host")
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 0, 100, 50
ENVELOPE_KEY = "hicache"  # under this key in a request's kv_transfer_params
VERSION = 1
ENVELOPE_KEYS = ("version", "retain_s", "priority", "release", "demote", "prefetch", "persist", "tokens")
# What one scheduler step (one poll) spends on hints: past this many, a hint is refused
# before its tokens are read; and the async hints (demote, prefetch, persist) in flight.
MAX_HINTS_PER_STEP = 256
MAX_HINTS_IN_FLIGHT = 1024


class HintError(ValueError):
    """A hint the cache refuses: one line naming the argument (or key) and what it allows."""


class Hint(NamedTuple):
    """One checked hint: its action and the arguments that action takes.

    Attributes:
        action: one of `ACTIONS`.
        ttl_s: a retain's seconds (0 for other actions).
        priority: a retain's priority, `MIN_PRIORITY`..`MAX_PRIORITY`.
        to: a prefetch's destination tier, one of `PREFETCH_TO`.
        tokens: an envelope's leading prompt tokens the hint covers (``None``: all).
    """

    action: str
    ttl_s: float = 0.0
    priority: int = DEFAULT_PRIORITY
    to: str = "device"
    tokens: int | None = None


def _shown(v: Any) -> str:
    """A client's value in a refusal: its repr, cut to 60 characters (one line, bounded)."""
    text = repr(v).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _ttl(ttl_s: Any, max_ttl_s: float, name: str) -> float:
    if not isinstance(ttl_s, numbers.Real) or isinstance(ttl_s, bool):
        raise HintError(f"{name}: must be a number of seconds, got {_shown(ttl_s)}")
    if not (math.isfinite(ttl_s) and 0 < ttl_s <= max_ttl_s):
        raise HintError(f"{name}: must be in (0, {max_ttl_s:g}] seconds (--hicache-max-hint-ttl), "
                        f"got {_shown(ttl_s)}")
    return float(ttl_s)


def _priority(priority: Any, name: str) -> int:
    if not _is_int(priority) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise HintError(f"{name}: must be an integer in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {_shown(priority)}")
    return int(priority)


def check_hint(action: Any, ttl_s: Any = None, priority: Any = None, to: Any = None, *,
               max_ttl_s: float) -> Hint:
    """The Python API's hint, checked: ``retain`` takes ``ttl_s`` (required) and
    ``priority``, ``prefetch`` takes ``to`` (default ``"device"``), the others nothing.

    Raises:
        HintError: an unknown action, a missing or bad argument, or one the action does not take.
    """
    if not isinstance(action, str) or action not in ACTIONS:
        raise HintError(f"action: must be one of {', '.join(ACTIONS)}, got {_shown(action)}")
    given = {k: v for k, v in (("ttl_s", ttl_s), ("priority", priority), ("to", to)) if v is not None}
    takes = {"retain": ("ttl_s", "priority"), "prefetch": ("to",)}.get(action, ())
    extra = [k for k in given if k not in takes]
    if extra:
        raise HintError(f"{extra[0]}: a {action} takes {', '.join(takes) or 'no argument'}")
    if action == "retain":
        if ttl_s is None:
            raise HintError("ttl_s: a retain needs one (seconds the prefix stays)")
        prio = DEFAULT_PRIORITY if priority is None else _priority(priority, "priority")
        return Hint("retain", _ttl(ttl_s, max_ttl_s, "ttl_s"), prio)
    if action == "prefetch":
        if to is not None and to not in PREFETCH_TO:
            raise HintError(f"to: must be one of {', '.join(PREFETCH_TO)}, got {_shown(to)}")
        return Hint("prefetch", to=to or "device")
    return Hint(action)


def parse_envelope(value: Any, *, max_ttl_s: float) -> list[Hint]:
    """An envelope's hints, in `ACTIONS` order (module docstring).

    Raises:
        HintError: not a JSON object, an unknown key or version, a bad value, no action,
            or actions that contradict each other (nothing is applied then).
    """
    tokens, flags, to = _checked_keys(value)
    out = []
    if "retain_s" in value:
        prio = _priority(value["priority"], "hints.priority") if "priority" in value else DEFAULT_PRIORITY
        out.append(Hint("retain", _ttl(value["retain_s"], max_ttl_s, "hints.retain_s"), prio, tokens=tokens))
    for action in ACTIONS[1:]:
        if action == "prefetch":
            if to is not None:
                out.append(Hint("prefetch", to=to, tokens=tokens))
        elif flags[action]:
            out.append(Hint(action, tokens=tokens))
    if not out:
        raise HintError("hints: no action; give one or more of retain_s, release, demote, prefetch, persist")
    return out


def _checked_keys(value: Any) -> tuple[int | None, dict[str, bool], str | None]:
    """An envelope's keys, version, ``tokens``, flags and ``prefetch`` checked (not the
    retain's numbers): (tokens, the flags, prefetch's tier)."""
    if not isinstance(value, Mapping):
        raise HintError(f"hints: must be a JSON object with keys among {', '.join(ENVELOPE_KEYS)}, "
                        f"got {type(value).__name__}")
    unknown = [k for k in value if k not in ENVELOPE_KEYS]
    if unknown:
        raise HintError(f"hints: unknown key {str(unknown[0])[:40]!r}; allowed: {', '.join(ENVELOPE_KEYS)}")
    if "version" in value and (not _is_int(value["version"]) or value["version"] != VERSION):
        raise HintError(f"hints.version: this server speaks version {VERSION}, got {_shown(value['version'])}")
    tokens = value.get("tokens")
    if tokens is not None and (not _is_int(tokens) or tokens < 1):
        raise HintError(f"hints.tokens: must be an integer >= 1 (leading prompt tokens), got {_shown(tokens)}")
    flags = {k: value.get(k, False) for k in ("release", "demote", "persist")}
    for k, v in flags.items():
        if type(v) is not bool:
            raise HintError(f"hints.{k}: must be true or false, got {_shown(v)}")
    to = value.get("prefetch")
    if to is not None and to not in PREFETCH_TO:
        raise HintError(f"hints.prefetch: must be one of {', '.join(PREFETCH_TO)}, got {_shown(to)}")
    if "priority" in value and "retain_s" not in value:
        raise HintError("hints.priority: goes with retain_s (the priority of a retain)")
    if "retain_s" in value and flags["release"]:
        raise HintError("hints: retain_s and release contradict each other; send one")
    if flags["demote"] and to == "device":
        raise HintError("hints: demote and prefetch \"device\" contradict each other; send one")
    return tokens, flags, to


def capabilities(max_retained_ratio: float, max_ttl_s: float, unavailable: Mapping[str, str] | None = None) -> dict:
    """The capability report: the actions a cache takes (with why any other is not) and
    its limits, as JSON-ready values.

    Args:
        max_retained_ratio: ``--hicache-max-retained-ratio``; max_ttl_s: ``--hicache-max-hint-ttl``.
        unavailable: action -> why this cache cannot take it (say a persist without a storage tier).
    """
    unavailable = dict(unavailable or {})
    return {"version": VERSION, "envelope_key": ENVELOPE_KEY,
            "actions": [a for a in ACTIONS if a not in unavailable], "unavailable": unavailable,
            "limits": {"max_retained_ratio": max_retained_ratio, "max_ttl_s": max_ttl_s,
                       "priority": [MIN_PRIORITY, MAX_PRIORITY], "default_priority": DEFAULT_PRIORITY,
                       "max_hints_per_step": MAX_HINTS_PER_STEP, "max_hints_in_flight": MAX_HINTS_IN_FLIGHT}}


def capability_line(caps: Mapping[str, Any]) -> str:
    """The report in one line (what `hicache replay` and `hicache serve-vllm` print)."""
    lim = caps["limits"]
    missing = "".join(f"; no {a} ({why})" for a, why in caps["unavailable"].items())
    return (f"hints v{caps['version']}: {', '.join(caps['actions']) or 'none'}{missing}; retained <= "
            f"{lim['max_retained_ratio']:g} of each tier, TTL <= {lim['max_ttl_s']:g} s, priority "
            f"{lim['priority'][0]}-{lim['priority'][1]}, <= {lim['max_hints_per_step']} hints per step")
