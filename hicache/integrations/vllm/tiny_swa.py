"""A tiny random-weight Gemma-3 text model with sliding-window layers, for vLLM end to end.

No sliding-window checkpoint ships with a package here, so this writes one: Gemma-3's
architecture (a sliding-window layer of a 128-token window, then a full-attention
layer, twice) at toy size with seeded random bf16 weights, and SmolLM2's tokenizer
(copied from the model ``scripts/setup_vllm.sh`` converted). vLLM gives it two KV cache
groups, full attention and sliding window, which is what the end-to-end test needs; its
output is noise, but deterministic noise, so greedy token ids can be compared.
Runs in the vLLM environment (transformers), once, from ``scripts/setup_vllm.sh``.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from bounded_input import read_json
from hicache.integrations.vllm.smollm2 import fresh_folder, publish

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
LAYERS = ["sliding_attention", "full_attention"]  # as many of each: vLLM makes 2 groups


def write(out: Path, tokenizer_dir: Path, window: int = 128) -> Path:
    """Write the model folder to ``out`` (replaced if present); returns ``out``."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tmp = fresh_folder(out)
    tok_config = read_json(tokenizer_dir / "config.json", "a model config")
    config = Gemma3TextConfig(
        vocab_size=tok_config["vocab_size"], hidden_size=128, intermediate_size=256,
        num_hidden_layers=2 * len(LAYERS), num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, sliding_window=window, layer_types=LAYERS * 2, max_position_embeddings=4096,
        bos_token_id=tok_config.get("bos_token_id"), eos_token_id=tok_config.get("eos_token_id"),
        pad_token_id=tok_config.get("pad_token_id"), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(tmp))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, tmp / name)
    return publish(tmp, out, f"tiny Gemma-3, window {window}")


def writer_main(prog: str, description: str, write_fn, argv: list[str] | None = None) -> int:
    """The command line of a tiny model writer: ``--out`` and ``--tokenizer`` (the SmolLM2
    folder), one line and status 2 without it; prints the folder written."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", type=Path, required=True, help="model folder to write")
    parser.add_argument("--tokenizer", type=Path, required=True, help="the SmolLM2 model folder")
    args = parser.parse_args(argv)
    if not (args.tokenizer / "config.json").exists():
        print(f"{prog}: error: --tokenizer: no model folder at {args.tokenizer}", file=sys.stderr)
        return 2
    print(write_fn(args.out.expanduser(), args.tokenizer.expanduser()))
    return 0


def main(argv: list[str] | None = None) -> int:
    return writer_main("tiny_swa", __doc__.splitlines()[0], write, argv)


if __name__ == "__main__":
    sys.exit(main())
