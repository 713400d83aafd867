"""The CUDA runtime calls torch does not expose, through ctypes: DMA copies of row runs.

The library is the ``libcudart`` torch itself loaded (found in ``/proc/self/maps``), so
streams and the primary context are shared with torch. ``host_pools.cuda_host`` binds
the host-registration calls the same way (the two packages never import each other).

    memcpy_async(dst, src, nbytes, stream)                    one 1-D copy
    memcpy_2d_async(dst, dpitch, src, spitch, width, height)  a strided run in one copy
    memcpy_batch_async(dsts, srcs, sizes, stream)             many 1-D copies, one call
                                                              (CUDA >= 12.8; else None)
    memcpy_batch_rows(pieces, stream) / memcpy_batch_ptrs(...) the same from a [3, n]
                                                              array / raw addresses
    event_create() / event_record(event, stream) / stream_wait_event(stream, event)
                                                              ordering between streams
                                                              without a torch call

Every failing call raises ``RuntimeError`` with CUDA's error string, after clearing the
runtime's last error so that an unrelated later torch call does not raise it again.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction inferred from the (UVA) pointers
_SRC_ACCESS_ORDER_STREAM = 1  # cudaMemcpySrcAccessOrderStream


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", _MemLocation),
                ("dstLocHint", _MemLocation), ("flags", ctypes.c_uint)]


def find_libcudart() -> str:
    """Path of the ``libcudart`` loaded in this process (torch loads it with CUDA).

    Raises:
        RuntimeError: no CUDA runtime is loaded (call after ``torch.cuda.init()``).
    """
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rsplit(None, 1)[-1]
            if "/libcudart.so" in path:
                return path
    raise RuntimeError("libcudart is not loaded in this process (is CUDA initialised?)")


@functools.lru_cache(maxsize=1)
def lib() -> ctypes.CDLL:
    """The process's CUDA runtime library, with the signatures used here declared."""
    cudart = ctypes.CDLL(find_libcudart())
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    cudart.cudaMemcpyAsync.argtypes = [vp, vp, sz, ctypes.c_int, vp]
    cudart.cudaMemcpy2DAsync.argtypes = [vp, sz, vp, sz, sz, sz, ctypes.c_int, vp]
    cudart.cudaEventCreateWithFlags.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
    cudart.cudaEventRecord.argtypes = [vp, vp]
    cudart.cudaStreamWaitEvent.argtypes = [vp, vp, ctypes.c_uint]
    cudart.cudaEventDestroy.argtypes = [vp]
    cudart.cudaGetErrorString.restype = ctypes.c_char_p
    cudart.cudaGetErrorString.argtypes = [ctypes.c_int]
    return cudart


@functools.lru_cache(maxsize=1)
def runtime_version() -> int:
    """``cudaRuntimeGetVersion`` (e.g. 13000 for CUDA 13.0)."""
    version = ctypes.c_int()
    check(lib().cudaRuntimeGetVersion(ctypes.byref(version)), "cudaRuntimeGetVersion")
    return version.value


def check(err: int, what: str) -> None:
    """Raise ``RuntimeError`` naming ``what`` and CUDA's message unless ``err`` is 0."""
    if err:
        lib().cudaGetLastError()  # clear it: torch would otherwise raise it later
        msg = lib().cudaGetErrorString(err).decode(errors="replace")
        raise RuntimeError(f"{what} failed: CUDA error {err} ({msg})")


def memcpy_async(dst: int, src: int, nbytes: int, stream: int) -> None:
    """One 1-D copy of ``nbytes`` on ``stream`` (a ``cudaStream_t`` as an int)."""
    check(lib().cudaMemcpyAsync(dst, src, nbytes, _MEMCPY_DEFAULT, stream), "cudaMemcpyAsync")


def memcpy_2d_async(dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                    stream: int) -> None:
    """``height`` rows of ``width`` bytes, rows ``spitch`` / ``dpitch`` bytes apart."""
    check(lib().cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, _MEMCPY_DEFAULT,
                                  stream), "cudaMemcpy2DAsync")


