"""The decision table of the ``"auto"`` backend: which path a job of given traits takes.

A job's *traits* (`JobTraits`) are read from its two tables and its row count alone (no
run analysis):

    device      "cuda" or "cpu": where the plan executes
    dir         "h2d" (host table to device table), "d2h", or "same" (both on one device:
                every CPU plan)
    path        "stage": an all-layer job whose host side is a page_first table facing the
                device (its whole pages can be staged by DMA, ``staging.host_side``);
                "dense": both sides' rows back to back (a run of rows is one piece);
                "strided": anything else (row by row on a copy engine)
    piece_bytes the mean row bytes over the job's buffers: the smallest piece the copy
                engine (or torch) would move per (layer, buffer)
    span_bytes  "stage": one host page span (all layers of a row), the smallest DMA piece
                of the staged path; 0 on the other paths
    job_bytes   the bytes of the smallest job of the row-count class (rows rounded down to
                a power of two) x bytes per row: the *size class*

The table is a list of rules; the first rule whose conditions all hold decides. A rule::

    {"device": "cuda", "path": "stage", "min_span_bytes": 32768, "use": "dma"}

Keys: ``device`` (required), ``use`` (required: ``dma`` | ``triton`` | ``copy_engine`` on
cuda; also ``torch`` on cpu, where ``dma`` is the numpy stand-in and ``triton`` the
interpreter), ``path`` and ``dir`` (absent: any), ``min_/max_piece_bytes``,
``min_/max_span_bytes``, ``min_/max_job_bytes`` (bounds inclusive; absent: none).
No rule matching: ``triton`` on cuda, ``torch`` on cpu. ``dma`` for a job that cannot be
staged means ``triton`` (the staged backend sends it straight to its kernel).

A table file is JSON: ``{"format": "hicache-auto-table", "version": 1, "source": "...",
"rules": [...]}``. :data:`SEED` is the default, from the H100 figures cited in
:mod:`transfer_kernels.tuning`; ``bench/load_batch.py --calibrate`` writes a measured one;
``HICACHE_AUTO_TABLE=PATH`` (or ``AutoBackend(table=...)``) loads it.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bounded_input import read_json
from transfer_kernels import tuning

FORMAT, VERSION = "hicache-auto-table", 1
ENV = "HICACHE_AUTO_TABLE"
PATHS = ("stage", "dense", "strided")
DIRS = ("h2d", "d2h", "same")
CHOICES = {"cuda": ("dma", "triton", "copy_engine"), "cpu": ("torch", "copy_engine", "dma", "triton")}
FALLBACK = {"cuda": "triton", "cpu": "torch"}
MAX_TABLE_BYTES = 1 << 20  # a table file: a calibrated one is a few KB
_SIZES = ("piece", "span", "job")
_BOUNDS = tuple(f"{end}_{what}_bytes" for what in _SIZES for end in ("min", "max"))


class JobTraits(NamedTuple):
    """What the table looks up for a job (module docstring)."""

    device: str
    dir: str
    path: str
    piece_bytes: int
    span_bytes: int
    job_bytes: int
    side: str | None = None  # the staged side of a "stage" job


@dataclass(frozen=True)
class Rule:
    """One row of the table (see the module docstring)."""

    device: str
    use: str
    path: str | None = None
    dir: str | None = None
    min_piece_bytes: int | None = None
    max_piece_bytes: int | None = None
    min_span_bytes: int | None = None
    max_span_bytes: int | None = None
    min_job_bytes: int | None = None
    max_job_bytes: int | None = None

    def matches(self, traits: JobTraits) -> bool:
        """True when every condition of the rule holds for ``traits``."""
        return (self.device == traits.device and self.path in (None, traits.path)
                and self.dir in (None, traits.dir)
                and _within(traits.piece_bytes, self.min_piece_bytes, self.max_piece_bytes)
                and _within(traits.span_bytes, self.min_span_bytes, self.max_span_bytes)
                and _within(traits.job_bytes, self.min_job_bytes, self.max_job_bytes))

    def to_json(self) -> dict[str, Any]:
        """The rule's JSON object (absent conditions left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def _within(value: int, low: int | None, high: int | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


