"""Random weights of the reference models from a seed, named as transformers names them.

The names are the state-dict keys of transformers' ``DeepseekV4ForCausalLM`` and
``LlamaForCausalLM``, so the oracle loads the very same tensors (``load_state_dict``,
strict). The init is non-degenerate on purpose (transformers' own init zeroes the sinks,
position biases and hyper-connection biases and draws weights at std 0.02, which makes a
tiny model's logits near-constant and its attention near-uniform): every linear weight
is N(0, 1/fan_in), norms 1 + N(0, 0.1), biases and sinks N(0, 0.5), embeddings N(0, 1), so
activations and logits are O(1) and a restored state that is wrong shows in the logits.

Indexer top-k ties: ReLU scores are exactly 0 only when every indexer head's ``q . k`` is
<= 0; with 16 heads of random directions that is ~2^-16 per (query, entry) pair, and two
distinct positive scores tie with probability 0. The tests measure the gap at the top-k
boundary (``Dsv4Model.topk_gaps``) instead of trusting this argument.
"""
from __future__ import annotations

import torch

from hicache.reference.config import Dsv4Config, MhaConfig


class _Draw:
    """Draws named tensors from one seeded generator, in call order."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.out: dict[str, torch.Tensor] = {}

    def normal(self, name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> None:
        self.out[name] = torch.randn(shape, generator=self.gen) * std + mean

    def linear(self, name: str, out_features: int, in_features: int) -> None:
        self.normal(name, (out_features, in_features), in_features ** -0.5)

    def norm(self, name: str, size: int) -> None:
        self.normal(name, (size,), 0.1, mean=1.0)


def _compressor(d: _Draw, p: str, cfg: Dsv4Config, ratio: int, dim: int, overlap: bool) -> None:
    width = 2 * dim if overlap else dim
    d.linear(f"{p}.kv_proj.weight", width, cfg.hidden_size)
    d.linear(f"{p}.gate_proj.weight", width, cfg.hidden_size)
    d.normal(f"{p}.position_bias", (ratio, width), 0.5)
    d.norm(f"{p}.kv_norm.weight", dim)


def _hyper(d: _Draw, p: str, cfg: Dsv4Config) -> None:
    hc = cfg.hc_mult
    d.normal(f"{p}.fn", ((2 + hc) * hc, hc * cfg.hidden_size), (hc * cfg.hidden_size) ** -0.5)
    d.normal(f"{p}.base", ((2 + hc) * hc,), 0.5)
    d.normal(f"{p}.scale", (3,), 0.1, mean=1.0)


def _attention(d: _Draw, p: str, cfg: Dsv4Config, ratio: int) -> None:
    h, hd = cfg.hidden_size, cfg.head_dim
    d.linear(f"{p}.q_a_proj.weight", cfg.q_lora_rank, h)
    d.norm(f"{p}.q_a_norm.weight", cfg.q_lora_rank)
    d.linear(f"{p}.q_b_proj.weight", cfg.num_heads * hd, cfg.q_lora_rank)
    d.linear(f"{p}.kv_proj.weight", hd, h)
    d.norm(f"{p}.kv_norm.weight", hd)
    d.linear(f"{p}.o_a_proj.weight", cfg.o_groups * cfg.o_lora_rank, cfg.num_heads * hd // cfg.o_groups)
    d.linear(f"{p}.o_b_proj.weight", h, cfg.o_groups * cfg.o_lora_rank)
    d.normal(f"{p}.sinks", (cfg.num_heads,), 0.5)
    if ratio:
        _compressor(d, f"{p}.compressor", cfg, ratio, hd, overlap=ratio == cfg.c4_ratio)
    if ratio == cfg.c4_ratio:
        q = f"{p}.compressor.indexer"
        _compressor(d, q, cfg, ratio, cfg.index_head_dim, overlap=True)
        d.linear(f"{q}.q_b_proj.weight", cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank)
        d.linear(f"{q}.scorer.weights_proj.weight", cfg.index_n_heads, h)


def _moe(d: _Draw, p: str, cfg: Dsv4Config, hashed: bool) -> None:
    h, inter, e = cfg.hidden_size, cfg.moe_intermediate, cfg.num_experts
    d.linear(f"{p}.gate.weight", e, h)
    if hashed:  # distinct experts per token id
        ranks = torch.rand((cfg.vocab_size, e), generator=d.gen).argsort(dim=-1)
        d.out[f"{p}.gate.tid2eid"] = ranks[:, :cfg.experts_per_token].contiguous()
    else:
        d.normal(f"{p}.gate.e_score_correction_bias", (e,), 0.1)
    d.normal(f"{p}.experts.gate_up_proj", (e, 2 * inter, h), h ** -0.5)
    d.normal(f"{p}.experts.down_proj", (e, h, inter), inter ** -0.5)
    for name, (o, i) in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
        d.linear(f"{p}.shared_experts.{name}.weight", o, i)


def dsv4_weights(cfg: Dsv4Config) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer of ``DeepseekV4ForCausalLM`` for ``cfg``, fp32."""
    d = _Draw(cfg.seed)
    h = cfg.hidden_size
    d.normal("model.embed_tokens.weight", (cfg.vocab_size, h), 1.0)
    for i, ratio in enumerate(cfg.compress_ratios):
        p = f"model.layers.{i}"
        _hyper(d, f"{p}.attn_hc", cfg)
        d.norm(f"{p}.input_layernorm.weight", h)
        _attention(d, f"{p}.self_attn", cfg, ratio)
        _hyper(d, f"{p}.ffn_hc", cfg)
        d.norm(f"{p}.post_attention_layernorm.weight", h)
        _moe(d, f"{p}.mlp", cfg, hashed=i < cfg.num_hash_layers)
    hc = cfg.hc_mult
    d.normal("model.hc_head.hc_fn", (hc, hc * h), (hc * h) ** -0.5)
    d.normal("model.hc_head.hc_base", (hc,), 0.5)
    d.normal("model.hc_head.hc_scale", (1,), 0.1, mean=1.0)
    d.norm("model.norm.weight", h)
    d.linear("lm_head.weight", cfg.vocab_size, h)
    return d.out


def mha_weights(cfg: MhaConfig) -> dict[str, torch.Tensor]:
    """Every parameter of ``LlamaForCausalLM`` for ``cfg`` (untied head), fp32."""
    d = _Draw(cfg.seed)
    h, hd = cfg.hidden_size, cfg.head_dim
    d.normal("model.embed_tokens.weight", (cfg.vocab_size, h), 1.0)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        d.norm(f"{p}.input_layernorm.weight", h)
        d.linear(f"{p}.self_attn.q_proj.weight", cfg.num_heads * hd, h)
        d.linear(f"{p}.self_attn.k_proj.weight", cfg.num_kv_heads * hd, h)
        d.linear(f"{p}.self_attn.v_proj.weight", cfg.num_kv_heads * hd, h)
        d.linear(f"{p}.self_attn.o_proj.weight", h, cfg.num_heads * hd)
        d.norm(f"{p}.post_attention_layernorm.weight", h)
        d.linear(f"{p}.mlp.gate_proj.weight", cfg.intermediate_size, h)
        d.linear(f"{p}.mlp.up_proj.weight", cfg.intermediate_size, h)
        d.linear(f"{p}.mlp.down_proj.weight", h, cfg.intermediate_size)
    d.norm("model.norm.weight", h)
    d.linear("lm_head.weight", cfg.vocab_size, h)
    return d.out
