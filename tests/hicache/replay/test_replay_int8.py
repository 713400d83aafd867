"""``hicache replay --hicache-host-dtype int8``: the flag, host-format bytes in the rows, every
loaded page checked byte for byte (the content is exact in int8)."""
from __future__ import annotations

import json

from hicache.cli import main


def test_replay_int8_reports_host_bytes_and_checks_every_page(capsys):
    argv = ["replay", "--model", "llama-3.1-8b", "--layers", "1", "--hicache-ratio", "2", "--max-requests", "30",
            "--device-tokens", "4096", "--json", "--no-progress"]
    rows = {}
    for dtype in ("auto", "int8"):
        assert main(argv + ["--hicache-host-dtype", dtype]) == 0
        rows[dtype] = json.loads(capsys.readouterr().out)["runs"][-1]
    auto, int8 = rows["auto"], rows["int8"]
    assert (auto["host_dtype"], int8["host_dtype"]) == ("auto", "int8")
    assert int8["mismatches"] == 0 and int8["transfers_failed"] == 0
    assert 1.93 < auto["host_capacity_bytes"] / int8["host_capacity_bytes"] < 1.94
    assert int8["hit_rate"] == auto["hit_rate"]  # same ratio: the same host tokens
    assert 1.93 < auto["bytes_d2h"] / int8["bytes_d2h"] < 1.94
