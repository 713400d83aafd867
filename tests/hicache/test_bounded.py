"""Bounded reads (issue 28 item 1, issue 37 item 7): a trace or a store marker that never ends
is refused at its limit, in one line naming the file, the line and the limit, without
reading further; a source that stalls is refused at its stall bound."""
from __future__ import annotations

import io
import os
import threading

import pytest

import hicache.replay.workload as workload
from bounded_input import capped_lines, read_capped, read_file
from hicache.cli import main
from hicache.storage.file_layout import MARKER_MAX_BYTES, NAMESPACE_FILE, read_marker
from tests.endless import Endless, FifoFeeder

GOOD = b'{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}\n'
SLACK = 1 << 16  # what buffered readers may take beyond a limit: one buffer


def one_line(capsys, code: int, *words: str) -> str:
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert code == 2 and out.out == "" and len(lines) == 1 and "Traceback" not in out.err, (code, out)
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def test_an_endless_line_is_refused_at_the_line_limit(monkeypatch):
    # was: the whole source read as one line (/dev/zero: 22.5 GB, then the OOM killer)
    source = Endless(b"\0")
    monkeypatch.setattr(workload, "_open_trace", lambda path, *_: io.BufferedReader(source))
    with pytest.raises(ValueError, match=r"--trace endless: line 1: more than 1,048,576 bytes, the limit of one line"):
        workload.load_trace("endless")
    assert source.read_bytes <= workload.MAX_LINE_BYTES + SLACK


def test_endless_good_lines_are_refused_at_the_file_limit(monkeypatch):
    source = Endless(GOOD)
    monkeypatch.setattr(workload, "_open_trace", lambda path, *_: io.BufferedReader(source))
    monkeypatch.setattr(workload, "MAX_TRACE_BYTES", 1 << 20)
    lines = (1 << 20) // len(GOOD) + 1  # the line that passes the limit
    with pytest.raises(ValueError, match=rf"line {lines:,}: the file passes 1,048,576 bytes, the limit of a whole"):
        workload.load_trace("endless")
    assert source.read_bytes <= (1 << 20) + SLACK


def test_dev_zero_as_a_trace_is_one_line_naming_the_file_line_and_limit(capsys):
    code = main(["replay", "--trace", "/dev/zero", "--no-progress"])
    one_line(capsys, code, "--trace /dev/zero: line 1: more than 1,048,576 bytes")


def test_a_fifo_that_never_ends_is_refused_without_reading_past_the_limit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(workload, "MAX_LINE_BYTES", 1 << 16)  # small: the feeder stops soon after
    fifo = FifoFeeder(tmp_path / "trace.jsonl")
    one_line(capsys, main(["replay", "--trace", str(fifo.path), "--no-progress"]), "line 1", "65,536 bytes")
    assert fifo.join() <= (1 << 16) + 4 * SLACK  # the pipe's buffer and one chunk in flight


def test_capped_reads_count_lines_and_stop_at_the_limit():
    data = b"ab\ncd\nef" * 10
    assert list(capped_lines(io.BytesIO(b"x\n\ny"), "f", 4, 10)) == [(1, b"x\n"), (3, b"y")]  # blank lines counted, skipped
    assert read_capped(io.BytesIO(data), len(data), "f", "k") == data
    with pytest.raises(ValueError, match=r"^f: line 3: more than 7 bytes, the limit of k;"):
        read_capped(io.BytesIO(data), 7, "f", "k")
    with pytest.raises(ValueError, match=r"^f: line 2: more than 2 bytes, the limit of one line"):
        list(capped_lines(io.BytesIO(b"ab\nabc\n"), "f", 2, 100))
    assert list(capped_lines(io.BytesIO(b"ab\r\n"), "f", 2, 100)) == [(1, b"ab\r")]


def test_a_huge_namespace_marker_is_refused_naming_its_limit(tmp_path):
    # was: read truncated at the limit, then called "damaged (JSONDecodeError ...)"
    (tmp_path / NAMESPACE_FILE).write_bytes(b'{"a": "' + b"x" * (2 * MARKER_MAX_BYTES) + b'"}\n')
    why = read_marker(str(tmp_path))
    assert isinstance(why, str) and f"{tmp_path / NAMESPACE_FILE}: line 1: more than {MARKER_MAX_BYTES:,} bytes" in why
    os.remove(tmp_path / NAMESPACE_FILE)
    os.mkfifo(tmp_path / NAMESPACE_FILE)  # a FIFO marker (no writer): refused at once, never waited on
    assert read_marker(str(tmp_path)) == f"{tmp_path / NAMESPACE_FILE} is a FIFO"


# ---- stalls (issue 37 item 7): a source that gives no request is refused within its bound,
# whatever the writer does; the bound is never raced: every case ends the same way however
# slow the machine (the writers below stop only when the reader has gone).

def _trickle(path, stop: threading.Event, piece: bytes) -> None:
    """A writer that sends ``piece`` now and then until the reader closes (or ``stop``)."""
    try:
        with open(path, "wb", buffering=0) as f:
            while not stop.wait(0.02):
                f.write(piece)
    except BrokenPipeError:
        pass


def test_a_fifo_trickling_blank_lines_is_refused_at_the_stall_bound(tmp_path):
    fifo, stop = tmp_path / "trace.jsonl", threading.Event()
    os.mkfifo(fifo)
    writer = threading.Thread(target=_trickle, args=(fifo, stop, b"\n"), daemon=True)
    writer.start()
    try:
        with pytest.raises(ValueError, match=rf"^--trace {fifo}: line \d[\d,]*: .* for 1 s, the limit of a stall "
                                             r"\(--trace-stall-timeout\); refused without waiting further$"):
            workload.load_trace(fifo, limits=workload.TraceLimits(stall_s=1))
    finally:
        stop.set()
        writer.join(timeout=60)


def test_a_fifo_whose_writer_comes_after_the_reader_is_read_whole(tmp_path):
    # the reader opens first (non-blocking) and waits for the writer, within the stall bound
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)

    def write_once() -> None:
        with open(fifo, "wb") as f:  # blocks until the reader has opened
            f.write(b"\n" + GOOD + b"\n" + GOOD)

    writer = threading.Thread(target=write_once, daemon=True)
    writer.start()
    assert [r.input_length for r in workload.load_trace(fifo, limits=workload.TraceLimits(stall_s=600))] == [700, 700]
    writer.join(timeout=60)


def test_a_whole_file_read_of_a_fifo_with_no_writer_is_refused_at_its_bound(tmp_path):
    fifo = tmp_path / "table.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=rf"^{fifo}: line 1: nothing to read .* for 0.5 s, the limit of a stall"):
        read_file(fifo, 100, "a table", stall_s=0.5)
