"""The public entry points: copy rows of one pool or of a batch of pools in one call."""
from __future__ import annotations

from typing import Sequence

from transfer_kernels.backends.auto import AutoBackend
from transfer_kernels.backends.base import CopyBackend
from transfer_kernels.backends.copy_engine import CopyEngineBackend
from transfer_kernels.backends.staged import StagedBackend
from transfer_kernels.backends.torch_ref import TorchBackend
from transfer_kernels.backends.triton import TritonBackend
from transfer_kernels.rows import CopyJob, LayersLike, RowsLike, RowTable, make_plan

# "dma" is reached through "auto" by servers (--hicache-io-backend keeps the first four);
# by name here for tests and benchmarks.
BACKEND_NAMES = ("auto", "triton", "copy_engine", "torch", "dma")
_FACTORIES = {"auto": AutoBackend, "triton": TritonBackend,
              "copy_engine": CopyEngineBackend, "torch": TorchBackend, "dma": StagedBackend}


def get_backend(backend: str | CopyBackend = "auto") -> CopyBackend:
    """Resolve a backend name to a NEW instance (instances pass through).

    A name is never a process-wide instance: two callers of a name share nothing (no
    route, no layout, no staging ring). A caller that copies often builds its backend once
    and passes it: one instance keeps its routes and layouts, and is safe from any number
    of threads (`CopyBackend`).

    Args:
        backend: one of :data:`BACKEND_NAMES` or a :class:`CopyBackend`.

    Returns:
        The backend.

    Raises:
        ValueError: an unknown name (or ``"auto"`` with a bad ``$HICACHE_AUTO_TABLE``).
    """
    if isinstance(backend, CopyBackend):
        return backend
    if backend not in _FACTORIES:
        raise ValueError(f"backend: must be one of {BACKEND_NAMES} or a CopyBackend, "
                         f"got {backend!r}")
    return _FACTORIES[backend]()


def copy_rows(src: RowTable, dst: RowTable, src_rows: RowsLike, dst_rows: RowsLike,
              layers: LayersLike = None, backend: str | CopyBackend = "auto") -> None:
    """Copy ``dst[l][b][dst_rows[i]] = src[l][b][src_rows[i]]`` for every layer and buffer.

    Enqueued on the caller's current CUDA stream; never synchronizes the device when
    the indices are CPU tensors and host memory is pinned (``"torch"`` excepted). Mutates
    ``dst``'s memory. Thread-safe: any number of threads may call it at once, with a name
    (each call builds its own backend) or with one shared backend instance (its staged
    loads hold the staging ring in turn; counters are exact). Threads that write the same
    destination rows at once race as any two writers do: the bytes of one of them win.

    Args:
        src: the source side.
        dst: the destination side; same buffer layout and layer count as ``src``.
        src_rows: 1-D integer row indices into ``src`` (CPU tensor normally).
        dst_rows: 1-D integer row indices into ``dst``, same length, no row twice.
        layers: table-local layers to copy; ``None`` means all.
        backend: a name of :data:`BACKEND_NAMES` (a new backend for this call: its
            routes and layouts are built again; pass an instance to reuse them) or a
            :class:`CopyBackend`.

    Raises:
        ValueError: invalid input (see :mod:`transfer_kernels.rows.plan`); nothing was copied.
        TypeError: arguments of the wrong type.
    """
    impl = get_backend(backend)
    impl.execute(make_plan([CopyJob(src, dst, src_rows, dst_rows)], layers, single=True))


def copy_rows_batch(jobs: Sequence[CopyJob | tuple], layers: LayersLike = None,
                    backend: str | CopyBackend = "auto") -> None:
    """Copy several jobs (pools) in one call; ``"triton"`` makes it ONE kernel launch.
    Thread-safe as :func:`copy_rows` is.

    Args:
        jobs: :class:`CopyJob` or ``(src, dst, src_rows, dst_rows[, layers])`` tuples.
        layers: layers for jobs that name none; ``None`` means all layers of each job.
        backend: a name of :data:`BACKEND_NAMES` (a new backend) or a :class:`CopyBackend`.

    Raises:
        ValueError: any job is invalid, or a (dst table, layer, row) is written twice
            across jobs; nothing was copied.
        TypeError: a job of the wrong shape or type.
    """
    impl = get_backend(backend)
    impl.execute(make_plan(list(jobs), layers))
