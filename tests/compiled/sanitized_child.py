"""The child of `test_sanitized.py`, run under AddressSanitizer: ``python sanitized_child.py
BUILD TEST...`` imports the three C modules from the sanitized build in BUILD (their
``<name>.so``), checks that the packages took them, writes the hostile calls' results to
BUILD/hostile.jsonl, then runs pytest on TEST... (the differential tests). Exit status:
pytest's, or 3 when the packages did not take the sanitized modules.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

MODULES = ("hicache.radix._read", "hicache._slot_arrays", "host_pools._pages")


class SanitizedBuild(importlib.abc.MetaPathFinder):
    """Finds the three modules in the sanitized build first (nothing else)."""

    def __init__(self, build: Path) -> None:
        self.build = build

    def find_spec(self, name, path=None, target=None):
        if name in MODULES:
            return importlib.util.spec_from_file_location(name, self.build / f"{name}.so")
        return None


def main(argv: list[str]) -> int:
    build, tests = Path(argv[0]), argv[1:]
    sys.meta_path.insert(0, SanitizedBuild(build))
    from hicache.radix import read
    from hicache import slot_arrays
    from host_pools import allocator
    taken = {"read": read.COMPILED and read._c.__file__, "slot_arrays": slot_arrays.COMPILED and slot_arrays._c.__file__,
             "pages": allocator._pages and allocator._pages.__file__}
    if not all(f and Path(f).parent == build for f in taken.values()):
        print(f"sanitized_child: the packages did not take the sanitized build: {taken}", file=sys.stderr)
        return 3
    from tests.compiled import hostile
    with open(build / "hostile.jsonl", "w") as out, contextlib.redirect_stdout(out):
        hostile.main([])
    import pytest
    return pytest.main(["-p", "no:cacheprovider", "-p", "no:warnings", "-rs", *tests])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
