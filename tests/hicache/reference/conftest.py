"""Shared set-up of the reference-model tests: one torch thread (the models' ops are tiny;
threads only add contention on a loaded CI box), restored afterwards."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
