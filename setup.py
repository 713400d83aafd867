"""Build hook for the one compiled module (the rest is in pyproject.toml).

``hicache._fastpath`` speeds up the radix tree's hot path; it is optional: when it
cannot be built (no C compiler or Python headers), hicache installs without it and
``hicache.fastpath`` uses its numpy fallbacks.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("hicache._fastpath", ["hicache/_fastpath.c"],
                             extra_compile_args=["-O2"], optional=True)])