@functools.lru_cache(maxsize=1)
def _batch_fn():
    """``cudaMemcpyBatchAsync`` with this runtime's signature, or None before CUDA 12.8.

    CUDA 12.8/12.9 take a ``size_t* failIdx`` before the stream; CUDA 13 dropped it.
    """
    version = runtime_version()
    fn = getattr(lib(), "cudaMemcpyBatchAsync", None)
    if fn is None or version < 12080:
        return None
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    head = [vp, vp, vp, sz, ctypes.POINTER(_MemcpyAttributes), ctypes.POINTER(sz), sz]
    fn.argtypes = head + ([vp] if version >= 13000 else [ctypes.POINTER(sz), vp])
    return fn


def batch_available() -> bool:
    """True when this runtime offers ``cudaMemcpyBatchAsync``."""
    return _batch_fn() is not None


def memcpy_batch_async(dsts: np.ndarray, srcs: np.ndarray, sizes: np.ndarray,
                       stream: int) -> None:
    """Many 1-D copies in one call, in stream order (copies within it are unordered).

    Args:
        dsts / srcs / sizes: equal-length uint64-compatible arrays (addresses, bytes).
        stream: a ``cudaStream_t`` as an int.

    Raises:
        RuntimeError: the runtime has no batched copy, or the call failed.
    """
    arrays = [np.ascontiguousarray(a, dtype=np.uint64) for a in (dsts, srcs, sizes)]
    memcpy_batch_ptrs(*(a.ctypes.data for a in arrays), len(arrays[2]), stream)


def memcpy_batch_rows(pieces: np.ndarray, stream: int) -> None:
    """:func:`memcpy_batch_async` of a ``[3, n]`` array (dst, src, bytes). A uint64 one
    whose rows are each contiguous (a column slice of a C-contiguous array) is read in
    place: one address read for the three rows, nothing copied."""
    if pieces.dtype != np.uint64 or pieces.strides[1] != 8:
        pieces = np.ascontiguousarray(pieces, dtype=np.uint64)
    at, row = pieces.__array_interface__["data"][0], pieces.strides[0]
    memcpy_batch_ptrs(at, at + row, at + 2 * row, pieces.shape[1], stream)


def memcpy_batch_ptrs(dsts: int, srcs: int, sizes: int, count: int, stream: int) -> None:
    """``cudaMemcpyBatchAsync`` of ``count`` copies whose uint64 address and size arrays
    start at ``dsts`` / ``srcs`` / ``sizes`` (host addresses); every copy orders its source
    reads on ``stream``.

    Raises:
        RuntimeError: the runtime has no batched copy, or the call failed.
    """
    fn = _batch_fn()
    if fn is None:
        raise RuntimeError("cudaMemcpyBatchAsync needs CUDA >= 12.8")
    if count == 0:
        return
    attr, idx = _batch_attrs()
    if runtime_version() < 13000:
        err = fn(dsts, srcs, sizes, count, attr, idx, 1, ctypes.byref(ctypes.c_size_t(0)), stream)
    else:
        err = fn(dsts, srcs, sizes, count, attr, idx, 1, stream)
    check(err, "cudaMemcpyBatchAsync")


@functools.lru_cache(maxsize=1)
def _batch_attrs() -> tuple:
    """Pointers to the one attribute set every batched copy uses (source reads in stream
    order) and to its index array ``[0]``: built once (a pointer keeps its target alive),
    read-only to the runtime."""
    attr = _MemcpyAttributes(srcAccessOrder=_SRC_ACCESS_ORDER_STREAM)
    return ctypes.pointer(attr), ctypes.pointer(ctypes.c_size_t(0))


_EVENT_DISABLE_TIMING = 2  # cudaEventDisableTiming: the cheapest event to record and wait on


def event_create() -> int:
    """A new ``cudaEvent_t`` (no timing) on the current device, as an int."""
    event = ctypes.c_void_p()
    check(lib().cudaEventCreateWithFlags(ctypes.byref(event), _EVENT_DISABLE_TIMING),
          "cudaEventCreateWithFlags")
    return event.value


def event_destroy(event: int) -> None:
    """Release an event made by :func:`event_create` (safe while work still uses it)."""
    check(lib().cudaEventDestroy(event), "cudaEventDestroy")


def event_record(event: int, stream: int) -> None:
    """Record ``event`` on ``stream``: it completes once the stream's earlier work has."""
    check(lib().cudaEventRecord(event, stream), "cudaEventRecord")


def stream_wait_event(stream: int, event: int) -> None:
    """Make ``stream``'s later work wait for ``event``'s latest record (no host wait)."""
    check(lib().cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent")
