"""The README's quick start is what it does (issue 28, item 18): the example verdict and the
figures quoted beside it are what `make run` prints now (read from a run of its script: the
numbers live in the README only), and a first set-up says what it is doing, step by step."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINUX = pytest.mark.skipif(sys.platform != "linux", reason="the scripts are bash scripts for Linux")


def _readme_run_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("`make run` replays")
    return text[start:text.index("Set-up (", start)]


def _rows(stdout: str) -> dict[float, dict[str, str]]:
    """The replay table's rows (header ``ratio policy  hit  device  host  storage ...``), keyed by ratio."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:3] == ["ratio", "policy", "hit"])
    header = ["ratio", "policy", *re.split(r"\s{2,}", lines[at].strip())[1:]]  # "ratio policy" has one space
    rows = {}
    for line in lines[at + 2:]:  # below the dashes, until the first line that is not a row
        cells = line.split()
        if not cells or not re.fullmatch(r"[\d.]+", cells[0]):
            break
        rows[float(cells[0])] = dict(zip(header, cells))
    return rows


@pytest.fixture(scope="module")
def make_run(tmp_path_factory) -> str:
    """stdout of `make run`'s script, its workload whole (set-up skipped: the suite runs in it);
    the folder its store went in must be empty again."""
    parent = tmp_path_factory.mktemp("run")
    env = {**os.environ, "PY": sys.executable, "PYTHONPATH": str(ROOT), "HICACHE_RUN_DIR": str(parent)}
    run = subprocess.run(["bash", "scripts/run.sh", "--no-progress"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-2000:]
    assert list(parent.iterdir()) == []  # the store was removed
    return run.stdout


@LINUX
def test_make_run_ends_with_a_verdict(make_run):
    # the flagship model through the storage tier, the rows explained, the verdict last
    lines = make_run.strip().splitlines()
    assert lines[-1].startswith("verdict: OK:") and "0 mismatches" in lines[-1], lines[-3:]
    assert any(line.startswith("workload: 333 requests") for line in lines)
    assert any(line.startswith("rows: ratio") and "0 = device only" in line for line in lines)
    assert "deepseek-v4-flash" in make_run and "storage tier: file" in make_run


@LINUX
def test_the_readmes_example_verdict_is_what_make_run_prints(make_run):
    # was: 0.96 GB and 1,050,112 tokens in the README; a run printed 1.00 GB and 1,317,632
    section = _readme_run_section()
    quoted = [line for line in section.splitlines() if line.startswith("verdict: ")]
    printed = make_run.strip().splitlines()[-1]
    assert quoted == [printed], f"README: {quoted}\nmake run: {printed}"


@LINUX
def test_the_figures_beside_the_verdict_are_what_make_run_prints(make_run):
    section = " ".join(_readme_run_section().split())
    rows = _rows(make_run)
    hits = re.search(r"rows read ([\d.]+(?: / [\d.]+)+) total hits at host ratios ((?:\d+ / )+\d+)", section)
    assert hits, "the README no longer quotes the rows' hit rates"
    ratios = [float(r) for r in hits[2].split(" / ")]
    assert hits[1].split(" / ") == [rows[r]["hit"] for r in ratios]
    host = re.search(r"\(([\d.]+) of the prompt tokens at ratio (\d+), ([\d.]+) at ratio (\d+)\) instead of from "
                     r"storage \(([\d.]+), ([\d.]+)\)", section)
    assert host, "the README no longer quotes the host and storage shares"
    for r, h, s in ((host[2], host[1], host[5]), (host[4], host[3], host[6])):
        assert (rows[float(r)]["host"], rows[float(r)]["storage"]) == (h, s)
    workload = re.search(r"workload: ([\d,]+) requests .*?([\d,]+) prompt tokens per run", make_run)
    stated = re.search(r"\((\d+) requests, ([\d.]+) M prompt tokens\)", section)
    assert workload and stated and stated[1] == workload[1].replace(",", "")
    assert stated[2] == f"{int(workload[2].replace(',', '')) / 1e6:.1f}"


@LINUX
def test_no_row_beats_its_belady_bound_storage_tier_included(make_run):
    # was: 0.742 at ratios 2 and 4 beside a Belady bound of 0.726 / 0.755 computed at device +
    # host tokens alone, while the 1 GB store under the host held the rest of the workload
    lines = make_run.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("hit rate per eviction policy"))
    checked = 0
    for line in lines[at + 3:]:
        if "|" not in line:
            break
        left, right = line.split("|")[:2]  # (a hybrid stack adds its snapshot-rule bounds after a third bar)
        hits, (lru, belady, infinite) = [float(x) for x in left.split()[2:]], map(float, right.split())
        assert all(h <= belady + 1e-9 for h in hits) and lru <= belady <= infinite, line
        checked += 1
    assert checked == 4


