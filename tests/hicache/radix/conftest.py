"""Fixtures of the tree tests."""
from __future__ import annotations

import pytest

from tests.hicache.radix.storage_env import reset_gate


@pytest.fixture
def gated():
    """`GatedBackend` with its gate closed; opened at the end so no I/O thread stays blocked."""
    backend = reset_gate()
    yield backend
    backend.gate.set()
