"""A tiny random-weight Qwen3-Next (Gated DeltaNet + full attention) for vLLM end to end.

The linear-attention counterpart of ``tiny_swa.py``: Qwen3-Next's architecture at toy size
(three Gated DeltaNet layers, then a full-attention layer; MoE MLPs, which vLLM's
``Qwen3NextForCausalLM`` requires) with seeded random bf16 weights and SmolLM2's tokenizer.
vLLM 0.32 (CPU) gives it one full-attention KV cache group and a Mamba-state group per
DeltaNet layer, in "align" mode under prefix caching. Two choices are vLLM's, not ours:
the DeltaNet heads are 128 wide (vLLM's CPU GDN kernel takes no other) and the head is
untied (vLLM's Qwen3-Next ignores ``tie_word_embeddings``: a tied checkpoint's logits come
out flat). Weights are N(0, 1/fan_in) (embeddings N(0, 1), norm weights N(0, 0.1)), so
greedy tokens depend on the state and a wrongly restored one shows.
Runs in the vLLM environment (transformers), once, from ``scripts/setup_vllm.sh``.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from bounded_input import read_json
from hicache.integrations.vllm.smollm2 import fresh_folder, publish
from hicache.integrations.vllm.tiny_swa import TOKENIZER_FILES, writer_main

LAYERS = ["linear_attention"] * 3 + ["full_attention"]


def write(out: Path, tokenizer_dir: Path) -> Path:
    """Write the model folder to ``out`` (replaced if present); returns ``out``."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    tmp = fresh_folder(out)
    tok = read_json(tokenizer_dir / "config.json", "a model config")
    config = Qwen3NextConfig(
        vocab_size=tok["vocab_size"], hidden_size=128, intermediate_size=256, num_hidden_layers=len(LAYERS),
        layer_types=LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64, max_position_embeddings=4096, tie_word_embeddings=False,
        bos_token_id=tok.get("bos_token_id"), eos_token_id=tok.get("eos_token_id"))
    model = Qwen3NextForCausalLM(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 if "embed" in name else p.shape[-1] ** -0.5))
            elif "norm" in name:  # the decoder's norms multiply by 1 + w
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.to(torch.bfloat16).save_pretrained(str(tmp))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, tmp / name)
    return publish(tmp, out, "tiny Qwen3-Next (3 Gated DeltaNet + 1 full-attention layers)")


def main(argv: list[str] | None = None) -> int:
    return writer_main("tiny_linear", __doc__.splitlines()[0], write, argv)


if __name__ == "__main__":
    sys.exit(main())