@dataclass(frozen=True)
class AutoTable:
    """An ordered list of :class:`Rule`; the first match decides."""

    rules: tuple[Rule, ...]
    source: str = ""

    @property
    def size_dependent(self) -> bool:
        """True when a rule bounds job bytes: a job's choice then depends on its size class."""
        return any(r.min_job_bytes is not None or r.max_job_bytes is not None for r in self.rules)

    def choose(self, traits: JobTraits) -> str:
        """The backend name for a job of ``traits`` (module docstring)."""
        for rule in self.rules:
            if rule.matches(traits):
                return rule.use
        return FALLBACK[traits.device]

    def to_json(self) -> dict[str, Any]:
        """The table as a JSON document (see the module docstring)."""
        return {"format": FORMAT, "version": VERSION, "source": self.source,
                "rules": [r.to_json() for r in self.rules]}

    def save(self, path: str | Path) -> Path:
        """Write the table to ``path`` as JSON (parents created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path


SEED = AutoTable(rules=(
    # Whole pages by DMA from 32 KiB pieces: 0.68 of the limit there, 0.98 from 128 KiB,
    # and unaffected by compute (the kernel fell to ~0.2 under GEMMs).
    Rule("cuda", "dma", path="stage", min_span_bytes=tuning.AUTO_STAGE_MIN_PIECE_BYTES),
    # Everything else: the SM kernel. Not the per-row copy engine: the engines are useless
    # under 32 KiB, and the backend's host work per (layer, buffer) made it the slowest
    # path on the H100 (Flash 16 pages 1.3 GB/s; Llama-3.1-8B layer_first 12.9 ms host).
    Rule("cuda", "triton"),
    # CPU (2-core dev VM, p50 of one call): memcpy per row beats index_select from 1 KiB.
    Rule("cpu", "copy_engine", min_piece_bytes=tuning.CPU_COPY_ENGINE_MIN_PIECE_BYTES),
    Rule("cpu", "torch"),
), source="seed: H100 80GB HBM3 (PCIe Gen5 x16) measured 2026-11-25 at b0a80f0 "
          "(transfer_kernels/tuning.py); CPU: 2-core dev VM")


def load(path: str | Path) -> AutoTable:
    """Read a table file.

    Args:
        path: a JSON file of the format in the module docstring.

    Returns:
        The table.

    Raises:
        ValueError: the file cannot be read, is over `MAX_TABLE_BYTES`, stalls (a FIFO
            with no writer), is not JSON within `bounded_input.parse_json`'s bounds (the
            line named), or a field is wrong; the message starts with the path and names
            the line or the field (``rules[2].use``).
    """
    try:
        doc = read_json(path, "an auto table file", MAX_TABLE_BYTES)
    except OSError as exc:
        raise ValueError(f"{path}: not a readable JSON auto table ({exc})") from None
    try:
        return from_json(doc)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def from_json(doc: Any) -> AutoTable:
    """A table from its parsed JSON document (``ValueError`` naming the bad field)."""
    if not isinstance(doc, dict):
        raise ValueError(f"must be a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT or type(doc.get("version")) is not int or doc["version"] != VERSION:
        raise ValueError(f"format/version: must be {FORMAT!r} / {VERSION}, got "
                         f"{doc.get('format')!r} / {doc.get('version')!r}")
    rules = doc.get("rules")
    if not isinstance(rules, list) or not rules:
        raise ValueError("rules: must be a non-empty list of rule objects")
    source = doc.get("source", "")
    if not isinstance(source, str):
        raise ValueError(f"source: must be a string, got {type(source).__name__}")
    return AutoTable(rules=tuple(_rule(r, f"rules[{i}]") for i, r in enumerate(rules)), source=source)


def _rule(obj: Any, where: str) -> Rule:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: must be an object, got {type(obj).__name__}")
    unknown = set(obj) - {"device", "use", "path", "dir", *_BOUNDS}
    if unknown:
        raise ValueError(f"{where}.{sorted(unknown)[0]}: unknown key; allowed: device, use, "
                         f"path, dir, {', '.join(_BOUNDS)}")
    for key in ("device", "use", "path", "dir"):  # before any lookup: a list or object is unhashable
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise ValueError(f"{where}.{key}: must be a string, got {type(obj[key]).__name__} {obj[key]!r}")
    device = obj.get("device")
    if device not in CHOICES:
        raise ValueError(f"{where}.device: must be one of {', '.join(CHOICES)}, got {device!r}")
    if obj.get("use") not in CHOICES[device]:
        raise ValueError(f"{where}.use: must be one of {', '.join(CHOICES[device])} on {device}, "
                         f"got {obj.get('use')!r}")
    if obj.get("path", None) not in (None, *PATHS):
        raise ValueError(f"{where}.path: must be one of {', '.join(PATHS)} (or absent), "
                         f"got {obj.get('path')!r}")
    if obj.get("dir", None) not in (None, *DIRS):
        raise ValueError(f"{where}.dir: must be one of {', '.join(DIRS)} (or absent), "
                         f"got {obj.get('dir')!r}")
    for key in _BOUNDS:
        v = obj.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{where}.{key}: must be an integer >= 0, got {v!r}")
    for what in _SIZES:
        low, high = obj.get(f"min_{what}_bytes"), obj.get(f"max_{what}_bytes")
        if low is not None and high is not None and low > high:
            raise ValueError(f"{where}.max_{what}_bytes: {high} is below min_{what}_bytes {low}")
    return Rule(**obj)


def from_env() -> AutoTable:
    """The table named by ``$HICACHE_AUTO_TABLE``, else :data:`SEED`.

    Raises:
        ValueError: naming ``HICACHE_AUTO_TABLE``, the file and the bad field.
    """
    path = os.environ.get(ENV)
    if not path:
        return SEED
    try:
        return load(path)
    except ValueError as exc:
        raise ValueError(f"{ENV}: {exc}") from None
