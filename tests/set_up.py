"""Tests that need a set-up product (Mooncake, the vLLM environments, the transformers
oracle): they skip and say why on a developer's machine, but fail under ``CI=true``,
where set-up must have built them (CI proves the set-up, never skips it)."""
from __future__ import annotations

import os

import pytest


def _fail_in_ci(why_not: str, what: str, how: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} missing in CI ({how}): {why_not}", pytrace=False)


def needs(why_not: str | None, what: str, how: str) -> pytest.MarkDecorator:
    """A module's ``pytestmark``: skip its tests when ``why_not`` says the product is
    missing (fails at once under CI)."""
    if why_not is not None:
        _fail_in_ci(why_not, what, how)
    return pytest.mark.skipif(why_not is not None, reason=f"{what}: {why_not}")


def require(why_not: str | None, what: str, how: str) -> None:
    """Inside a test: skip it when ``why_not`` says the product is missing (fail under CI)."""
    if why_not is not None:
        _fail_in_ci(why_not, what, how)
        pytest.skip(f"{what}: {why_not}")
