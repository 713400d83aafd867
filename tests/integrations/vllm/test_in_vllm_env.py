"""Run ``test_vllm_adapters.py`` inside the vLLM environment (the core env has no vLLM).

Skipped, with the reason, when ``scripts/setup_vllm.sh`` could not build that environment.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from hicache.integrations.vllm import env

WHY_NOT = None if env.vllm_python() is not None else env.missing()


@pytest.mark.skipif(WHY_NOT is not None, reason=f"vLLM integration: {WHY_NOT}")
def test_adapters_pass_in_the_vllm_environment():
    here = Path(__file__).with_name("test_vllm_adapters.py")
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable here: the core run collects test_vllm_adapters.py itself")
    proc = subprocess.run(
        [str(env.vllm_python()), "-m", "pytest", str(here), "-p", "no:cacheprovider",
         "-W", "ignore::DeprecationWarning"],
        cwd=env.REPO_ROOT, env=env.process_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
