"""The compiled entries under hostile arguments (issue 37 item 2), in a child process
(`tests/compiled/hostile.py`): the defects found at 06b6e45 and every refused argument
raise a TypeError or ValueError naming the argument, and the sweep of every argument of
every entry through hostile values ends with an exception or a result, never a signal.

Before the fix (06b6e45): rows and gather of an int32 tensor read 8 bytes per item
(garbage), of a strided view the storage, of a meta tensor SIGSEGV; walk below a node with
a negative end SIGSEGV; take with a page size near 2**61 SIGFPE; give(top=-3) a SystemError.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hicache.radix import read
from hicache import slot_arrays
from host_pools import allocator
from host_pools.compiled import disabled
from tests.set_up import needs

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("hostile.py")
BUILT = read.COMPILED is not None and slot_arrays.COMPILED and allocator._pages is not None
if disabled():
    pytestmark = pytest.mark.skip(reason="HICACHE_NO_C=1: nothing compiled to call")
else:  # CI proves the compiled build (.ci/run's second run proves the Python forms)
    pytestmark = needs(None if BUILT else "a module is not built, or is stale (see the warning line)",
                       "the C modules", "make setup compiles them; it needs gcc and the Python headers")


def run_child(env: dict | None = None, cwd: Path = ROOT, timeout: int = 300) -> tuple[int, dict, str]:
    """Runs every hostile call; (exit status, results by case, the case that did not end)."""
    env = {**os.environ, "PYTHONPATH": str(cwd), **(env or {})}
    run = subprocess.run([sys.executable, str(cwd / "tests/compiled/hostile.py")], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=timeout)
    results, last = {}, ""
    for line in run.stdout.splitlines():
        entry = json.loads(line)
        if "start" in entry:
            last = entry["start"]
        else:
            results[entry["case"]] = entry
    unfinished = last if last not in results else ""
    return run.returncode, results, unfinished + run.stderr[-3000:] * bool(run.returncode)


@pytest.fixture(scope="module")
def calls():
    return run_child()


if BUILT:  # the child's case list (importing it imports the compiled modules here too)
    from tests.compiled import hostile
    REFUSED = [(case, error.__name__, argument) for case, _, error, argument in hostile.REFUSED]
else:
    REFUSED = []
DEFECTS = [case for case in REFUSED if case[0].startswith("defect-")]


def test_the_case_list_is_read_whole():
    assert len(DEFECTS) == 9 and len(REFUSED) >= 50


@pytest.mark.parametrize("case, error, argument", DEFECTS, ids=[c[0] for c in DEFECTS])
def test_each_defect_is_an_error_naming_its_argument(calls, case, error, argument):
    status, results, unfinished = calls
    assert case in results, f"the child died (status {status}) in {unfinished}"
    got = results[case]
    assert got.get("raised") == error and argument in got["message"], got


def test_every_refused_argument_raises_naming_it(calls):
    status, results, unfinished = calls
    wrong = [(case, results.get(case)) for case, error, argument in REFUSED
             if results.get(case, {}).get("raised") != error or argument not in results[case]["message"]]
    assert wrong == []


def test_the_sweep_of_every_entry_ends_without_a_signal(calls):
    status, results, unfinished = calls
    assert status == 0, f"exit {status} ({signal.Signals(-status).name if status < 0 else 'error'}) in {unfinished}"
    assert len(results) > 900
    assert all(r.get("raised") or "returned" in r for r in results.values())
