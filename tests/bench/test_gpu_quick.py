"""``scripts/gpu_check.sh quick`` / ``bench/gpu_quick.py``: arguments, the one JSON it
writes and reads back, and the targets computed from the rows (CPU; the GPU steps are
replaced by stand-ins that write what the real ones write)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_quick
from hicache.cost import load_profile, profile_dict

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _row(backend, direction, **kw):
    return dict(model="deepseek-v4-pro:61", layout="page_first", dir=direction, pages=16, ops=1,
                backend=backend, **kw)


def _sh(*args, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env))


@pytest.mark.parametrize("args", [[], ["quick", "out", "abc"], ["quick", "out", "5"],
                                  ["quick", "out", "900"], ["quick", "a", "60", "extra"]])
def test_the_script_refuses_bad_arguments_in_one_line(args):
    got = _sh(*args)
    assert got.returncode == 2 and len(got.stderr.strip().splitlines()) == 1 and not got.stdout


def test_quick_hands_its_folder_and_budget_to_gpu_quick(tmp_path):
    fake = tmp_path / "python"  # stands in for the interpreter: prints what it was asked to run
    fake.write_text("#!/bin/sh\necho \"$@\"\n")
    fake.chmod(0o755)
    got = _sh("quick", str(tmp_path / "o"), "120", PYTHON=str(fake))
    assert got.returncode == 0
    assert got.stdout.split() == ["bench/gpu_quick.py", "--out", str(tmp_path / "o"), "--budget-s", "120"]
    got = _sh("quick", PYTHON=str(fake), GPU_QUICK_SMOKE="1")
    assert got.stdout.split() == ["bench/gpu_quick.py", "--out", "bench/results/local/gpu_quick",
                                  "--budget-s", "360", "--smoke"]


def test_targets_read_the_rows_and_say_met_not_met_or_not_measured():
    load = [_row("auto", "h2d", frac=0.9, cmp_ratio=0.8, compute_slowdown=0.02, bidir_x=1.7, e2e_us=100.0),
            _row("triton", "h2d", e2e_us=95.0), _row("dma", "h2d", e2e_us=80.0),
            _row("auto", "d2h", frac=0.95, e2e_us=50.0), _row("dma", "d2h", e2e_us=48.0)]
    host_only = [_row("auto", "h2d", mode="trusted", host_us=160.0)]
    got = {t["target"].split(" >=")[0].split(" <=")[0]: (t["value"], t["met"])
           for t in gpu_quick.targets(load, host_only)}
    assert got["16-page load, end to end / one-shot copy, idle (auto)"] == (0.9, True)
    assert got["same beside bf16 GEMMs (frac x cmp_ratio)"][1] is False  # 0.72
    assert got["host enqueue, us (auto, --host-only, trusted)"] == (160.0, False)
    assert got["load + backup at once / one way"] == (1.7, True)
    assert got["auto / best backend, h2d 16 pages x 1 op"] == (1.25, False)
    assert got["auto / best backend, d2h 16 pages x 1 op"][1] is True
    missing = gpu_quick.targets([], [])
    assert all(t["value"] is None and t["met"] is None for t in missing)


def test_a_run_writes_one_json_that_reads_back(tmp_path, monkeypatch, capsys):
    rows = [_row("auto", "h2d", frac=0.9, e2e_us=10.0)]

    measured = profile_dict(load_profile("h100"))
    measured["h2d"]["gbps"] *= 2

    def commands(out, smoke):  # each step: what the real one writes, in a second or less
        write = f"import json; json.dump({{'rows': {rows!r}}}, open({str(out / 'load.json')!r}, 'w'))"
        profile = f"import json; json.dump({measured!r}, open({str(out / 'profile.json')!r}, 'w'))"
        return {"tests": [sys.executable, "-c", "print('3 passed')"],
                "load": [sys.executable, "-c", write],
                "host_only": [sys.executable, "-c", "raise SystemExit(3)"],
                "verify": [sys.executable, "-c", "raise SystemExit(1)"],
                "profile": [sys.executable, "-c", profile]}
    monkeypatch.setattr(gpu_quick, "step_commands", commands)
    assert gpu_quick.main(["--out", str(tmp_path), "--budget-s", "600"]) == 1  # two steps failed
    doc = gpu_quick.read(tmp_path / "gpu_quick.json")
    assert [doc["steps"][s]["rc"] for s in gpu_quick.STEPS] == [0, 0, 3, 1, 0]
    assert doc["load"] == rows and doc["host_only"] == [] and doc["verify_ok"] is False
    assert "3 passed" in doc["steps"]["tests"]["tail"]
    assert doc["profile"]["h2d"]["gbps"] == measured["h2d"]["gbps"]  # the measured profile, beside the shipped
    assert doc["profile_vs_h100"]["h2d.gbps"] == 2.0 and doc["profile_vs_h100"]["prefill.hbm_gbps"] == 1.0
    assert gpu_quick.main(["--read", str(tmp_path / "gpu_quick.json")]) == 0
    out = capsys.readouterr().out
    assert "not measured" in out and "measured profile / shipped h100: h2d.gbps 2.00" in out


def test_a_step_past_its_share_of_the_budget_is_stopped(tmp_path):
    got = gpu_quick.run_step("slow", [sys.executable, "-c", "import time; time.sleep(60)"], 1.0, tmp_path)
    assert got["rc"] == 124 and got["seconds"] < 60


@pytest.mark.parametrize("argv", [["--steps", "tests,nope", "--out", "x"], [], ["--out", "x", "--budget-s", "1"],
                                  ["--read", "/nonexistent/gpu_quick.json"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_quick.main(argv)
    assert exc.value.code == 2 and "Traceback" not in capsys.readouterr().err


def test_read_refuses_another_json(tmp_path):
    other = tmp_path / "x.json"
    other.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match=str(other)):
        gpu_quick.read(other)
