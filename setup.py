"""Build hook for the two compiled modules (the rest is in pyproject.toml).

``hicache._fastpath`` speeds up the radix tree's hot path and ``host_pools._pages`` the
page allocator's free stack; both are optional: when they cannot be built (no C compiler
or Python headers), hicache installs without them and ``hicache.fastpath`` /
``host_pools.allocator`` use their numpy code.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension(name, [src], extra_compile_args=["-O3"], optional=True)
                   for name, src in (("hicache._fastpath", "hicache/_fastpath.c"),
                                     ("host_pools._pages", "host_pools/_pages.c"))])
