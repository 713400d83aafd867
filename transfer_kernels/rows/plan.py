"""Copy plans: jobs validated as a whole before any backend copies a byte.

A *job* copies ``dst[layer][b][dst_rows[i]] = src[layer][b][src_rows[i]]`` for its layers
and every buffer ``b``. A *plan* is the validated list of jobs of one call plus the device
that executes it (the CUDA device of any CUDA side, else the CPU).

Checked before any launch (``ValueError`` naming the argument; nothing is copied):

* rows: integer dtype, 1-D, equal lengths, on the CPU or the execution device;
* tables: same buffer layout (``signature``), same layer count, devices compatible;
* layers: ints in ``[0, num_layers)``, none listed twice;
* CPU index values: in ``[0, num_rows)``; no ``(dst table, layer, row)`` written twice in
  the call (across every job sharing the destination table); no ``(table, layer, row)``
  both read and written by the call (within one job or across jobs: the result would
  depend on the order the backend copies in).

Index tensors already on a CUDA device get only the dtype/shape/device checks; their
values are trusted (reading them would synchronize the device).

A caller that derived the rows itself from indices it validated once at its own edge
(hicache's controller) builds its :class:`CopyPlan` directly, without these checks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

import torch

from transfer_kernels.quant.codec import job_mode
from transfer_kernels.rows.indices import RowsLike, Runs, as_rows, check_range, first_duplicate, runs
from transfer_kernels.rows.table import RowTable

LayersLike = int | Sequence[int] | torch.Tensor | None
# Launch groups of a prepared plan: per launch, the (job index, table-local layer) pairs.
LaunchGroups = Sequence[Sequence[tuple[int, int]]]


class Lane(NamedTuple):
    """A job without its rows: what a route moves (`transfer_kernels.backends.route`)."""

    src: RowTable
    dst: RowTable
    layers: tuple[int, ...]  # table-local


class CopyJob(NamedTuple):
    """One pool's rows to copy; ``layers=None`` defers to the call (then to all layers)."""

    src: RowTable
    dst: RowTable
    src_rows: RowsLike
    dst_rows: RowsLike
    layers: LayersLike = None


@dataclass(slots=True, eq=False)
class PlannedJob:
    """A validated job: int64 1-D rows and explicit table-local layers.

    Treat as immutable; only the lazily computed runs are cached on it.
    """

    src: RowTable
    dst: RowTable
    src_rows: torch.Tensor
    dst_rows: torch.Tensor
    layers: tuple[int, ...]
    _runs: Runs | None = None

    def runs(self) -> Runs:
        """The row map's runs (computed once; device indices are copied to the CPU)."""
        if self._runs is None:
            self._runs = runs(self.src_rows.cpu(), self.dst_rows.cpu())
        return self._runs

    @property
    def num_rows(self) -> int:
        """Rows this job moves per (layer, buffer)."""
        return self.src_rows.numel()

    @property
    def num_bytes(self) -> int:
        """Bytes this job moves in total (its source's bytes)."""
        return self.num_rows * len(self.layers) * sum(self.src.row_bytes)

    @property
    def mode(self) -> str | None:
        """``"quantize"`` / ``"dequantize"`` when one side holds int8 host rows (`codec`),
        ``None`` for a byte copy."""
        return job_mode(self.src.codec, self.dst.codec)


@dataclass(frozen=True)
class CopyPlan:
    """Validated jobs of one call and the device that executes them."""

    jobs: tuple[PlannedJob, ...]
    device: torch.device  # cuda:i when any side is on CUDA, else cpu

    @property
    def is_empty(self) -> bool:
        """True when no job moves any byte."""
        for j in self.jobs:  # a loop, not a generator: run for every batch launched
            if j.layers and j.src_rows.numel():
                return False
        return True

    @property
    def num_bytes(self) -> int:
        """Bytes the plan moves in total."""
        return sum(j.num_bytes for j in self.jobs)

    @property
    def has_quant(self) -> bool:
        """True when a job converts (quantizes or dequantizes, `codec`)."""
        return any(j.mode is not None for j in self.jobs)

    def subset(self, jobs: Iterable[PlannedJob]) -> CopyPlan:
        """A plan over some of this plan's (already validated) jobs, on the same device."""
        return CopyPlan(jobs=tuple(jobs), device=self.device)

    def group_plan(self, group: Sequence[tuple[int, int]]) -> CopyPlan:
        """The plan of one launch group: layer ``l`` of job ``j`` for each ``(j, l)`` it
        lists (``l`` one of that job's layers, checked by the caller)."""
        layers: dict[int, list[int]] = {}
        for j, layer in group:
            layers.setdefault(j, []).append(layer)
        return self.subset(dataclasses.replace(self.jobs[j], layers=tuple(ls))
                           for j, ls in layers.items())


