"""How the C modules are taken or refused (`host_pools.compiled`, issue 42 items 2-3): the
``HICACHE_NO_C`` switch, the source stamp (a module built from another source falls back
to the Python form with one warning line), and the read path's declared node layout (a
TreeNode whose fields are not its own object slots refuses the import)."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from hicache import slot_arrays
from host_pools import compiled

ROOT = Path(__file__).resolve().parents[2]
SLOT_ARRAYS = [ROOT / "hicache/_slot_arrays.c", ROOT / "hicache/_tensor.h"]  # setup.py's sources of the module
built = pytest.mark.skipif(not slot_arrays.COMPILED, reason="hicache._slot_arrays is not built (or HICACHE_NO_C=1)")


@built
def test_a_module_is_taken_when_its_stamp_is_its_source(caplog):
    with caplog.at_level(logging.WARNING):
        module = compiled.load("hicache._slot_arrays", SLOT_ARRAYS)
    assert module is not None and module.SOURCE_SHA256 == compiled.source_stamp(SLOT_ARRAYS)
    assert caplog.records == []


@built
def test_a_module_built_from_another_source_is_refused_with_one_line(tmp_path, caplog):
    edited = tmp_path / "_slot_arrays.c"
    edited.write_bytes((ROOT / "hicache/_slot_arrays.c").read_bytes() + b"/* edited since the build */\n")
    with caplog.at_level(logging.WARNING):
        assert compiled.load("hicache._slot_arrays", [edited, SLOT_ARRAYS[1]]) is None
    [record] = caplog.records
    line = record.getMessage()
    assert "\n" not in line and line.startswith("hicache._slot_arrays: built from another source than _slot_arrays.c")
    assert "using the Python form; rebuild: python setup.py build_ext --inplace" in line


@built
def test_without_its_source_beside_it_a_module_is_used_as_built(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert compiled.load("hicache._slot_arrays", [tmp_path / "absent.c"]) is not None
    assert caplog.records == []


def test_a_module_not_built_is_the_python_form_silently(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("HICACHE_NO_C", raising=False)
    with caplog.at_level(logging.WARNING):
        assert compiled.load("hicache._never_built", [tmp_path / "x.c"]) is None
    assert caplog.records == []


def test_a_module_that_fails_to_load_is_one_line(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("HICACHE_NO_C", raising=False)
    (tmp_path / "refusing_module.py").write_text("raise ImportError('layout does not fit')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING):
        assert compiled.load("refusing_module", [tmp_path / "refusing_module.c"]) is None
    [record] = caplog.records
    assert "refusing_module: cannot be loaded (layout does not fit): using the Python form" in record.getMessage()


@pytest.mark.parametrize("value, off", [("1", True), ("yes", True), ("0", False), ("", False)])
def test_the_switch(monkeypatch, value, off):
    monkeypatch.setenv("HICACHE_NO_C", value)
    assert compiled.disabled() is off
    if off:
        assert compiled.load("hicache._slot_arrays", SLOT_ARRAYS) is None


@pytest.mark.skipif(not compiled.disabled(), reason="runs under HICACHE_NO_C=1 (.ci/run's second line)")
def test_under_the_switch_every_package_runs_its_python_form():
    from hicache.radix import read
    from host_pools import allocator
    assert (read.READ is read.PYTHON, read.COMPILED, slot_arrays.COMPILED, allocator._pages) == (True, None, False, None)


LAYOUT = """
import dataclasses, importlib.util, sys, types
for name in ("hicache", "hicache.radix"):  # stand-ins: the module reads TreeNode from hicache.radix.node
    sys.modules[name] = types.ModuleType(name)
node = sys.modules["hicache.radix.node"] = types.ModuleType("hicache.radix.node")
FIELDS = "key end children _device last_access hit_count".split()
if sys.argv[1] == "no-slots":
    node.TreeNode = dataclasses.make_dataclass("TreeNode", FIELDS)
elif sys.argv[1] == "end-a-property":
    node.TreeNode = type("TreeNode", (), {"__slots__": [f for f in FIELDS if f != "end"], "end": property(len)})
elif sys.argv[1] == "a-setattr":
    node.TreeNode = type("TreeNode", (), {"__slots__": FIELDS, "__setattr__": lambda s, k, v: None})
spec = importlib.util.spec_from_file_location("hicache.radix._read", sys.argv[2])
try:
    importlib.util.module_from_spec(spec)
except ImportError as exc:
    print(exc)
"""


@pytest.mark.skipif(not list((ROOT / "hicache/radix").glob("_read*.so")), reason="hicache.radix._read is not built")
@pytest.mark.parametrize("case, why", [("no-slots", "key: not a writable object slot"),
                                       ("end-a-property", "end: not a writable object slot"),
                                       ("a-setattr", "defines __setattr__")])
def test_the_read_path_refuses_a_node_layout_it_does_not_declare(case, why):
    library = next((ROOT / "hicache/radix").glob("_read*.so"))
    run = subprocess.run([sys.executable, "-c", LAYOUT, case, str(library)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and "TreeNode's layout does not fit" in run.stdout and why in run.stdout, run
