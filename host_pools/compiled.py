"""The project's optional C modules: the switch that turns them off, and the stamp that
refuses one built from another source than the one beside it.

setup.py compiles each module with the SHA-256 of its C sources (the module's file, its own
headers, and ``_args.h``, which they all include) stamped in (``SOURCE_SHA256``). `load` returns the module when it may be used, else ``None``, and
its caller runs its Python form, which gives the same answers:

    HICACHE_NO_C=1 in the environment    None (the switch: both packages run their Python
                                         and numpy forms; CI runs the suite's budget and
                                         differential tests so)
    not built (no compiler at install)   None, silently (the documented fallback)
    the sources beside it hash to        None, and one warning line naming the module and
    another stamp, or it fails to load   the command that rebuilds it (`make setup` also
                                         rebuilds: it reinstalls when a C source is newer)

Without its sources beside it (a wheel), a module is used as built. Used by `hicache` too
(imports point down). Stateless; call it at import time.
"""
from __future__ import annotations

import hashlib
import importlib
import logging
import os
from pathlib import Path
from types import ModuleType
from typing import Sequence

SWITCH = "HICACHE_NO_C"
REBUILD = "python setup.py build_ext --inplace"
HEADER = Path(__file__).with_name("_args.h")  # the argument checks every module includes
log = logging.getLogger(__name__)


def disabled() -> bool:
    """Whether ``HICACHE_NO_C`` asks for the Python forms (any value but empty or ``0``)."""
    return os.environ.get(SWITCH, "") not in ("", "0")


def source_stamp(sources: Sequence[Path]) -> str:
    """The stamp setup.py builds into a module compiled from ``sources`` (its file first,
    then its own headers): the SHA-256 of their bytes and `HEADER`'s, in that order
    (setup.py has its own copy of this rule: it runs before the package can be imported)."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in (*sources, HEADER))).hexdigest()


def load(name: str, sources: Sequence[Path]) -> ModuleType | None:
    """The compiled module ``name`` built from ``sources`` (its C file first, then its own
    headers), or ``None`` (see the module docstring for when, and what it says)."""
    if disabled():
        return None
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:  # it was found, and something it imports is missing
            log.warning("%s: cannot be loaded (%s): using the Python form; rebuild: %s", name, exc, REBUILD)
        return None
    except ImportError as exc:  # built, but refused (another layout, a missing symbol)
        log.warning("%s: cannot be loaded (%s): using the Python form; rebuild: %s", name, exc, REBUILD)
        return None
    if not all(p.is_file() for p in sources):
        return module
    built, want = getattr(module, "SOURCE_SHA256", ""), source_stamp(sources)
    if built != want:
        log.warning("%s: built from another source than %s (stamp %s, source %s): using the Python form; "
                    "rebuild: %s", name, sources[0].name, built[:12] or "none", want[:12], REBUILD)
        return None
    return module
