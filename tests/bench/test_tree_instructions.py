"""``bench/tree_instructions.py``: its dump parsing, ratios and refusals, and (where
valgrind, its headers and a C compiler are installed) one counted phase."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from bench import tree_instructions as ti


def test_summary_reads_the_collected_instructions_and_refuses_another_file(tmp_path):
    dump = tmp_path / "x.out.1"
    dump.write_text("version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 1315716\ntotals: 1315716\n")
    assert ti.summary(dump) == 1315716
    other = tmp_path / "y"
    other.write_text("events: Ir\n")
    with pytest.raises(ValueError, match="no 'summary:' line"):
        ti.summary(other)


def test_rows_sum_the_phases_and_give_the_other_sides_over_ours():
    counts = {("ours", 64, "lru", "match"): 60.0, ("ours", 64, "lru", "insert"): 120.0,
              ("ours", 64, "lru", "step"): 80.0, ("ours", 64, "lru", "decide"): 13.0,
              ("before", 64, "lru", "match"): 60.0, ("before", 64, "lru", "insert"): 180.0,
              ("before", 64, "lru", "step"): 120.0,
              ("sglang", 64, "lru", "match"): 80.0, ("sglang", 64, "lru", "path"): 30.0,
              ("sglang", 64, "lru", "insert"): 400.0, ("sglang", 64, "lru", "step"): 240.0}
    rows = {r["side"]: r for r in ti.rows_of(counts)}
    ours = rows["ours"]
    assert (ours["match_insert"], ours["same_work"]) == (180.0, 180.0)
    assert ours["decide_share"] == pytest.approx(13 / 260) and "decide_share" not in rows["before"]
    assert ours["before_over_ours_match_insert"] == pytest.approx(240 / 180)
    assert ours["before_over_ours_step"] == pytest.approx(1.5)
    assert ours["sglang_over_ours_match_insert"] == pytest.approx(480 / 180)
    assert ours["sglang_over_ours_same_work"] == pytest.approx(510 / 180)
    assert ours["sglang_over_ours_step"] == pytest.approx(3.0)
    assert rows["sglang"]["same_work"] == 510.0 and "sglang_over_ours_step" not in rows["sglang"]


@pytest.mark.parametrize("argv, message", [
    (["--hicache-eviction-policy", "nope"], "--hicache-eviction-policy: ['nope'] not in"),
    (["--conversations", "0"], "--conversations: need at least 1"),
    (["--before", "/nonexistent/checkout"], "--before: /nonexistent/checkout is not a checkout"),
])
def test_bad_arguments_are_named_without_a_traceback(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        ti.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_without_valgrind_it_says_so_and_stops(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert ti.main(["--pages", "64", "--out", str(tmp_path / "x.json")]) == 2
    assert "valgrind is not installed" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def _can_count() -> bool:
    return (shutil.which("valgrind") is not None and (shutil.which("cc") or shutil.which("gcc")) is not None
            and Path("/usr/include/valgrind/callgrind.h").exists())


@pytest.mark.skipif(not _can_count(), reason="valgrind, its headers or a C compiler is missing")
def test_one_phase_is_counted_and_only_that_phase(tmp_path):
    helper = ti.helper_for(sys.executable, tmp_path / "helper")
    step = ti.count("ours", sys.executable, helper, "step", 64, "lru", 1, None, tmp_path)
    # a step (launch + poll of one backup) is thousands of instructions, far below the
    # whole process's (hundreds of millions: torch's import alone)
    assert 5_000 < step < 1_000_000


def test_our_turns_weigh_the_load_decision_between_match_and_insert():
    turns, code = ti._ours_turns(64, "lru", 1)
    first = [name for name in next(iter(turns))]
    assert first == ["match", "decide", "alloc", "insert", "step", None]
    assert Path(code()) == Path(ti.ROOT)
