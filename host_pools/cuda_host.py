"""Pinning host memory for the device: ``cudaHostRegister`` and friends through ctypes.

torch exposes ``cudaHostRegister`` but neither ``cudaHostGetDevicePointer`` (needed to
check that the device may use the host address as is) nor ``cudaGetLastError`` (needed
to clear a failed registration's error, which torch would otherwise raise from the next
unrelated call). The library is the ``libcudart`` torch loaded, so the registrations
belong to the same primary context as torch's copies and kernels.
"""
from __future__ import annotations

import ctypes
import functools

import torch

# cudaHostRegisterPortable | cudaHostRegisterMapped: visible to every context and mapped
# into the device address space.
REGISTER_FLAGS = 1 | 2


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    torch.cuda.init()  # loads libcudart
    with open("/proc/self/maps") as maps:
        paths = [line.rsplit(None, 1)[-1] for line in maps if "/libcudart.so" in line]
    if not paths:
        raise RuntimeError("libcudart is not loaded in this process; cannot pin host memory")
    cudart = ctypes.CDLL(paths[0])
    vp = ctypes.c_void_p
    cudart.cudaHostRegister.argtypes = [vp, ctypes.c_size_t, ctypes.c_uint]
    cudart.cudaHostUnregister.argtypes = [vp]
    cudart.cudaHostGetDevicePointer.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_uint]
    cudart.cudaGetErrorString.restype = ctypes.c_char_p
    cudart.cudaGetErrorString.argtypes = [ctypes.c_int]
    return cudart


def error_text(err: int) -> str:
    """``"CUDA error 1 (invalid argument)"``, after clearing the runtime's last error."""
    _lib().cudaGetLastError()
    return f"CUDA error {err} ({_lib().cudaGetErrorString(err).decode(errors='replace')})"


def register(ptr: int, nbytes: int) -> None:
    """Page-lock ``[ptr, ptr + nbytes)`` and map it for the device.

    Raises:
        RuntimeError: naming CUDA's error (the runtime's last error is cleared first).
    """
    err = _lib().cudaHostRegister(ptr, nbytes, REGISTER_FLAGS)
    if err:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed: {error_text(err)}")


def unregister(ptr: int) -> None:
    """Undo :func:`register` for the range starting at ``ptr`` (errors are cleared, not raised:
    this runs at teardown)."""
    err = _lib().cudaHostUnregister(ptr)
    if err:
        error_text(err)


def device_pointer(ptr: int) -> int:
    """The device address of registered host memory at ``ptr``.

    Raises:
        RuntimeError: ``ptr`` is not registered (or mapped).
    """
    out = ctypes.c_void_p()
    err = _lib().cudaHostGetDevicePointer(ctypes.byref(out), ptr, 0)
    if err:
        raise RuntimeError(f"cudaHostGetDevicePointer failed: {error_text(err)}")
    return int(out.value or 0)
