"""The ``"auto"`` table file is read with a bound (issue 28 item 1): ``HICACHE_AUTO_TABLE``
naming ``/dev/zero`` or a FIFO that never ends is refused at the limit, not read forever."""
from __future__ import annotations

import pytest

from transfer_kernels.backends import auto_table
from tests.endless import FifoFeeder

SLACK = 1 << 16


def test_dev_zero_as_the_table_is_refused_naming_the_variable_the_file_and_the_limit(monkeypatch):
    # was: Path.read_text() of an endless file (memory grows until the OOM killer)
    monkeypatch.setenv(auto_table.ENV, "/dev/zero")
    with pytest.raises(ValueError, match=r"^HICACHE_AUTO_TABLE: /dev/zero: line 1: more than 1,048,576 bytes, "
                                         r"the limit of an auto table file"):
        auto_table.from_env()


def test_a_fifo_table_is_refused_without_reading_past_the_limit(tmp_path, monkeypatch):
    fifo = FifoFeeder(tmp_path / "table.json", b'{"rules": [\n')
    monkeypatch.setenv(auto_table.ENV, str(fifo.path))
    with pytest.raises(ValueError, match=r"table.json: line \d[\d,]*: more than 1,048,576 bytes"):
        auto_table.from_env()
    assert fifo.join() <= auto_table.MAX_TABLE_BYTES + 4 * SLACK


def test_a_table_at_the_limit_still_loads(tmp_path):
    path = auto_table.SEED.save(tmp_path / "t.json")
    text = path.read_text()
    padded = text + " " * (auto_table.MAX_TABLE_BYTES - len(text.encode()))  # JSON allows trailing spaces
    path.write_text(padded)
    assert auto_table.load(path) == auto_table.SEED
    path.write_text(padded + " ")
    with pytest.raises(ValueError, match="more than 1,048,576 bytes"):
        auto_table.load(path)
