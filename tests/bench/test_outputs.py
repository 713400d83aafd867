"""Benchmarks and the README's commands write where the user says, or to a git-ignored
folder: never over the tracked results in bench/results/, never into the current folder."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import harness

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists() or shutil.which("git") is None,
                                reason="needs a git checkout")


def ignored(path: Path) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT).returncode == 0


def test_default_results_folder_is_git_ignored():
    assert harness.RESULTS_DIR != harness.PUBLISHED_DIR and ignored(harness.RESULTS_DIR / "h2d_cpu.json")
    assert not ignored(harness.PUBLISHED_DIR / "h2d_cpu.json")  # the README's numbers stay tracked


def test_scripts_take_their_default_paths_from_the_harness():
    # only the harness names bench/results; every script's default goes through RESULTS_DIR
    named = [p.name for p in (ROOT / "bench").glob("*.py")
             if p.name != "harness.py" and re.search(r"""["']results["']""", p.read_text())
]
    assert named == []
    from bench import allocator, controller, replay
    assert allocator.DEFAULT_OUT.parent == harness.RESULTS_DIR
    assert Path(controller.RESULTS) == harness.RESULTS_DIR
    assert replay.PLOT.parent == harness.RESULTS_DIR and ignored(replay.PLOT)


def test_readme_commands_write_nothing_tracked_or_into_the_checkout_root():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"--(?:plot|out)[ =](\S+)", readme)
    assert targets, "the README names no output path"
    for target in targets:
        path = (ROOT / target).resolve()
        assert path.parent != ROOT and (not path.is_relative_to(ROOT) or ignored(path)), target


# ---------------------------------------------------------------- issue 23 item 11

SIDES = {"sglang_anchor.py", "sglang_controller.py", "sglang_cpu_anchor.py"}  # SGLang's side, in its interpreter


def runnable_benches() -> set[str]:
    return {p.stem for p in (ROOT / "bench").glob("*.py")
            if '__name__ == "__main__"' in p.read_text() and p.name not in SIDES}


def test_no_bench_writes_to_the_shared_system_temp_folder():
    # was: load_batch and triton_grid wrote JSON there, storage its scratch store, vllm_multiturn its logs
    temp = re.compile(r"gettempdir|/tmp\b|mkdtemp\((?![^)]*dir=)|TemporaryDirectory\((?![^)]*dir=)")
    named = [p.name for p in (ROOT / "bench").glob("*.py") if temp.search(p.read_text())]
    assert named == []


def test_every_bench_takes_out_and_hicache_bench_runs_each():
    from hicache.cli.command import BENCHES
    assert set(BENCHES) == runnable_benches()  # was: load_batch missing
    lacking = [n for n in BENCHES if not re.search(r"""["']--out["']""", (ROOT / "bench" / f"{n}.py").read_text())]
    assert lacking == []  # was: controller


def test_controller_bench_writes_where_out_says(tmp_path):
    import torch
    from bench import controller
    out, threads = tmp_path / "c.json", torch.get_num_threads()
    try:
        assert controller.run(["--reps", "2", "--layers", "1", "--backend", "null", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # the bench pins one thread
    assert json.loads(out.read_text())["bench"] == "controller"


def test_replay_bench_out_names_the_plot():
    from bench.replay import PLOT, replay_argv
    assert replay_argv(["--out", "x.png"]) == ["replay", "--plot", "x.png"]
    assert replay_argv(["--out=x.png"]) == ["replay", "--plot=x.png"]
    assert replay_argv(["--json"]) == ["replay", "--json", "--plot", str(PLOT)]


def test_storage_bench_scratch_goes_under_the_results_folder_and_is_removed(tmp_path, monkeypatch):
    # was: a mkdtemp in the system temp folder; and a --dir of the user's was removed whole
    from bench import storage
    monkeypatch.setattr(harness, "RESULTS_DIR", tmp_path / "local")
    seen = []
    real = storage.bench_file
    monkeypatch.setattr(storage, "bench_file", lambda root, case: seen.append(root) or real(root, case))
    small = ["--backends", "file", "--pools", "dsv4:c128_kv", "--batch-pages", "2", "--budget-mb", "1"]
    assert storage.main([*small, "--out", str(tmp_path / "a.json")]) == 0
    assert seen[0].parent == tmp_path / "local" and not seen[0].exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert storage.main([*small, "--dir", str(mine), "--out", str(tmp_path / "b.json")]) == 0
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_replay_bounds_bench_repeats_the_trace_with_nothing_shared():
    from bench.replay import repeated_trace
    from hicache.replay.bounds import TraceBounds
    one, two = repeated_trace(1)[:300], repeated_trace(2)
    half = len(two) // 2
    assert [r.input_length for r in two[half:half + 300]] == [r.input_length for r in one]
    assert not {h for r in two[:half] for h in r.hash_ids} & {h for r in two[half:] for h in r.hash_ids}
    # the second copy finds nothing of the first: twice the trace, the same infinite-cache rate
    assert TraceBounds(two, 256).infinite == pytest.approx(TraceBounds(two[:half], 256).infinite)
