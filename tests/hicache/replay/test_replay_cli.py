"""`hicache replay` at its edges: storage flags without a backend, a backend that cannot run,
runs whose transfers all fail, an unwritable --plot, odd numbers in float flags."""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hicache.replay.cli as replay_mod
import transfer_kernels.backends.triton as triton_backend
from hicache import HiCacheConfig, build
from hicache.cli import main
from hicache.models import preset
from hicache.radix.policies.adaptive import CANDIDATES
from hicache.replay.run import RunStats
from host_pools.memory import HostBudget

TINY = ["--no-progress", "--max-requests", "3", "--device-tokens", "4096", "--layers", "1", "--hicache-ratio", "2",
        "--allow-device-only"]  # 3 requests fit the device: nothing restored (NOT CHECKED, accepted)
BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)
build_mod = importlib.import_module("hicache.build")  # `hicache.build` itself is the function


def one_line_error(capsys, code: int, *names: str) -> str:
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert code == 2 and out.out == "", (code, out)
    assert len(lines) == 1 and all(n in lines[0] for n in names) and "Traceback" not in out.err, out.err
    return lines[0]


def no_runs(monkeypatch) -> list[float]:
    """Replace the runs by a record of their ratios: what is checked before the first run still runs."""
    ratios: list[float] = []

    def record(args, stack, requests, ratio, *rest):
        ratios.append(ratio)
        return RunStats(ratio, requests=len(requests), tokens_total=1)
    monkeypatch.setattr(replay_mod, "replay_one", record)
    return ratios


# ---------------------------------------------------------------- storage flags without a backend

STORAGE_ONLY = [("--hicache-storage-dir", "/tmp/hicache-test-pages"), ("--hicache-storage-master", "10.0.0.2:1"),
                ("--hicache-storage-capacity", "3"), ("--hicache-storage-prefetch-policy", "best_effort"),
                ("--hicache-storage-prefetch-timeout", "9"), ("--hicache-storage-write-policy", "write_back"),
                ("--hicache-storage-optional",), ("--hicache-storage-model-id", "org/model@rev")]


@pytest.mark.parametrize("argv", STORAGE_ONLY, ids=[a[0] for a in STORAGE_ONLY])
def test_storage_flag_without_a_backend_is_refused_before_any_run(monkeypatch, capsys, argv):
    # was: silently ignored, the replay ran without a storage tier
    ratios = no_runs(monkeypatch)
    line = one_line_error(capsys, main(["replay", *TINY, *argv]), argv[0], "--hicache-storage-backend")
    assert line.startswith(f"hicache replay: error: {argv[0]}: has no effect without") and ratios == []


# ---------------------------------------------------------------- a backend that cannot run


