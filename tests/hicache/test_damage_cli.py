"""Damage is one line (issue 37, items 5-7): `hicache replay` run in a child process on a
trace or a table that cannot be parsed, asks too much, stalls, or is stopped by SIGTERM.
Each ends with its exit status and one line naming the file and the line, never a
traceback; SIGTERM leaves nothing behind.

The refusals run in ONE child, one `hicache.cli.main` call each (its status and stderr
kept per case, an escaped exception printed as the interpreter would), so the cases cost
one start of the command, not six; a case that blocks (the FIFO's, before its bound) hangs
that child and fails the test at `WAIT_S`."""
from __future__ import annotations

import json
import lzma
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 300
REQUEST = '{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}\n'
SMALL = ["--no-progress", "--layers", "1", "--device-tokens", "4096", "--hicache-ratio", "1", "--max-requests", "2"]

# The child: per case, set its environment, run the command, report (status, stdout, stderr).
CASES_CHILD = """
import contextlib, io, json, os, sys, traceback
from hicache.cli import main
for name, argv, env in json.loads(sys.argv[1]):
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except BaseException:  # what the interpreter would print, and its status
            traceback.print_exc()
            code = 1
    for key in env:
        del os.environ[key]
    print(json.dumps([name, code, out.getvalue(), err.getvalue()]), flush=True)
"""


