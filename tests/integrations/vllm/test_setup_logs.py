"""The vLLM set-up scripts keep the log of the build that made an environment (issue 28,
item 17): a later run that finds everything built (every ``make test``) writes nothing to
it, so the log still says how the environment was made.

The scripts run for real against a temporary cache, with a stand-in for Python: ``-m venv
DIR`` makes DIR a "venv" whose python is the stand-in again, ``--out DIR`` writes a model
marker there, and anything else (pip, the import checks) prints a line and succeeds.
No network, no vLLM.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hicache.integrations.vllm import env

FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
prev=""
for a in "$@"; do
  if [ "$prev" = "--out" ]; then mkdir -p "$a" && touch "$a/.hicache-model"; fi
  prev="$a"
done
echo "fake python: $*"
"""
SCRIPTS = {"setup_vllm.sh": "vllm-setup.log", "setup_vllm_adapter.sh": "vllm-0.33-setup.log"}


def _run(script: str, cache: Path, python: Path) -> subprocess.CompletedProcess:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("HICACHE_")}
    run_env.update(HICACHE_CACHE=str(cache), PYTHON=str(python))
    return subprocess.run(["bash", str(env.REPO_ROOT / "scripts" / script)], env=run_env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_run_that_finds_everything_built_keeps_the_build_log(tmp_path, script):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    cache = tmp_path / "cache"
    built = _run(script, cache, python)
    assert built.returncode == 0, built.stderr
    log = cache / SCRIPTS[script]
    build_log = log.read_text()
    assert "fake python: -m pip install" in build_log  # the build's own output
    again = _run(script, cache, python)
    assert again.returncode == 0, again.stderr
    assert log.read_text() == build_log
    assert again.stderr == ""  # nothing to do, nothing said