def test_triton_backend_without_triton_is_refused_at_start(monkeypatch, capsys):
    # was: exit 0, 0 pages backed up, the acks carrying "No module named 'triton'"
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` fails, find_spec finds nothing
    ratios = no_runs(monkeypatch)
    line = one_line_error(capsys, main(["replay", *TINY, "--hicache-io-backend", "triton"]),
                          "--hicache-io-backend", "triton package is not installed")
    assert "use auto, copy_engine or torch" in line and ratios == []


def test_build_refuses_an_unusable_backend_before_allocating(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(ValueError, match=r"io_backend \(--hicache-io-backend\): 'triton' cannot run here"):
        build(preset("deepseek-v3", 1), 4096, HiCacheConfig(io_backend="triton"), device="cpu", budget=BIG)
    # a broken install (the import itself fails) is named too
    monkeypatch.setitem(sys.modules, "triton", importlib)  # present, so find_spec succeeds

    def broken():
        raise ImportError("libtriton.so: cannot open shared object file")
    monkeypatch.setattr(triton_backend, "kernel_module", broken)
    with pytest.raises(ValueError, match="ImportError: libtriton.so"):
        build(preset("deepseek-v3", 1), 4096, HiCacheConfig(io_backend="triton"), device="cpu", budget=BIG)
    # "auto" falls back by itself: never refused
    build(preset("deepseek-v3", 1), 4096, HiCacheConfig(io_backend="auto"), device="cpu", budget=BIG).close()


def test_a_run_whose_every_transfer_fails_says_so_and_exits_1(monkeypatch, capsys):
    # the start-up check bypassed: every launch now fails the way a missing triton did
    for module in (build_mod, replay_mod):
        monkeypatch.setattr(module, "check_backend_usable", lambda backend: None)

    def missing():
        raise ModuleNotFoundError("No module named 'triton'")
    monkeypatch.setattr(triton_backend, "kernel_module", missing)
    assert main(["replay", *TINY, "--max-requests", "20", "--json", "--hicache-io-backend", "triton"]) == 1
    out = capsys.readouterr()
    base, hier = json.loads(out.out)["runs"]  # the rows are still printed
    assert base["transfers_failed"] == 0 and hier["transfers_failed"] > 0 and hier["bytes_d2h"] == 0
    assert out.err.strip() == ("hicache replay: error: ratio 2: every transfer failed "
                               f"({hier['transfers_failed']} backups and loads rolled back, the host tier never "
                               "served): ModuleNotFoundError: No module named 'triton'")


def test_some_failed_transfers_are_a_warning(monkeypatch, capsys):
    runs = [RunStats(0.0), RunStats(2.0, transfers_ok=9, transfers_failed=1, transfer_error="RuntimeError: x")]
    monkeypatch.setattr(replay_mod, "replay_one", lambda args, stack, requests, ratio, *rest: runs.pop(0))
    assert main(["replay", *TINY, "--json"]) == 0
    assert capsys.readouterr().err.strip() == ("hicache replay: warning: ratio 2: 1 of 10 transfers failed "
                                               "(rolled back): RuntimeError: x")


# ---------------------------------------------------------------- --plot checked at start


def test_plot_under_a_file_is_refused_before_the_runs(tmp_path, monkeypatch, capsys):
    # was: accepted (the folder test saw a writable file), then failed after the whole run
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    ratios = no_runs(monkeypatch)
    one_line_error(capsys, main(["replay", *TINY, "--plot", str(tmp_path / "notes.txt" / "hit.png")]), "--plot")
    assert ratios == [] and (tmp_path / "notes.txt").read_text() == "a file, not a folder"


def test_plot_check_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    # the check creates the file the way the plot will, then removes it: a run that ends
    # early (Ctrl-C) leaves no empty file
    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(replay_mod, "replay_one", interrupted)
    assert main(["replay", *TINY, "--plot", str(tmp_path / "hit.png")]) == 130
    assert list(tmp_path.iterdir()) == []
    capsys.readouterr()


def test_plot_into_a_missing_folder_is_refused_not_created(tmp_path, monkeypatch, capsys):
    # issue 23 item 13: was created (a mistyped folder silently appeared)
    ratios = no_runs(monkeypatch)
    line = one_line_error(capsys, main(["replay", *TINY, "--plot", str(tmp_path / "a" / "b" / "hit.png")]),
                          "--plot", "does not exist")
    assert ratios == [] and list(tmp_path.iterdir()) == [], line


# ---------------------------------------------------------------- odd numbers, never a traceback

REPLAY_FLOATS = ["--hicache-ratio", "--swa-full-tokens-ratio", "--hicache-host-headroom"]
ODD = st.one_of(st.sampled_from(["nan", "inf", "-0", "0", "5e-324", "1e-300", "1e300", "1.8e308", "1e6", "1e7",
                                 "1,1e300", "-1"]), st.floats(allow_nan=False).map(repr))


@settings(derandomize=True, deadline=None, max_examples=80)
@given(flag=st.sampled_from(REPLAY_FLOATS), value=ODD,
       model=st.sampled_from(["deepseek-v3", "deepseek-v4-flash"]))
def test_replay_float_flags_are_taken_or_refused_naming_the_flag(flag, value, model):
    ratios: list[float] = []

    def record(args, stack, requests, ratio, *rest):
        ratios.append(ratio)
        return RunStats(ratio, requests=len(requests), tokens_total=1)
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.setattr(replay_mod, "replay_one", record)
        code = main(["replay", *TINY, "--model", model, f"{flag}={value}"])
    if code == 2:
        lines = err.getvalue().strip().splitlines()
        assert out.getvalue() == "" and len(lines) == 1 and flag in lines[0] and ratios == [], err.getvalue()
    else:
        assert code == 0 and ratios and err.getvalue() == "", err.getvalue()


def test_absurd_thread_count_names_the_flag(capsys):
    # was: "Overflow when unpacking long" (torch's message, no flag)
    one_line_error(capsys, main(["replay", *TINY, "--threads", "99999999999"]), "--threads")


def test_swa_share_below_one_row_names_the_flag(capsys):
    # was: a RuntimeError traceback from a reshape of the 0-row SWA pool
    line = one_line_error(capsys, main(["replay", *TINY, "--model", "deepseek-v4-flash", "--swa-full-tokens-ratio",
                                        "0.001"]), "--swa-full-tokens-ratio")
    assert "less than one swa row (128 tokens)" in line


# ---------------------------------------------------------------- the summary (issue 23 item 15)


def test_the_table_ends_with_the_workload_the_rows_legend_and_a_verdict(capsys):
    assert main(["replay", "--no-progress", "--max-requests", "40", "--device-tokens", "8192", "--layers", "1",
                 "--hicache-ratio", "4"]) == 0
    *_, workload, rows, bounds, verdict = capsys.readouterr().out.strip().splitlines()
    assert workload.startswith("workload: 40 requests of the built-in multi-turn chat") and "prompt tokens" in workload
    assert "0 = device only" in rows and "Belady = no eviction policy can beat it" in bounds
    assert verdict.startswith("verdict: OK: 2 runs,") and "0 mismatches" in verdict and "restored" in verdict


def test_a_replay_that_restored_nothing_says_so_in_its_verdict(capsys):
    assert main(["replay", *TINY]) == 0  # 3 requests: everything fits on the device
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("verdict: NOT CHECKED: nothing came back from host or storage"), verdict


def test_json_output_stays_one_object(capsys):
    assert main(["replay", *TINY, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"runs", "verdict", "verdict_line"}
    for run in doc["runs"]:  # the default policy says which score ranked at the end, why, and its memory
        assert run["eviction_policy"] == "adaptive" and run["live_score"] in CANDIDATES
        assert set(run["score_why"]) == set(CANDIDATES) and run["score_switches"] >= 0
        assert run["policy_memory_bytes"] >= 0


def test_the_table_shows_the_live_score(capsys):
    assert main(["replay", *TINY, "--hicache-eviction-policy", "tiered"]) == 0
    out = capsys.readouterr().out
    assert "live score" in out and "device:lfuda,host:lru" in out