def make_plan(jobs: Sequence[CopyJob | tuple], layers: LayersLike = None,
              single: bool = False) -> CopyPlan:
    """Validate ``jobs`` as one call and return its plan.

    Args:
        jobs: :class:`CopyJob` or plain ``(src, dst, src_rows, dst_rows[, layers])`` tuples.
        layers: layers for jobs that name none; ``None`` means all layers of the job.
        single: label errors as a single ``copy_rows`` call (``"dst_rows: ..."``) instead
            of ``"jobs[i].dst_rows: ..."``.

    Returns:
        The plan; its rows are int64 1-D tensors.

    Raises:
        ValueError: any check of the module docstring fails.
        TypeError: a job is not a 4- or 5-tuple of the right types.
    """
    planned, devices = [], []
    for i, job in enumerate(jobs):
        label = "" if single else f"jobs[{i}]."
        p, dev = _plan_job(_as_job(job, label), layers, label)
        planned.append(p)
        devices.append(dev)
    device = devices[0] if devices else torch.device("cpu")
    for i, dev in enumerate(devices):
        if dev != device:
            raise ValueError(f"jobs: job {i} runs on {dev} but job 0 on {device}; one call "
                             f"must run on one device")
    _check_double_writes(planned, single)
    _check_read_write_overlap(planned, single)
    return CopyPlan(jobs=tuple(planned), device=device)


def _as_job(job: CopyJob | tuple, label: str) -> CopyJob:
    if isinstance(job, CopyJob):
        return job
    if not isinstance(job, tuple) or len(job) not in (4, 5):
        where = label.rstrip(".") or "job"
        raise TypeError(f"{where}: must be a CopyJob or a (src, dst, src_rows, dst_rows[, "
                        f"layers]) tuple, got a {type(job).__name__} of length {_len(job)}")
    return CopyJob(*job)


def _len(obj: object) -> int | str:
    return len(obj) if hasattr(obj, "__len__") else "?"


def _plan_job(job: CopyJob, layers: LayersLike, label: str) -> tuple[PlannedJob, torch.device]:
    src, dst = job.src, job.dst
    for arg, t in (("src", src), ("dst", dst)):
        if not isinstance(t, RowTable):
            raise TypeError(f"{label}{arg}: must be a RowTable, got {type(t).__name__}")
    _check_layouts(src, dst, label)
    if dst.num_layers != src.num_layers:
        raise ValueError(f"{label}dst: {dst.name} has {dst.num_layers} layers, src "
                         f"{src.name} has {src.num_layers}")
    device = exec_device(src, dst, label)
    src_rows = as_rows(job.src_rows, f"{label}src_rows")
    dst_rows = as_rows(job.dst_rows, f"{label}dst_rows")
    if src_rows.numel() != dst_rows.numel():
        raise ValueError(f"{label}dst_rows: length {dst_rows.numel()} differs from src_rows "
                         f"length {src_rows.numel()}")
    for arg, rows, table in (("src_rows", src_rows, src), ("dst_rows", dst_rows, dst)):
        _check_rows_device(rows, device, f"{label}{arg}")
        if rows.device.type == "cpu":
            check_range(rows, table.num_rows, f"{label}{arg}")
    job_layers = _as_layers(job.layers if job.layers is not None else layers,
                            src.num_layers, f"{label}layers")
    return PlannedJob(src, dst, src_rows, dst_rows, job_layers), device


def _check_layouts(src: RowTable, dst: RowTable, label: str) -> None:
    """Same buffer layout, or the int8 host rows of the other side's rows (`codec`)."""
    if src.codec is not None and dst.codec is not None and src.codec != dst.codec:
        raise ValueError(f"{label}dst: {dst.name} holds int8 rows of {dst.codec}, src {src.name} "
                         f"of {src.codec}; a copy between coded tables needs one codec")
    if dst.decoded_signature != src.decoded_signature or (src.codec == dst.codec and
                                                          dst.signature != src.signature):
        coded = "" if job_mode(src.codec, dst.codec) is None else " (decoded from int8 host rows)"
        raise ValueError(f"{label}dst: buffer layout (row bytes) {dst.decoded_signature} of {dst.name} "
                         f"differs from src {src.name}'s {src.decoded_signature}{coded}")


