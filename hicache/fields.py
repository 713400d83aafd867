"""Typed fields of frozen configs: every field checked and converted from its annotation.

A config's ``__post_init__`` passes each field through `checked_value` with the kind
`field_kinds` read from the dataclass annotations (strings under ``from __future__
import annotations``), so a field added later is checked without a new line of code:

    kind        accepted                               stored as
    bool        True / False only (not "no", 0, 1)     bool
    int         int, numpy integer (not bool)          int
    float       int or float, numpy too (not bool);    float
                finite (not nan, inf, 10**400)
    str         str                                    str
    X | None    None, or what X accepts                None or X

A wrong type is a ``TypeError`` naming the field and the expected type; a float that is
not finite a ``ValueError``.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from typing import Any, Callable, NamedTuple


class FieldKind(NamedTuple):
    """What one field holds: a `KINDS` name, and whether ``None`` is allowed."""

    kind: str
    optional: bool


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


# kind -> (what the error says, check, conversion)
KINDS: dict[str, tuple[str, Callable[[Any], bool], Callable[[Any], Any]]] = {
    "bool": ("a bool (True or False)", lambda v: type(v) is bool, bool),
    "int": ("an int", _is_int, operator.index),
    "float": ("a number (int or float)", _is_number, float),
    "str": ("a str", lambda v: isinstance(v, str), str),
}


def parse_annotation(annotation: Any) -> FieldKind | None:
    """``"float | None"`` -> FieldKind("float", True); ``None`` for a type `KINDS` does not know."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    parts = [p.strip() for p in text.split("|")]
    rest = [p for p in parts if p != "None"]
    if len(rest) != 1 or rest[0] not in KINDS:
        return None
    return FieldKind(rest[0], "None" in parts)


def field_kinds(cls: type) -> dict[str, FieldKind | None]:
    """Every field of the dataclass ``cls`` -> its kind, or ``None`` where it cannot be checked."""
    return {f.name: parse_annotation(f.type) for f in dataclasses.fields(cls)}


def checked_value(name: str, kind: FieldKind, value: Any) -> Any:
    """``value`` checked against ``kind`` and converted (numpy scalars become Python ones).

    Args:
        name: how errors name the field, e.g. ``"hicache_ratio (--hicache-ratio)"``.
    Raises:
        TypeError: the wrong type, naming the field and the expected type.
        ValueError: a float that is not finite (nan, inf, or an int too large for a float).
    """
    if value is None and kind.optional:
        return None
    what, ok, convert = KINDS[kind.kind]
    if not ok(value):
        expected = what + (" or None" if kind.optional else "")
        raise TypeError(f"{name}: must be {expected}, got {type(value).__name__} {value!r}")
    if kind.kind != "float":
        return convert(value)
    try:
        out = convert(value)
    except OverflowError:  # an int past the float range
        raise ValueError(f"{name}: must be a finite number, got an int of {int(value).bit_length()} bits") from None
    if not math.isfinite(out):
        raise ValueError(f"{name}: must be a finite number, got {value}")
    return out