# ---------------------------------------------------------------- set-up says what it does

FAKE_PYTHON = r"""#!/usr/bin/env bash
# a stand-in interpreter: venv makes a copy of itself, pip calls are logged, imports succeed
# unless named in $FAKE_MISSING (until installed), the two values the script reads are printed
case "$1" in
  -m) if [ "$2" = venv ]; then mkdir -p "${@: -1}/bin"; cp "$0" "${@: -1}/bin/python"; exit 0; fi
      echo "$*" >> "$FAKE_LOG"; exit 0 ;;
  -c) for m in $FAKE_MISSING; do  # missing until pip installed it
        grep -qs "$m" "$FAKE_LOG" || case "$2" in *"import $m"*) exit 1 ;; esac
      done
      case "$2" in *"torch.__version__"*) echo 2.13.0 ;; *mooncake-transfer-engine*) echo mooncake-x ;; esac
      exit 0 ;;
esac
exit 2
"""


def _sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A tree with setup.sh and the files it stamps against, a fake python and ldconfig."""
    tree, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (tree / "scripts").mkdir(parents=True)
    (tree / "hicache" / "radix").mkdir(parents=True)
    (tree / "host_pools").mkdir()
    bin_dir.mkdir()
    (tree / "scripts" / "setup.sh").write_text((ROOT / "scripts" / "setup.sh").read_text())
    past = time.time() - 100
    for name in ("pyproject.toml", "setup.py", "hicache/radix/_read.c", "hicache/_slot_arrays.c", "host_pools/_pages.c",
                 "scripts/setup.sh"):
        (tree / name).touch()
        os.utime(tree / name, (past, past))
    for name, body in (("python", FAKE_PYTHON), ("ldconfig", "#!/bin/sh\necho '\tlibibverbs.so.1 (libc6) => x'\n")):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {**os.environ, "PYTHON": str(bin_dir / "python"), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "FAKE_LOG": str(tmp_path / "pip.log"), "FAKE_MISSING": "torch xxhash"}
    return tree, env


@LINUX
def test_a_first_set_up_says_what_it_does_one_line_per_step_and_a_later_one_is_silent(tmp_path):
    # was: ~95 s of silence on a fresh clone
    tree, env = _sandbox(tmp_path)
    first = subprocess.run(["bash", "scripts/setup.sh"], cwd=tree, env=env, capture_output=True, text=True,
                           timeout=60)
    assert first.returncode == 0, first.stderr
    lines = first.stderr.splitlines()
    assert [line.split()[2] for line in lines[:7]] == [f"{i}/7" for i in range(1, 8)], lines
    assert all(line.startswith("hicache setup: ") for line in lines) and len(lines) == 8
    assert "installing torch==2.13.0" in lines[1] and "installing xxhash" in lines[3]
    assert re.fullmatch(r"hicache setup: done in \d+ s; .*", lines[-1])
    assert first.stdout == ""
    pip = (tmp_path / "pip.log").read_text()
    assert "torch==2.13.0" in pip and "xxhash" in pip and "numpy" not in pip
    again = subprocess.run(["bash", "scripts/setup.sh"], cwd=tree, env=env, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and again.stderr == "" and again.stdout == ""
