"""bench/dma_plan.py: the dma backend's pieces and calls per launch group (CPU)."""
from __future__ import annotations

import json

import pytest

from bench import dma_plan


def test_reports_pieces_and_at_most_one_dma_per_group(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert dma_plan.main(["--model", "llama-3.1-8b", "--pages", "2", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["pools"] and all(calls[0] <= 1 and calls[3] <= 1 for calls in got["per_group"])
    assert "launch groups" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--pages", "0"], ["--model", "nope"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        dma_plan.main(argv)
    assert exc.value.code == 2 and "Traceback" not in capsys.readouterr().err