def _child(argv: list[str], env: dict | None = None, script: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    head = ["-c", script] if script else ["-m", "hicache.cli"]
    return subprocess.Popen([sys.executable, *head, *argv], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _cases(tmp: Path) -> dict[str, tuple[list[str], dict]]:
    """Each case's command line (and environment), its files written under ``tmp``."""
    deep, digits, prompt = tmp / "deep.jsonl", tmp / "digits.jsonl", tmp / "prompt.jsonl"
    deep.write_text(REQUEST + "[" * 200_000 + "\n")  # was: RecursionError, a traceback, exit 1
    digits.write_text(REQUEST + '{"timestamp": ' + "9" * 5000 + ', "input_length": 1, "output_length": 1, '
                      '"hash_ids": [1]}\n')  # was: exit 2 naming neither the file nor the line
    prompt.write_text(REQUEST + '{"timestamp": 1, "input_length": 2000, "output_length": 1, '
                      '"hash_ids": [0, 0, 0, 0]}\n')
    table = tmp / "table.json"
    table.write_text('{"format": "hicache-auto-table", "version": 1, "rules": ' + "[" * 100_000 + "]" * 100_000 + "}")
    blank = tmp / "blank.jsonl.xz"
    with lzma.open(blank, "wb") as f:  # 2 MiB of newlines (~400 bytes on disk), then a request
        f.write(b"\n" * (2 << 20) + REQUEST.encode())
    fifo = tmp / "fifo.jsonl"
    os.mkfifo(fifo)  # no writer, ever: was a replay blocked forever in open()
    return {
        "deep": (["replay", "--trace", str(deep), *SMALL], {}),
        "digits": (["replay", "--trace", str(digits), *SMALL], {}),
        "table": (["replay", "--workload", "chat", *SMALL], {"HICACHE_AUTO_TABLE": str(table)}),
        "prompt": (["replay", "--trace", str(prompt), "--max-prompt-tokens", "1000", *SMALL], {}),
        # the byte bound alone (a stall bound of an hour): the same refusal however slow the machine
        "blank": (["replay", "--trace", str(blank), "--trace-stall-timeout", "3600", *SMALL], {}),
        "fifo": (["replay", "--trace", str(fifo), "--trace-stall-timeout", "2", *SMALL], {}),
    }


EXPECTED = {
    "deep": "--trace {tmp}/deep.jsonl: line 2: nested deeper than 64 levels, the limit of a JSON document",
    "digits": "--trace {tmp}/digits.jsonl: line 2: a number of more than 64 digits, the limit of a JSON document",
    "table": "HICACHE_AUTO_TABLE: {tmp}/table.json: line 1: nested deeper than 64 levels",
    "prompt": "--trace {tmp}/prompt.jsonl: line 2: input_length 2,000 is over 1,000 tokens, the limit of "
              "--max-prompt-tokens; refused before anything is allocated for it",
    "blank": "--trace {tmp}/blank.jsonl.xz: line 1,048,577: more than 1,048,576 bytes of blank lines in a row",
    "fifo": "--trace {tmp}/fifo.jsonl: line 1: nothing to read (a FIFO or pipe with no writer, or a writer gone "
            "quiet) for 2 s, the limit of a stall (--trace-stall-timeout)",
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> tuple[Path, dict[str, tuple[int, str, str]], str]:
    tmp = tmp_path_factory.mktemp("damage")
    cases = [[name, argv, env] for name, (argv, env) in _cases(tmp).items()]
    proc = _child([json.dumps(cases)], script=CASES_CHILD)
    try:
        out, err = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    results = {name: (code, o, e) for name, code, o, e in map(json.loads, out.splitlines())}
    return tmp, results, err


@pytest.mark.parametrize("case", list(EXPECTED))
def test_damaged_or_stalled_input_is_one_line_naming_the_file_and_the_line(refusals, case):
    tmp, results, child_err = refusals
    assert case in results, f"{case}: no answer in {WAIT_S} s (blocked on its input?) {child_err[-2000:]}"
    code, out, err = results[case]
    assert code == 2 and out == "", (code, out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.strip().startswith("hicache replay: error: " + EXPECTED[case].format(tmp=tmp)), err


# The child holds the second run's first store write with its temporary made (counted in
# the store) and, at the tree's next poll (every step, and the loop a drain of the store's
# writes runs while it waits), waits for the test's SIGTERM instead, so the write is always
# in flight when the signal arrives. The tree's close, which a stop must reach, lets
# the write finish: a stop waits for the writes in flight, as Ctrl-C's does.
SIGTERM_CHILD = """
import sys, threading, time
from hicache.cli import main
from hicache.radix import HiRadixCache
from hicache.storage.file_backend import FileBackend

in_flight, release = threading.Event(), threading.Event()
write, poll, close = FileBackend._write, HiRadixCache.poll, HiRadixCache.close

def held_write(self, res, key, page):
    if not in_flight.is_set():
        in_flight.set()
        release.wait()
    return write(self, res, key, page)

def poll_until_sigterm(self, *args, **kwargs):
    if in_flight.is_set() and not release.is_set():
        print("test: a store write in flight", file=sys.stderr, flush=True)
        while True:
            time.sleep(0.01)
    return poll(self, *args, **kwargs)

def close_releasing(self):  # (the device-only run's tree closes first: no write is held then)
    if in_flight.is_set():
        release.set()
    return close(self)

FileBackend._write, HiRadixCache.poll, HiRadixCache.close = held_write, poll_until_sigterm, close_releasing
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_stops_a_replay_like_ctrl_c_with_143_and_nothing_left_behind(tmp_path):
    # was: killed at once (status -15), the write's temporary left in the store
    store, tmp = tmp_path / "store", tmp_path / "tmp"
    tmp.mkdir()
    proc = _child(["replay", "--layers", "1", "--device-tokens", "8192", "--hicache-ratio", "4", "--max-requests",
                   "40", "--no-progress", "--hicache-storage-backend", "file", "--hicache-storage-dir", str(store)],
                  {"TMPDIR": str(tmp)}, SIGTERM_CHILD)
    try:
        seen = []
        for line in iter(proc.stderr.readline, ""):
            seen.append(line)
            if line.startswith("test: a store write"):
                break
        assert seen and seen[-1].startswith("test: a store write"), "".join(seen)
        assert list(store.rglob(".*.tmp")), "the held write has its temporary"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "hicache replay: stopped by SIGTERM after 1 of 2 runs; the rows above " \
                                           "are the finished runs"
    assert out.splitlines()[3].split()[0] == "0"  # title, head, rule, the baseline row
    assert not list(store.rglob(".*.tmp")) and not list(tmp.iterdir())  # no store temporary, no temporary folder
