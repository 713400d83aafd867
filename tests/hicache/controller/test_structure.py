"""The controller is composed like the radix tree (issue 26 item 3), read from its source.

`hicache/controller/` is a package of parts that each own their state: no class has a
base that brings behaviour in (no mixin; a record's ``NamedTuple``, an ``ABC``, an
``Enum``, an ``Exception`` or a builtin value type only), no module keeps a mutable cache
at module level (a cache is owned by the object whose facts it keeps), and no part writes
another part's attributes (``self.part.attr = ...``): each fact is written where it is
owned. The two facades, `HybridCacheController` and `HiRadixCache`, derive from nothing.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "hicache" / "controller"
MODULES = sorted(PACKAGE.glob("*.py"))
PARTS = {"controller", "queue", "slots", "planner", "groups", "launcher", "layer_sync", "stats"}
FLAT = ("controller.py", "queueing.py", "slots.py", "batch.py", "batch_plan.py", "layer_sync.py", "stats.py")
ALLOWED_BASES = {"object", "ABC", "NamedTuple", "Enum", "IntEnum", "Exception", "tuple"}
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque",
                 "WeakKeyDictionary", "WeakValueDictionary"}
CACHING_DECORATORS = {"lru_cache", "cache", "cached_property"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _name(node: ast.AST) -> str:
    """``a.b.C`` -> ``C``; ``C`` -> ``C``; a call's function name; else its dump."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ast.dump(node)


def test_the_controller_is_a_package_of_parts():
    assert PARTS <= {p.stem for p in MODULES}, sorted(p.stem for p in MODULES)
    assert [f for f in FLAT if (ROOT / "hicache" / f).exists()] == []


def test_the_facades_derive_from_nothing():
    from hicache.controller import HybridCacheController
    from hicache.radix import HiRadixCache

    assert HybridCacheController.__mro__ == (HybridCacheController, object)
    assert HiRadixCache.__mro__ == (HiRadixCache, object)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_class_takes_behaviour_from_a_base(path):
    bases = {(node.name, _name(base)) for node in ast.walk(_tree(path)) if isinstance(node, ast.ClassDef)
             for base in node.bases}
    assert {(cls, base) for cls, base in bases if base not in ALLOWED_BASES} == set()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_module_level_mutable_cache(path):
    found = []
    for node in _tree(path).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) and node.value is not None else []
        value = getattr(node, "value", None)
        names = [_name(t) for t in targets]
        if targets and names != ["__all__"] and (
                isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp))
                or isinstance(value, ast.Call) and _name(value) in MUTABLE_CALLS):
            found.append(f"{names} at line {node.lineno}")
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found += [f"@{_name(d)} on {node.name}" for d in node.decorator_list
                      if _name(d) in CACHING_DECORATORS and isinstance(node, ast.FunctionDef)]
    found += [f"global {', '.join(n.names)} at line {n.lineno}" for n in ast.walk(_tree(path))
              if isinstance(n, ast.Global)]
    assert found == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_part_writes_another_parts_attributes(path):
    writes = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute)
                            and isinstance(t.value.value, ast.Name) and t.value.value.id == "self"):
                        writes.append(f"self.{t.value.attr}.{t.attr} at line {node.lineno}")
        if isinstance(node, ast.Call) and _name(node) == "setattr":
            writes.append(f"setattr at line {node.lineno}")
    assert writes == []