def exec_device(src: RowTable, dst: RowTable, label: str = "") -> torch.device:
    """The device a copy between ``src`` and ``dst`` runs on (``ValueError`` if none can)."""
    for arg, t in (("src", src), ("dst", dst)):
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{label}{arg}: device must be cpu or cuda, got {t.device}")
    if src.device.type == "cuda" and dst.device.type == "cuda" and src.device != dst.device:
        raise ValueError(f"{label}dst: device {dst.device} differs from src device "
                         f"{src.device}; peer copies are not supported")
    cuda = [t.device for t in (src, dst) if t.device.type == "cuda"]
    if not cuda:
        return torch.device("cpu")
    dev = cuda[0]
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def _check_rows_device(rows: torch.Tensor, device: torch.device, arg: str) -> None:
    if rows.device.type == "cpu":
        return
    if rows.device.type != device.type or (rows.device.index or 0) != (device.index or 0):
        raise ValueError(f"{arg}: must be on cpu or the execution device {device}, "
                         f"got {rows.device}")


def _as_layers(layers: LayersLike, num_layers: int, arg: str) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(num_layers))
    if isinstance(layers, torch.Tensor):
        layers = layers.flatten().tolist()
    elif isinstance(layers, int):
        layers = [layers]
    out = []
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ValueError(f"{arg}: must be ints, got {layer!r}")
        if not 0 <= layer < num_layers:
            raise ValueError(f"{arg}: values must be in [0, {num_layers}), got {layer}")
        out.append(layer)
    if len(set(out)) != len(out):
        dup = next(x for x in out if out.count(x) > 1)
        raise ValueError(f"{arg}: layer {dup} listed twice")
    return tuple(out)


def _check_double_writes(planned: list[PlannedJob], single: bool) -> None:
    """No (dst table, layer, row) may be written twice by one call."""
    by_table: dict[int, list[int]] = {}
    for i, job in enumerate(planned):
        if job.dst_rows.device.type == "cpu" and job.num_rows and job.layers:
            by_table.setdefault(id(job.dst), []).append(i)
    for idxs in by_table.values():
        if len(idxs) == 1:  # the common case: one job per destination table
            _check_group(planned, (idxs[0],), single)
            continue
        # Group jobs by which of them write each layer; check each distinct group once.
        per_layer: dict[int, list[int]] = {}
        for i in idxs:
            for layer in planned[i].layers:
                per_layer.setdefault(layer, []).append(i)
        for group in {tuple(g) for g in per_layer.values()}:
            _check_group(planned, group, single)


def _check_group(planned: list[PlannedJob], group: tuple[int, ...], single: bool) -> None:
    rows = torch.cat([planned[i].dst_rows for i in group]) if len(group) > 1 \
        else planned[group[0]].dst_rows
    dup = first_duplicate(rows)
    if dup is None:
        return
    owners = [i for i in group if bool((planned[i].dst_rows == dup).any())]
    label = "" if single else f"jobs[{owners[-1]}]."
    also = f" (also by jobs[{owners[0]}])" if len(owners) > 1 else ""
    raise ValueError(f"{label}dst_rows: row {dup} of {planned[owners[-1]].dst.name} "
                     f"written twice{also}")


def _check_read_write_overlap(planned: list[PlannedJob], single: bool) -> None:
    """No (table, layer, row) may be read by one job of the call and written by another
    (or the same) job: backends copy in no particular order."""
    readers: dict[int, list[int]] = {}
    for i, job in enumerate(planned):
        if job.src_rows.device.type == "cpu" and job.num_rows and job.layers:
            readers.setdefault(id(job.src), []).append(i)
    for w, writer in enumerate(planned):
        if writer.dst_rows.device.type != "cpu" or id(writer.dst) not in readers:
            continue
        for r in readers[id(writer.dst)]:
            if not set(planned[r].layers) & set(writer.layers):
                continue
            both = writer.dst_rows[torch.isin(writer.dst_rows, planned[r].src_rows)]
            if both.numel():
                label = "" if single else f"jobs[{w}]."
                also = "" if single or r == w else f" (read by jobs[{r}])"
                raise ValueError(f"{label}dst_rows: row {int(both[0])} of {writer.dst.name} is "
                                 f"also a source row of the same table{also}")
