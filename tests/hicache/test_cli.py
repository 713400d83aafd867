"""The `hicache` command: every user mistake is one line naming the flag (no traceback), the
plot is optional and never lands in the current folder unasked, Ctrl-C keeps finished rows,
``--help`` imports no torch, odd numbers in float flags never crash."""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import hicache.replay.cli as replay_mod
from hicache.config import DEFAULT_EVICTION_POLICY
from hicache.cli import SUBCOMMANDS, build_parser, chosen_command, load, main
from hicache.replay.run import RunStats

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--no-progress", "--max-requests", "3", "--device-tokens", "4096", "--layers", "1", "--hicache-ratio", "2",
        "--allow-device-only"]  # 3 requests fit the device: nothing restored (NOT CHECKED, accepted)
GOOD = '{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}'


def assert_one_line_error(capsys, code: int, flag: str) -> str:
    out = capsys.readouterr()
    assert code in (1, 2), (code, out.err)
    assert out.out == ""  # nothing replayed or planned
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in out.err, out.err
    return lines[0]


@pytest.mark.parametrize("argv, flag", [
    (["--hicache-ratio", "nan"], "--hicache-ratio"),
    (["--hicache-ratio", "1,inf"], "--hicache-ratio"),
    (["--hicache-ratio", "1000000"], "--hicache-ratio"),  # host pools past this machine's budget
    (["--device-tokens", "0"], "--device-tokens"),  # used to mean "the default" silently
    (["--device-tokens", "-64"], "--device-tokens"),
    (["--device-tokens", str(1 << 50)], "--device-tokens"),  # absurd
    (["--device-tokens", str(1 << 36)], "--device-tokens"),  # plausible number, past this machine's memory
    (["--layers", "62"], "--layers"),  # deepseek-v3 has 61
    (["--layers", "0"], "--layers"),
    (["--model", "gpt-5"], "--model"),
    (["--trace", "/nonexistent/trace.jsonl"], "--trace"),
    (["--device", "banana"], "--device"),
    (["--device", "meta"], "--device"),
    (["--device", "cuda:99"], "--device"),
    (["--hicache-write-policy", "sometimes"], "--hicache-write-policy"),
    (["--swa-full-tokens-ratio", "nan"], "--swa-full-tokens-ratio"),
    (["--threads", "0"], "--threads"),
    (["--max-requests", "0"], "--max-requests"),
    (["--max-requests", "two"], "--max-requests"),
])
def test_replay_mistakes_are_one_line_naming_the_flag(capsys, argv, flag):
    assert_one_line_error(capsys, main(["replay", "--no-progress", "--max-requests", "2", *argv]), flag)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_replay_on_cuda_without_cuda_says_so(capsys):
    line = assert_one_line_error(capsys, main(["replay", "--device", "cuda", "--max-requests", "2"]), "--device")
    assert "no CUDA device" in line


@pytest.mark.parametrize("argv, flag", [
    (["--device-gib", "inf"], "--device-gib"),
    (["--device-gib", "nan"], "--device-gib"),
    (["--device-gib", "1e-12"], "--device-gib"),  # less than a page
    (["--device-gib", "1e30"], "--device-gib"),
    (["--device-tokens", "0"], "--device-tokens"),
    (["--device-tokens", str(10 ** 20)], "--device-tokens"),
    (["--layers", "62"], "--layers"),  # deepseek-v4-pro has 61
    (["--hicache-ratio", "nan"], "--hicache-ratio"),
    (["--device-tokens", "x"], "--device-tokens"),
])
def test_plan_mistakes_are_one_line_naming_the_flag(capsys, argv, flag):
    assert_one_line_error(capsys, main(["plan", *argv]), flag)


def test_trace_that_is_not_utf8_names_its_line(tmp_path, capsys):
    trace = tmp_path / "latin1.jsonl"
    trace.write_bytes(GOOD.encode() + b"\n" + '{"note": "café"}'.encode("latin-1") + b"\n")
    line = assert_one_line_error(capsys, main(["replay", "--trace", str(trace), "--no-progress"]), "--trace")
    assert "line 2: not UTF-8 text (byte 0xe9" in line


def test_trace_that_is_a_folder_is_refused(tmp_path, capsys):
    assert_one_line_error(capsys, main(["replay", "--trace", str(tmp_path), "--no-progress"]), "--trace")


def test_plot_is_written_only_when_asked_at_the_printed_absolute_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # 1. no --plot: nothing is written anywhere under the current folder
    assert main(["replay", *TINY]) == 0
    assert list(tmp_path.iterdir()) == [] and "plot:" not in capsys.readouterr().out
    # 2. --plot with a relative path: written there, the absolute path printed
    (tmp_path / "figs").mkdir()  # the folder must exist (issue 23 item 13)
    assert main(["replay", *TINY, "--plot", "figs/hit.png"]) == 0
    out = capsys.readouterr().out
    assert f"plot: {tmp_path / 'figs' / 'hit.png'}" in out and (tmp_path / "figs" / "hit.png").stat().st_size > 0


def test_plot_into_a_folder_path_is_refused_before_the_runs(tmp_path, capsys):
    assert_one_line_error(capsys, main(["replay", *TINY, "--plot", str(tmp_path)]), "--plot")


