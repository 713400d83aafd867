"""Where `hicache serve-vllm`'s MODEL comes from, checked before vLLM starts.

vLLM takes a local folder or a Hugging Face model id; an id it cannot find costs half a
minute of start-up and two tracebacks before it fails. So MODEL is accepted when it is

    the alias ``smollm2-135m``     the folder scripts/setup_vllm.sh made (it must exist)
    an existing path               a model folder (or a file vLLM reads, e.g. .gguf)
    a cached Hugging Face id       ``org/name`` with a snapshot in the local hub cache
                                   (``--download-dir``, ``HF_HUB_CACHE``, ``HF_HOME``/hub,
                                   ``~/.cache/huggingface/hub``)
    any other id                   when the Hub (``HF_ENDPOINT``) answers, so vLLM can
                                   download it; not when ``HF_HUB_OFFLINE`` is set

and refused in one line otherwise (a path that does not exist, an id that is not cached
on a machine that is offline or cannot reach the Hub). No vLLM or huggingface_hub import.
"""
from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from hicache.integrations.vllm import env

TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's reading of boolean variables
HUB_TIMEOUT_S = 5.0


def hub_cache_dirs(vllm_args: Sequence[str] = ()) -> list[Path]:
    """Where a downloaded model may be: ``--download-dir``, then the hub cache."""
    dirs = [Path(a.split("=", 1)[1]) for a in vllm_args if a.startswith("--download-dir=")]
    dirs += [Path(b) for a, b in zip(vllm_args, vllm_args[1:]) if a == "--download-dir"]
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    elif os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        dirs.append(Path(xdg) / "huggingface" / "hub")
    return [d.expanduser() for d in dirs]


def cached(model_id: str, dirs: Sequence[Path]) -> bool:
    """Whether some snapshot of ``org/name`` holds a ``config.json`` in one of ``dirs``."""
    folder = "models--" + model_id.replace("/", "--")
    return any(any(d.glob(f"{folder}/snapshots/*/config.json")) for d in dirs)


def offline() -> bool:
    return any(os.environ.get(v, "").upper() in TRUE_VALUES for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached (``None`` when it answers, whatever the answer)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/api/models", method="HEAD"),
                               timeout=HUB_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"{endpoint} cannot be reached ({getattr(exc, 'reason', exc)})"
    return None


def looks_like_path(model: str) -> bool:
    """A name that can only be meant as a path (a hub id is ``name`` or ``org/name``)."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or os.sep != "/" and os.sep in model


def check_model(model: str, vllm_args: Sequence[str] = ()) -> str:
    """The model argument for vLLM: the alias's folder, or ``model`` unchanged.

    Raises:
        ValueError: one line naming MODEL and why it cannot be served (module docstring).
    """
    if model == env.MODEL_ALIAS and not Path(model).exists():
        folder = env.model_dir()
        if not (folder / ".hicache-model").exists():  # written last by the set-up
            raise ValueError(f"MODEL {model}: the set-up model is not at {folder} "
                             "(make vllm-setup, or scripts/setup_vllm.sh, builds it)")
        return str(folder)
    if Path(model).expanduser().exists():
        return model
    if looks_like_path(model):
        raise ValueError(f"MODEL {model}: no such file or folder")
    dirs = hub_cache_dirs(vllm_args)
    if cached(model, dirs):
        return model
    where = f"not a local folder and not in the Hugging Face cache ({', '.join(map(str, dirs))})"
    if offline():
        raise ValueError(f"MODEL {model}: {where}, and HF_HUB_OFFLINE is set; download it first "
                         f"or pass a model folder")
    why = hub_unreachable()
    if why:
        raise ValueError(f"MODEL {model}: {where}, and {why}; download it first or pass a model folder")
    return model
