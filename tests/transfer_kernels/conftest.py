"""Fixtures of the transfer tests."""
from __future__ import annotations

import pytest

from transfer_kernels import runtime


@pytest.fixture
def launched(monkeypatch) -> list:
    """Every kernel launch from now on, observed at its public hook (``runtime.launch``,
    which every launch of every backend goes through): ``(launcher, group)``, then run."""
    seen: list = []
    real = runtime.launch

    def launch(launcher, group: int) -> None:
        seen.append((launcher, group))
        real(launcher, group)
    monkeypatch.setattr(runtime, "launch", launch)
    return seen
