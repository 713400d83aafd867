"""Hostile calls of every compiled entry, run in a child process (``python hostile.py``):
a signal kills the child, never the test run.

Two sets of calls:

    REFUSED  arguments each entry must refuse: (case, entry, exception, argument named),
             among them the seven defects of issue 37 item 2
    SWEEP    every argument of every entry replaced in turn by each hostile value of its
             kind (wrong types, item widths, strided and read-only arrays, sizes, ints at
             and past int64, foreign tensors, malformed nodes): a call may return or raise,
             never crash (under the sanitized build: never touch a byte it should not)

The child prints one JSON line as each call starts (``{"start": case}``) and one when it
ends (``{"case", "raised", "message"}`` or ``{"case", "returned"}``): the last start
without an end names the call that killed it. ``python hostile.py --files`` prints the
files of the three modules it calls.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable

import numpy as np
import torch

from hicache import _slot_arrays as S
from hicache.radix import _read as R
from hicache.radix.node import TreeNode
from host_pools import _pages as P

I64 = np.int64


def _node(**kw: Any) -> TreeNode:
    base = dict(key=np.arange(4, dtype=I64).tobytes(), end=4, _device=torch.arange(4), hit_count=0, last_access=0)
    return TreeNode(**{**base, **kw})


def _root_with(child: Any, page_bytes: int = 8) -> TreeNode:
    """A root whose only child (filed under token 0) is ``child`` (whatever it is)."""
    root = _node(key=b"", end=0)
    root.children = {np.zeros(1, I64).tobytes(): child}
    return root


def _freed() -> torch.Tensor:
    t = torch.arange(8)
    t.untyped_storage().resize_(0)  # numel 8, no storage behind it
    return t


def _read_only(n: int = 8) -> np.ndarray:
    a = np.zeros(n, I64)
    a.flags.writeable = False
    return a


def _key(n: int = 8) -> np.ndarray:
    return np.zeros(n, I64)


def _take(**kw: Any) -> Callable[[], Any]:
    args = dict(stack=np.arange(4, dtype=I64), top=4, owned=np.zeros(4, np.bool_), generation=np.zeros(4, I64),
                out=np.empty(8, I64))
    args.update(kw)
    extra = (args.pop("page_size"),) if "page_size" in args else ()
    return lambda: P.take(*args.values(), *extra)


def _give(**kw: Any) -> Callable[[], Any]:
    args = dict(stack=np.zeros(4, I64), top=2, owned=np.ones(4, np.bool_), pages=np.array([1], I64))
    args.update(kw)
    return lambda: P.give(*args.values())


# (case, call, exception, the argument its message names)
REFUSED: list[tuple[str, Callable[[], Any], type, str]] = [
    # the defects of issue 37 item 2, as reproduced at 06b6e45
    ("defect-rows-int32", lambda: S.rows(torch.arange(16, dtype=torch.int32), 4, np.empty(4, I64)), TypeError,
     "slots"),
    ("defect-rows-strided", lambda: S.rows(torch.arange(32)[::2], 4, np.empty(4, I64)), TypeError, "slots"),
    ("defect-rows-meta", lambda: S.rows(torch.empty(16, dtype=torch.int64, device="meta"), 4, np.empty(4, I64)),
     TypeError, "slots"),
    ("defect-gather-int32", lambda: R.gather([_node(_device=torch.arange(4, dtype=torch.int32))], 1,
                                             np.empty(4, I64)), TypeError, "nodes[0]"),
    ("defect-gather-strided", lambda: R.gather([_node(_device=torch.arange(8)[::2])], 1, np.empty(4, I64)),
     TypeError, "nodes[0]"),
    ("defect-gather-meta", lambda: R.gather([_node(_device=torch.empty(4, dtype=torch.int64, device="meta"))], 1,
                                            np.empty(4, I64)), TypeError, "nodes[0]"),
    ("defect-walk-negative-end", lambda: R.walk(_node(end=-(1 << 40)), _key(), 8, None), ValueError, "end"),
    ("defect-take-page-size-2**61", _take(page_size=(1 << 61) - 2), ValueError, "page_size"),
    ("defect-give-top-minus-3", _give(top=-3), ValueError, "top"),
    # more of each entry's arguments
    ("gather-freed-storage", lambda: R.gather([_node(_device=_freed())], 1, np.empty(8, I64)), ValueError, "nodes[0]"),
    ("gather-no-device", lambda: R.gather([_node(_device=None)], 1, np.empty(4, I64)), ValueError, "nodes[0]"),
    ("gather-not-a-node", lambda: R.gather([object()], 1, np.empty(4, I64)), TypeError, "nodes"),
    ("gather-count-past-list", lambda: R.gather([_node()], 2, np.empty(4, I64)), ValueError, "count"),
    ("gather-count-negative", lambda: R.gather([_node()], -1, np.empty(4, I64)), ValueError, "count"),
    ("gather-out-read-only", lambda: R.gather([_node()], 1, _read_only(4)), TypeError, "out"),
    ("gather-out-short", lambda: R.gather([_node()], 1, np.empty(3, I64)), ValueError, "out"),
    ("gather-tensor-lookalike", lambda: R.gather([_node(_device=np.arange(4))], 1, np.empty(4, I64)), TypeError,
     "nodes[0]"),
    ("touch-not-a-node", lambda: R.touch([_node(), "x"], 1, True), TypeError, "nodes"),
    ("touch-hit-count-float", lambda: R.touch([_node(hit_count=1.5)], 1, True), TypeError, "hit_count"),
    ("walk-end-not-int", lambda: R.walk(_node(end=1.5), _key(), 8, None), ValueError, "end"),
    ("walk-key-int32", lambda: R.walk(_node(end=0), np.zeros(8, np.int32), 8, None), TypeError, "key"),
    ("walk-key-strided", lambda: R.walk(_node(end=0), np.zeros(16, I64)[::2], 8, None), TypeError, "key"),
    ("walk-page-bytes-odd", lambda: R.walk(_node(end=0), _key(), 12, None), ValueError, "page_bytes"),
    ("walk-page-bytes-huge", lambda: R.walk(_node(end=0), _key(), 1 << 70, None), ValueError, "page_bytes"),
    ("walk-child-not-a-node", lambda: R.walk(_root_with("x"), _key(), 8, None), TypeError, "child"),
    ("walk-grouped-child-not-a-node", lambda: R.walk(_root_with({_key(4).tobytes(): 3}), _key(), 32, None),
     TypeError, "child"),
    ("walk-children-not-a-dict", lambda: R.walk(_node(end=0, children=[1]), _key(), 8, None), TypeError,
     "children"),
    ("walk-key-not-bytes", lambda: R.walk(_root_with(_node(key="abcdefgh", end=1)), _key(), 8, None), TypeError,
     "key"),
    ("walk-hint-not-a-node", lambda: R.walk(_node(end=0), _key(), 8, [object()]), TypeError, "hint"),
    ("walk-not-a-node", lambda: R.walk(object(), _key(), 8, None), TypeError, "node"),
    ("fresh-pages-page-size-0", lambda: S.fresh_pages(_key(), 0, 0, 0, np.ones(4, np.bool_), None, None),
     ValueError, "page_size"),
    ("fresh-pages-start-past", lambda: S.fresh_pages(_key(), 9, 0, 1, np.ones(4, np.bool_), None, None),
     ValueError, "start"),
    ("fresh-pages-held-short", lambda: S.fresh_pages(_key(), 0, 8, 1, np.ones(4, np.bool_),
                                                     np.zeros(2, np.int32), None), ValueError, "held"),
    ("fresh-pages-out-short", lambda: S.fresh_pages(_key(), 0, 0, 1, np.ones(4, np.bool_), None,
                                                    np.empty(2, I64)), ValueError, "out"),
    ("fresh-pages-int-overflow", lambda: S.fresh_pages(_key(), 1 << 64, 0, 1, np.ones(4, np.bool_), None, None),
     ValueError, "start"),
    ("hold-delta-past-int32", lambda: S.hold(_key(), 1, np.zeros(4, np.int32), 1 << 40), ValueError, "delta"),
    ("hold-held-int64", lambda: S.hold(_key(), 1, np.zeros(4, I64), 1), TypeError, "held"),
    ("hold-page-outside", lambda: S.hold(np.array([9], I64), 1, np.zeros(4, np.int32), 1), ValueError, "slots"),
    ("rows-out-read-only", lambda: S.rows(torch.arange(8), 4, _read_only(2)), TypeError, "out"),
    ("rows-tokens-per-row-0", lambda: S.rows(torch.arange(8), 0, np.empty(2, I64)), ValueError, "tokens_per_row"),
    ("rows-freed-storage", lambda: S.rows(_freed(), 4, np.empty(2, I64)), ValueError, "slots"),
    ("rows-not-a-tensor", lambda: S.rows(np.arange(8, dtype=I64), 4, np.empty(2, I64)), TypeError, "slots"),
    ("put-index-outside", lambda: S.put(np.zeros(4, I64), np.array([4], I64), np.array([1], I64)), ValueError,
     "put"),
    ("put-index-negative", lambda: S.put(np.zeros(4, I64), np.array([-1], I64), np.array([1], I64)), ValueError,
     "put"),
    ("put-dst-read-only", lambda: S.put(_read_only(4), np.array([1], I64), np.array([1], I64)), TypeError, "dst"),
    ("same-bytes-not-a-buffer", lambda: S.same_bytes(_key(), 3), TypeError, "b"),
    ("take-out-ragged", _take(out=np.empty(7, I64), page_size=2), ValueError, "take"),
    ("take-stack-page-outside", _take(stack=np.array([0, 1, 2, 9], I64)), ValueError, "stack"),
    ("take-stack-page-negative", _take(stack=np.array([0, 1, 2, -1], I64)), ValueError, "stack"),
    ("take-top-past-stack", _take(top=5, out=np.empty(10, I64)), ValueError, "take"),
    ("take-generation-short", _take(generation=np.zeros(3, I64)), ValueError, "take"),
    ("take-owned-strided", _take(owned=np.zeros(8, np.bool_)[::2]), TypeError, "owned"),
    ("take-slots-overflow-int64", _take(stack=np.zeros(1 << 14, I64), top=0, owned=np.zeros(1 << 14, np.bool_),
                                        generation=np.zeros(1 << 14, I64), out=np.empty(0, I64),
                                        page_size=1 << 50), ValueError, "page_size"),
    ("give-top-past-stack", _give(top=5), ValueError, "top"),
    ("give-page-outside", _give(pages=np.array([4], I64)), ValueError, "pages"),
    ("give-no-room", _give(top=4, pages=np.array([1], I64)), ValueError, "pages"),
    ("give-stack-read-only", _give(stack=_read_only(4)), TypeError, "stack"),
]


# ---- the sweep ----------------------------------------------------------------------------
INTS = [-1, 0, 1, 3, -(1 << 63), (1 << 63) - 1, 1 << 63, 1 << 64, -(1 << 70), 1.5, None, "8", True]
ARRAYS = [lambda: np.zeros(8, np.int32), lambda: np.zeros(8, np.int8), lambda: np.zeros(8, np.float64),
          lambda: np.zeros((2, 4), I64), lambda: np.zeros(16, I64)[::2], _read_only, lambda: np.zeros(0, I64),
          lambda: np.zeros(1, I64), lambda: np.full(8, -1, I64), lambda: np.full(8, 1 << 62, I64),
          lambda: np.full(8, -(1 << 63), I64), lambda: np.ones(8, np.bool_), lambda: b"\0" * 64,
          lambda: torch.zeros(8, dtype=torch.int64), lambda: None, lambda: 3]


def _tree() -> list[TreeNode]:
    """root -> a (tokens 0-3) -> b (tokens 4-7), filed as the tree files them (pages of 1)."""
    from hicache.radix.read import file_child
    root = _node(key=b"", end=0)
    a = _node(parent=root)
    b = _node(key=np.arange(4, 8, dtype=I64).tobytes(), end=8, parent=a, _device=torch.arange(4, 8))
    file_child(root.children, a, 8)
    file_child(a.children, b, 8)
    return [root, a, b]


def _token(t: int) -> bytes:
    return np.array([t], I64).tobytes()


FIELDS = {  # hostile values of a node's fields
    "end": [-1, 1 << 70, -(1 << 70), None, 1.5, 2, 100],
    "key": [None, b"", bytearray(32), "abcdefgh", b"\0" * 3, np.arange(4, dtype=I64).tobytes() * 3],
    "children": [None, [], {b"x": 1}, {_token(4): 3}, {_token(4): {b"y": None}}, {_token(4): {}}],
    "_device": [None, torch.arange(4, dtype=torch.int32), torch.empty(4, dtype=torch.int64, device="meta"), _freed(),
                torch.arange(8)[::2], torch.arange(4.0, dtype=torch.float64), torch.arange(4).reshape(2, 2),
                np.arange(4), torch.arange(1 << 10)],
    "hit_count": [None, 1.5, 1 << 70, "x"],
}


def _node_cases() -> list[tuple[str, Callable[[], Any]]]:
    """Each read entry over the tree with one field of one node replaced."""
    out = []
    for field, values in FIELDS.items():
        for which in range(3):
            for i, value in enumerate(values):
                def tree(field=field, which=which, value=value):
                    nodes = _tree()
                    setattr(nodes[which], field, value)
                    return nodes
                tag = f"{field}[{which}]={i}"
                out += [(f"walk:{tag}", lambda tree=tree: R.walk(tree()[0], np.arange(8, dtype=I64), 8, None)),
                        (f"walk-hinted:{tag}", lambda tree=tree: R.walk(tree()[0], np.arange(8, dtype=I64), 8,
                                                                        tree()[1:])),
                        (f"touch:{tag}", lambda tree=tree: R.touch(tree(), 5, True)),
                        (f"gather:{tag}", lambda tree=tree: R.gather(tree()[1:], 2, np.empty(8, I64)))]
    return out


ENTRIES = {  # entry -> base arguments (made afresh per call), the positions that are ints
    "same_bytes": (S.same_bytes, lambda: [_key(), _key()], ()),
    "fresh_pages": (S.fresh_pages, lambda: [np.arange(8, dtype=I64), 0, 4, 2, np.ones(8, np.bool_),
                                            np.zeros(8, np.int32), np.empty(4, I64)], (1, 2, 3)),
    "hold": (S.hold, lambda: [np.arange(4, dtype=I64), 1, np.zeros(8, np.int32), 1], (1, 3)),
    "rows": (S.rows, lambda: [torch.arange(8), 2, np.empty(4, I64)], (1,)),
    "put": (S.put, lambda: [np.zeros(8, I64), np.arange(4, dtype=I64), np.arange(4, dtype=I64)], ()),
    "take": (P.take, lambda: [np.arange(8, dtype=I64)[::-1].copy(), 8, np.zeros(8, np.bool_), np.zeros(8, I64),
                              np.empty(8, I64), 2], (1, 5)),
    "give": (P.give, lambda: [np.zeros(8, I64), 4, np.ones(8, np.bool_), np.array([1, 2], I64)], (1,)),
    "walk": (R.walk, lambda: [_tree()[0], np.arange(8, dtype=I64), 8, None], (2,)),
    "touch": (R.touch, lambda: [_tree(), 5, True], (1,)),
    "gather": (R.gather, lambda: [_tree()[1:], 2, np.empty(8, I64)], (1,)),
}
NODE_ARGS = {"walk": {0: [object(), None, "x"], 3: [[], [object()], "x", [None]]},
             "touch": {0: [[], [object()], (_node(),), None]}, "gather": {0: [[], [object()], (_node(),), None]}}


def sweep() -> list[tuple[str, Callable[[], Any]]]:
    """Every argument of every entry replaced in turn by each hostile value of its kind."""
    out = _node_cases()
    for name, (entry, base, ints) in ENTRIES.items():
        out.append((f"{name}:base", lambda entry=entry, base=base: entry(*base())))
        out.append((f"{name}:too-few", lambda entry=entry, base=base: entry(*base()[:-1])))
        for pos in range(len(base())):
            values = INTS if pos in ints else NODE_ARGS.get(name, {}).get(pos) or ARRAYS
            for i, value in enumerate(values):
                def call(entry=entry, base=base, pos=pos, value=value):
                    args = base()
                    args[pos] = value() if callable(value) else value
                    return entry(*args)
                out.append((f"{name}:arg{pos}={i}", call))
    return out


def main(argv: list[str]) -> int:
    if argv == ["--files"]:
        print(json.dumps({m.__name__: m.__file__ for m in (R, S, P)}))
        return 0
    for name, call in [(c[0], c[1]) for c in REFUSED] + sweep():
        print(json.dumps({"start": name}), flush=True)
        try:
            got = {"case": name, "returned": repr(call())[:200]}
        except Exception as exc:  # noqa: BLE001 -- any exception is an answer; a signal is not
            got = {"case": name, "raised": type(exc).__name__, "message": str(exc)[:300]}
        print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
