"""Random weights of the linear-attention reference models, named as transformers names them
(``Qwen3_5ForCausalLM``, ``NemotronHForCausalLM``), so the oracle loads the very same tensors.

The init follows `hicache.reference.weights` (linear weights N(0, 1/fan_in), O(1)
activations and logits) with what the recurrences need to stay alive and well defined:
decays ``A = -exp(A_log)`` of order 1 (a state remembers tens of tokens, so a wrong one
shows), Qwen3.5's zero-centred norms N(0, 0.1) around their ``1 + w``, and Mamba-2 time
steps ``softplus(dt + dt_bias)`` far above the 0.001 floor (transformers floors prefill
steps but not decode steps: at this init the floor never acts, so both paths agree).
"""
from __future__ import annotations

import torch

from hicache.reference.linear_config import NemotronHConfig, Qwen35Config
from hicache.reference.weights import _Draw


def _deltanet(d: _Draw, p: str, cfg: Qwen35Config) -> None:
    g = cfg.geometry()
    value = cfg.value_heads * cfg.value_dim
    d.linear(f"{p}.in_proj_qkv.weight", g.conv_dim, cfg.hidden_size)
    d.linear(f"{p}.in_proj_z.weight", value, cfg.hidden_size)
    d.linear(f"{p}.in_proj_b.weight", cfg.value_heads, cfg.hidden_size)
    d.linear(f"{p}.in_proj_a.weight", cfg.value_heads, cfg.hidden_size)
    d.normal(f"{p}.conv1d.weight", (g.conv_dim, 1, cfg.conv_kernel), cfg.conv_kernel ** -0.5)
    d.normal(f"{p}.dt_bias", (cfg.value_heads,), 0.5)
    d.normal(f"{p}.A_log", (cfg.value_heads,), 0.5)
    d.norm(f"{p}.norm.weight", cfg.value_dim)
    d.linear(f"{p}.out_proj.weight", cfg.hidden_size, value)


def _qwen_attention(d: _Draw, p: str, cfg: Qwen35Config) -> None:
    h, hd = cfg.hidden_size, cfg.head_dim
    d.linear(f"{p}.q_proj.weight", 2 * cfg.num_heads * hd, h)  # query and output gate per head
    d.linear(f"{p}.k_proj.weight", cfg.num_kv_heads * hd, h)
    d.linear(f"{p}.v_proj.weight", cfg.num_kv_heads * hd, h)
    d.linear(f"{p}.o_proj.weight", h, cfg.num_heads * hd)
    d.normal(f"{p}.q_norm.weight", (hd,), 0.1)  # zero-centred: the norm multiplies by 1 + w
    d.normal(f"{p}.k_norm.weight", (hd,), 0.1)


def qwen35_weights(cfg: Qwen35Config) -> dict[str, torch.Tensor]:
    """Every parameter of ``Qwen3_5ForCausalLM`` for ``cfg`` (untied head), fp32."""
    d = _Draw(cfg.seed)
    h = cfg.hidden_size
    d.normal("model.embed_tokens.weight", (cfg.vocab_size, h), 1.0)
    for i, kind in enumerate(cfg.layer_kinds):
        p = f"model.layers.{i}"
        if kind == "linear":
            _deltanet(d, f"{p}.linear_attn", cfg)
        else:
            _qwen_attention(d, f"{p}.self_attn", cfg)
        for name, (o, n) in (("gate_proj", (cfg.intermediate_size, h)), ("up_proj", (cfg.intermediate_size, h)),
                             ("down_proj", (h, cfg.intermediate_size))):
            d.linear(f"{p}.mlp.{name}.weight", o, n)
        d.normal(f"{p}.input_layernorm.weight", (h,), 0.1)
        d.normal(f"{p}.post_attention_layernorm.weight", (h,), 0.1)
    d.normal("model.norm.weight", (h,), 0.1)
    d.linear("lm_head.weight", cfg.vocab_size, h)
    return d.out


def _mamba2(d: _Draw, p: str, cfg: NemotronHConfig) -> None:
    g, inner = cfg.geometry(), cfg.mamba_heads * cfg.mamba_head_dim
    d.linear(f"{p}.in_proj.weight", inner + g.conv_dim + cfg.mamba_heads, cfg.hidden_size)
    d.normal(f"{p}.conv1d.weight", (g.conv_dim, 1, cfg.conv_kernel), cfg.conv_kernel ** -0.5)
    d.normal(f"{p}.conv1d.bias", (g.conv_dim,), 0.5)
    d.normal(f"{p}.dt_bias", (cfg.mamba_heads,), 0.25, mean=0.5)
    d.normal(f"{p}.A_log", (cfg.mamba_heads,), 0.5)
    d.normal(f"{p}.D", (cfg.mamba_heads,), 0.1, mean=1.0)
    d.norm(f"{p}.norm.weight", inner)
    d.linear(f"{p}.out_proj.weight", cfg.hidden_size, inner)


def nemotron_h_weights(cfg: NemotronHConfig) -> dict[str, torch.Tensor]:
    """Every parameter of ``NemotronHForCausalLM`` for ``cfg`` (untied head), fp32."""
    d = _Draw(cfg.seed)
    h, hd = cfg.hidden_size, cfg.head_dim
    d.normal("model.embeddings.weight", (cfg.vocab_size, h), 1.0)
    for i, kind in enumerate(cfg.layer_kinds):
        p = f"model.layers.{i}"
        d.norm(f"{p}.norm.weight", h)
        if kind == "linear":
            _mamba2(d, f"{p}.mixer", cfg)
        elif kind == "full":
            for name, (o, n) in (("q_proj", (cfg.num_heads * hd, h)), ("k_proj", (cfg.num_kv_heads * hd, h)),
                                 ("v_proj", (cfg.num_kv_heads * hd, h)), ("o_proj", (h, cfg.num_heads * hd))):
                d.linear(f"{p}.mixer.{name}.weight", o, n)
        else:
            d.linear(f"{p}.mixer.up_proj.weight", cfg.intermediate_size, h)
            d.linear(f"{p}.mixer.down_proj.weight", h, cfg.intermediate_size)
    d.norm("model.norm_f.weight", h)
    d.linear("lm_head.weight", cfg.vocab_size, h)
    return d.out
