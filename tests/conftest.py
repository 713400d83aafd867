"""Shared fixtures: seeded generators and the GPU marker's skip rule."""
from __future__ import annotations

import os

import pytest
import torch

# Triton kernels run under the interpreter on machines without CUDA.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded CPU generator: tests draw random bytes from it, never zeros."""
    g = torch.Generator()
    g.manual_seed(1234)
    return g
