"""Shared fixtures: seeded generators and the GPU marker's skip rule."""
from __future__ import annotations

import pytest
import torch

# Triton kernels on CPU tensors run under the interpreter on every machine (the kernel
# module builds a compiled and an interpreted variant; TRITON_INTERPRET is not needed).


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
