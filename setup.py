"""Build hook for the one compiled module (the rest is in pyproject.toml).

``hicache.radix._fastpath`` speeds up the radix tree's hot path; it is optional: when it
cannot be built (no C compiler or Python headers), hicache installs without it and
``hicache.radix.fastpath`` uses its numpy fallbacks.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("hicache.radix._fastpath", ["hicache/radix/_fastpath.c"],
                             extra_compile_args=["-O2"], optional=True)])