def test_missing_matplotlib_is_refused_before_the_first_run(tmp_path, monkeypatch, capsys):
    # issue 28 item 12: was a hint after every run had finished (the plot asked for, never drawn)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    plot = tmp_path / "hit.png"
    line = assert_one_line_error(capsys, main(["replay", *TINY, "--json", "--plot", str(plot)]), "--plot")
    assert "matplotlib, which is not installed" in line and "pip install matplotlib" in line and not plot.exists()


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_prints_the_finished_runs_and_one_line(monkeypatch, capsys, as_json):
    def one_run_then_ctrl_c(args, stack, requests, ratio, *rest):
        if ratio > 0:
            raise KeyboardInterrupt
        return RunStats(ratio, requests=len(requests), tokens_total=1000, device_hit_tokens=250)

    monkeypatch.setattr(replay_mod, "replay_one", one_run_then_ctrl_c)
    assert main(["replay", "--no-progress", "--max-requests", "2", *(["--json"] if as_json else [])]) == 130
    out = capsys.readouterr()
    if as_json:
        assert [r["hit_rate"] for r in json.loads(out.out)["runs"]] == [0.25]
    else:
        assert out.out.splitlines()[3].split()[:3] == ["0", DEFAULT_EVICTION_POLICY, "0.250"]  # title, head, rule, the run
    assert out.err.strip() == "hicache replay: interrupted (Ctrl-C) after 1 of 4 runs; the rows above are the finished runs"


def _cli(*argv: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "hicache.cli", *argv], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_the_command_itself_exits_without_a_traceback():
    proc = _cli("replay", "--device", "banana")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == ""
    assert err.strip() == "hicache replay: error: --device: must be cpu, cuda or cuda:N, got 'banana'"


# The child replays the baseline for real, then blocks inside the second run's second
# request until SIGINT arrives (a line on stderr says it is there): the signal can never
# come too late, however loaded the machine. SIGINT's handler is set explicitly, since a
# child started from a background job inherits it ignored.
SIGINT_CHILD = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from hicache.cli import main
from hicache.replay.run import Replayer
serve = Replayer.serve

def serve_until_sigint(self, i, req):
    if self.stats.hicache_ratio > 0 and i == 1:
        print("test: blocked in the second run", file=sys.stderr, flush=True)
        while True:
            time.sleep(0.01)
    return serve(self, i, req)

Replayer.serve = serve_until_sigint
sys.exit(main(sys.argv[1:]))
"""


def test_sigint_during_a_replay_ends_it_with_the_finished_rows():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SIGINT_CHILD, "replay", "--layers", "1", "--device-tokens",
                             "8192", "--hicache-ratio", "4", "--max-requests", "20"], cwd=ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = []
    for line in iter(proc.stderr.readline, ""):
        seen.append(line)
        if line.startswith("test: blocked"):
            break
    assert seen and seen[-1].startswith("test: blocked"), "".join(seen)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted (Ctrl-C) after 1 of 2 runs" in err
    assert out.splitlines()[3].split()[0] == "0"  # title, head, rule, the baseline row


# ---------------------------------------------------------------- start-up: no torch for --help

HEAVY = ("torch", "numpy", "triton", "hicache.integrations.vllm.serve", "hicache.replay.cli", "hicache.cli.checks")


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["replay", "--help"], ["bench", "--help"],
                                  ["no-such-command"]])
def test_help_imports_no_torch(argv):
    code = ("import sys\nfrom hicache.cli import main\ncode = main(sys.argv[1:])\n"
            f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules], code)")
    run = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    loaded = run.stdout.strip().splitlines()[-1]
    assert loaded == f"LOADED [] {2 if argv == ['no-such-command'] else 0}", run.stdout + run.stderr


def test_top_level_help_lists_every_subcommand_and_each_subcommand_parses(capsys):
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"    {name}" in listed for name in SUBCOMMANDS)
    parser = build_parser(every=True)  # every flags module imports and adds its flags
    assert parser.parse_args(["plan", "--model", "llama-3.1-8b"]).model == "llama-3.1-8b"
    assert all(callable(load(spec.run)) and callable(load(spec.add_args)) for spec in SUBCOMMANDS.values())


def test_chosen_command_is_the_first_word():
    assert chosen_command(["--help"]) is None and chosen_command(["replay", "--trace", "plan"]) == "replay"
    assert chosen_command(["gpt"]) is None


# ---------------------------------------------------------------- float flags: never a traceback


@pytest.mark.parametrize("flag", ["--hicache-host-headroom", "--hicache-size", "--hicache-ratio"])
def test_plan_with_an_absurd_size_is_one_line_naming_the_flag(capsys, flag):
    # was: OverflowError traceback (headroom) / "cannot convert float NaN to integer" (size)
    assert_one_line_error(capsys, main(["plan", flag, "1e300"]), flag)


PLAN_FLOATS = ["--hicache-ratio", "--hicache-size", "--hicache-host-headroom", "--swa-full-tokens-ratio",
               "--device-gib"]
ODD_NUMBERS = st.one_of(st.sampled_from(["nan", "inf", "-inf", "-0", "0", "5e-324", "1e-300", "1e300", "1e308",
                                         "1.8e308", "1e9", "-1", "1e6"]),
                        st.floats(allow_nan=False).map(repr))


@settings(derandomize=True, deadline=None, max_examples=120)
@given(flag=st.sampled_from(PLAN_FLOATS), value=ODD_NUMBERS)
@example(flag="--device-gib", value="0.0005")  # one page of device tokens, less than one SWA row
def test_plan_float_flags_never_show_a_traceback(flag, value):
    code, out, err = _run_main(["plan", "--model", "deepseek-v4-flash", "--layers", "4", f"{flag}={value}"])
    if code == 2:
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and flag in lines[0], err
    else:  # taken: a table whose verdict the exit status repeats
        assert code == (0 if out.splitlines()[-1] == "host pools fit" else 1) and err == "", err


def _run_main(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` with stdout and stderr captured (hypothesis examples cannot use capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.gpu
def test_cuda_device_flag_names_an_index():
    from hicache.cli.checks import parse_device
    dev = parse_device("cuda")
    assert dev.index is not None and torch.empty(1, device=dev).device == dev
    assert parse_device("cuda:0") == torch.device("cuda:0")
