"""Build hook for the three compiled modules (the rest is in pyproject.toml).

``hicache.radix._read`` is the tree's read path (walk, touch, gather), ``hicache._slot_arrays``
the insert's and the controller's slot-array passes, ``host_pools._pages`` the page
allocator's free stack. All are optional: when they cannot be built (no C compiler or
Python headers), hicache installs without them and their Python forms run. Each is
stamped with the SHA-256 of its sources and of the header they share (``SOURCE_SHA256``):
`host_pools.compiled` refuses a module whose source changed since it was built, with one
warning line.
"""
from hashlib import sha256
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
MODULES = {  # name -> its C file, then its own headers
    "hicache.radix._read": ["hicache/radix/_read.c", "hicache/_tensor.h"],
    "hicache._slot_arrays": ["hicache/_slot_arrays.c", "hicache/_tensor.h"],
    "host_pools._pages": ["host_pools/_pages.c"],
}
HEADER = "host_pools/_args.h"  # the argument checks every module includes


def extension(name: str, sources: list[str]) -> Extension:
    stamp = sha256(b"".join((ROOT / p).read_bytes() for p in (*sources, HEADER))).hexdigest()  # compiled.source_stamp
    return Extension(name, sources[:1], include_dirs=[str(ROOT)], depends=[*sources[1:], HEADER],
                     extra_compile_args=["-O3"], define_macros=[("SOURCE_SHA256", f'"{stamp}"')], optional=True)


setup(ext_modules=[extension(name, sources) for name, sources in MODULES.items()])
