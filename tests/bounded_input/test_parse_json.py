"""`parse_json` (issue 37 item 5): depth, digits and size refused before the parser runs,
every refusal one line naming the source and the line; what passes parses as json does.
And no JSON reaches the project past it."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bounded_input import MAX_DEPTH, MAX_DIGITS, parse_json

ROOT = Path(__file__).resolve().parents[2]

REFUSED = {  # document (starting on line 7 of its source) -> the one line
    "deep": ("[" * 200_000, "src: line 7: nested deeper than 64 levels, the limit of a JSON document"),
    "deep on line 3": ('{"a":\n\n' + "{" * 70, "src: line 9: nested deeper than 64 levels"),
    "digits": ('{"a": ' + "9" * 5000 + "}", "src: line 7: a number of more than 64 digits"),
    "digits of a float": ("[0." + "1" * 65 + "]", "src: line 7: a number of more than 64 digits"),
    "size": (" " * ((1 << 20) + 1), "src: line 7: more than 1,048,576 bytes, the limit of a JSON document"),
    "not utf-8": (b'{"a":\n "\xc3("}', "src: line 8: not UTF-8 text (byte 0xc3 at column 3)"),
    "not json": ('{"a": 1,\n "b": }', "src: line 8: not valid JSON (Expecting value, column 7)"),
    "unterminated string": ('"' + '\\"' * 100_000, "src: line 7: not valid JSON (Unterminated string"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_each_refusal_is_one_line_naming_the_source_and_the_line(case):
    doc, message = REFUSED[case]
    with pytest.raises(ValueError) as info:
        parse_json(doc, "src", 7)
    assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)


def test_the_bounds_themselves_pass_and_strings_do_not_count():
    at_depth = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_json(at_depth, "src") == json.loads(at_depth)
    assert parse_json("9" * MAX_DIGITS, "src") == int("9" * MAX_DIGITS)
    quoted = json.dumps({"a": "[" * 500 + "7" * 500, "b": ["{\\\"" * 100]})  # brackets and digits in strings
    assert parse_json(quoted, "src") == json.loads(quoted)
    wide = json.dumps([[i] for i in range(1000)])  # many brackets, two levels
    assert parse_json(wide, "src") == json.loads(wide)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.text(max_size=8)
                    | st.floats(allow_nan=False),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                    max_leaves=20)


@settings(max_examples=50, deadline=None)
@given(JSON)
def test_what_passes_parses_as_json_does(doc):
    text = json.dumps(doc)
    assert parse_json(text, "src") == json.loads(text)
    assert parse_json(text.encode(), "src") == json.loads(text)


def _json_loads_calls(path: Path) -> list[int]:
    text, lines = path.read_text(), []
    if "json" not in text:
        return lines
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("load", "loads") \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "json":
            lines.append(node.lineno)
    return lines


def test_no_module_of_the_project_parses_json_past_the_bounded_parser():
    found = {str(p.relative_to(ROOT)): lines for pkg in ("hicache", "host_pools", "transfer_kernels")
             for p in sorted((ROOT / pkg).rglob("*.py")) if (lines := _json_loads_calls(p))}
    assert found == {}, f"json.load(s) outside bounded_input (use bounded_input.parse_json / read_json): {found}"
