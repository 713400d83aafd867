"""The oracle: the reference models' weights loaded into transformers (a test-only dependency).

``DeepseekV4ForCausalLM`` needs transformers >= 5.19 (``scripts/setup.sh`` installs the
pinned ``ORACLE_TRANSFORMERS`` without touching torch); ``LlamaForCausalLM`` is the MHA
oracle, ``Qwen3_5ForCausalLM`` and ``NemotronHForCausalLM`` the linear-attention hybrids'
(their pure-torch paths: no ``flash-linear-attention``, ``causal_conv1d`` or ``mamba_ssm``
here, so transformers falls back to its reference code and says so once). All run eager,
fp32, on CPU. transformers is imported only here, lazily.
"""
from __future__ import annotations

from typing import Any

import torch

from hicache.reference.config import Dsv4Config, MhaConfig, ToyConfig
from hicache.reference.linear_config import NemotronHConfig, Qwen35Config
from hicache.reference.linear_weights import nemotron_h_weights, qwen35_weights
from hicache.reference.weights import dsv4_weights, mha_weights

ORACLE_TRANSFORMERS = "5.23.0"  # the version scripts/setup.sh pins
MIN_TRANSFORMERS = (5, 19)  # the first release with DeepseekV4ForCausalLM


def missing(classes: tuple[str, ...] = ("DeepseekV4ForCausalLM",)) -> str | None:
    """Why the oracle (transformers with ``classes``) cannot run here, or ``None`` when it can."""
    try:
        import transformers
    except ImportError as exc:
        return f"transformers is not installed ({exc}); scripts/setup.sh installs {ORACLE_TRANSFORMERS}"
    absent = [name for name in classes if not hasattr(transformers, name)]
    if absent:
        return (f"transformers {transformers.__version__} has no {', '.join(absent)} (needs >= "
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


def qwen35_hf_config(cfg: Qwen35Config) -> Any:
    """transformers' ``Qwen3_5TextConfig`` of ``cfg`` (text only: its 3-D RoPE is plain RoPE)."""
    from transformers import Qwen3_5TextConfig
    return Qwen3_5TextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, layer_types=[f"{k}_attention" for k in cfg.layer_kinds],
        linear_conv_kernel_dim=cfg.conv_kernel, linear_key_head_dim=cfg.key_dim, linear_value_head_dim=cfg.value_dim,
        linear_num_key_heads=cfg.key_heads, linear_num_value_heads=cfg.value_heads, rms_norm_eps=cfg.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta,
                         "partial_rotary_factor": cfg.rotary / cfg.head_dim},
        max_position_embeddings=4096, tie_word_embeddings=False, attn_implementation="eager")


def nemotron_h_hf_config(cfg: NemotronHConfig) -> Any:
    """transformers' ``NemotronHConfig`` of ``cfg``."""
    from transformers import NemotronHConfig as HfConfig
    kinds = {"linear": "linear_attention", "full": "full_attention", "mlp": "mlp"}
    return HfConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, layers_block_type=[kinds[k] for k in cfg.layer_kinds],
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, mamba_num_heads=cfg.mamba_heads, mamba_head_dim=cfg.mamba_head_dim,
        n_groups=cfg.n_groups, ssm_state_size=cfg.ssm_state, conv_kernel=cfg.conv_kernel, use_conv_bias=True,
        time_step_min=cfg.time_step_min, layer_norm_epsilon=cfg.rms_eps, chunk_size=16,
        max_position_embeddings=4096, tie_word_embeddings=False, attn_implementation="eager")


_ORACLES = {Dsv4Config: ("DeepseekV4ForCausalLM", dsv4_hf_config, dsv4_weights),
            MhaConfig: ("LlamaForCausalLM", mha_hf_config, mha_weights),
            Qwen35Config: ("Qwen3_5ForCausalLM", qwen35_hf_config, qwen35_weights),
            NemotronHConfig: ("NemotronHForCausalLM", nemotron_h_hf_config, nemotron_h_weights)}


def oracle_model(cfg: ToyConfig) -> torch.nn.Module:
    """transformers' model of ``cfg`` holding exactly the reference weights (strict load), eval, fp32."""
    import transformers
    name, hf_config, weights_of = _ORACLES[type(cfg)]
    model, weights = getattr(transformers, name)(hf_config(cfg)), weights_of(cfg)
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
