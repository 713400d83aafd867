"""The oracle: the reference models' weights loaded into transformers (a test-only dependency).

``DeepseekV4ForCausalLM`` needs transformers >= 5.19 (``scripts/setup.sh`` installs the
pinned ``ORACLE_TRANSFORMERS`` without touching torch); ``LlamaForCausalLM`` is the MHA
oracle. Both run eager, fp32, on CPU. transformers is imported only here, lazily.
"""
from __future__ import annotations

from typing import Any

import torch

from hicache.reference.config import Dsv4Config, MhaConfig
from hicache.reference.weights import dsv4_weights, mha_weights

ORACLE_TRANSFORMERS = "5.23.0"  # the version scripts/setup.sh pins
MIN_TRANSFORMERS = (5, 19)  # the first release with DeepseekV4ForCausalLM


def missing() -> str | None:
    """Why the DeepSeek-V4 oracle cannot run here, or ``None`` when it can."""
    try:
        import transformers
    except ImportError as exc:
        return f"transformers is not installed ({exc}); scripts/setup.sh installs {ORACLE_TRANSFORMERS}"
    try:
        from transformers import DeepseekV4ForCausalLM  # noqa: F401
    except ImportError:
        return (f"transformers {transformers.__version__} has no DeepseekV4ForCausalLM (needs >= "
                f"{'.'.join(map(str, MIN_TRANSFORMERS))}); scripts/setup.sh installs {ORACLE_TRANSFORMERS}")
    return None


def dsv4_hf_config(cfg: Dsv4Config) -> Any:
    """transformers' ``DeepseekV4Config`` of ``cfg`` (default RoPE on both rope types)."""
    from transformers import DeepseekV4Config
    types = {0: "sliding_attention", cfg.c4_ratio: "compressed_sparse_attention",
             cfg.hca_ratio: "heavily_compressed_attention"}
    return DeepseekV4Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, moe_intermediate_size=cfg.moe_intermediate,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=1,
        head_dim=cfg.head_dim, q_lora_rank=cfg.q_lora_rank, partial_rotary_factor=cfg.rope_dim / cfg.head_dim,
        num_experts_per_tok=cfg.experts_per_token, n_routed_experts=cfg.num_experts, n_shared_experts=1,
        routed_scaling_factor=cfg.routed_scaling, rope_theta=cfg.rope_theta,
        compress_rope_theta=cfg.compress_rope_theta,
        layer_types=[types[r] for r in cfg.compress_ratios],
        compress_rates={"compressed_sparse_attention": cfg.c4_ratio, "heavily_compressed_attention": cfg.hca_ratio},
        mlp_layer_types=["hash_moe" if i < cfg.num_hash_layers else "moe" for i in range(cfg.num_layers)],
        hc_mult=cfg.hc_mult, hc_sinkhorn_iters=cfg.hc_sinkhorn_iters, hc_eps=cfg.hc_eps,
        swiglu_limit=cfg.swiglu_limit, sliding_window=cfg.window, o_groups=cfg.o_groups,
        o_lora_rank=cfg.o_lora_rank, index_n_heads=cfg.index_n_heads, index_head_dim=cfg.index_head_dim,
        index_topk=cfg.index_topk, rms_norm_eps=cfg.rms_eps, max_position_embeddings=4096,
        tie_word_embeddings=False, attn_implementation="eager")


def mha_hf_config(cfg: MhaConfig) -> Any:
    """transformers' ``LlamaConfig`` of ``cfg``."""
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_eps,
        rope_theta=cfg.rope_theta, max_position_embeddings=4096, tie_word_embeddings=False,
        attn_implementation="eager")


def oracle_model(cfg: Dsv4Config | MhaConfig) -> torch.nn.Module:
    """transformers' model of ``cfg`` holding exactly the reference weights (strict load), eval, fp32."""
    if isinstance(cfg, Dsv4Config):
        from transformers import DeepseekV4ForCausalLM
        model, weights = DeepseekV4ForCausalLM(dsv4_hf_config(cfg)), dsv4_weights(cfg)
    else:
        from transformers import LlamaForCausalLM
        model, weights = LlamaForCausalLM(mha_hf_config(cfg)), mha_weights(cfg)
    model.load_state_dict(weights, strict=True)
    return model.float().eval()


@torch.no_grad()
def oracle_logits(model: torch.nn.Module, token_ids: torch.Tensor, chunks: list[int] | None = None) -> torch.Tensor:
    """Logits ``[len, vocab]`` of ``token_ids``: one forward, or ``chunks`` (token counts
    summing to the length) fed one after another through transformers' own cache."""
    ids = token_ids.view(1, -1)
    if chunks is None:
        return model(input_ids=ids, use_cache=False).logits[0]
    if sum(chunks) != ids.shape[1]:
        raise ValueError(f"chunks: must sum to {ids.shape[1]} tokens, got {sum(chunks)}")
    out, past, start = [], None, 0
    for n in chunks:
        res = model(input_ids=ids[:, start:start + n], past_key_values=past, use_cache=True)
        past, start = res.past_key_values, start + n
        out.append(res.logits[0])
    return torch.cat(out)
