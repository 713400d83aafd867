"""What a model computes per token: its layers' linear weights and attention reads (`ModelShape`).

The cost model (`hicache.cost.prefill`) turns a shape into prefill FLOPs; a preset carries
its model's shape (`hicache.models.presets.Preset.shape`), built here from the fields of the
model's public config, so a new preset adds its own from its config the same way.

Per layer, per query token at context length ``L`` (the tokens so far, itself included):

    linear     2 x linear_params FLOPs (the weights a token multiplies: projections, the
               experts it is routed to, compressors), whatever the context
    attention  2 x heads x (qk_dim + v_dim) per attended entry, where the entries are
                 window  the last ``window`` tokens (None: every token, full attention)
                 + compressed entries, one per ``ratio`` tokens (0: none), at most ``topk``
               + 2 x index_heads x index_dim per compressed entry (a sparse attention's
                 indexer scores every entry before its top-k)
               + state_flops (a recurrent layer: linear attention, Mamba)

    full attention (Llama)       window None
    sliding window (Gemma 3)     window W
    DeepSeek-V3.2 DSA            window 0, ratio 1, topk 2048, indexer 64 x 128
    DeepSeek-V4 CSA / HCA        window 128 + ratio 4 (topk 512, indexer 64 x 128) / ratio 128
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

WEIGHT_DTYPES = ("bf16", "fp8")  # the GEMM dtype a shape's linear layers run in


class Attention(NamedTuple):
    """What one layer's attention reads per query token (module docstring)."""

    heads: int
    qk_dim: int
    v_dim: int
    window: int | None = None  # None: every token at full resolution
    ratio: int = 0  # one compressed entry per `ratio` tokens (0: none)
    topk: int | None = None  # compressed entries attended at most (None: all)
    index_heads: int = 0  # the indexer scoring every compressed entry (0: none)
    index_dim: int = 0
    state_flops: int = 0  # per token, context-free (a recurrent layer)


class LayerGroup(NamedTuple):
    """``count`` layers of one kind: their attention and linear weights per token."""

    count: int
    attention: Attention
    linear_params: int


class ModelShape(NamedTuple):
    """A model's compute per token (module docstring).

    Attributes:
        name: the model it describes.
        groups: its layers, grouped by kind.
        head_params: weights used once per prefill (the LM head of the last token).
        weight_dtype: the GEMMs' dtype, one of `WEIGHT_DTYPES`.
        weight_bytes: the bytes of the weights one forward reads (active parameters).
    """

    name: str
    groups: tuple[LayerGroup, ...]
    head_params: int
    weight_dtype: str
    weight_bytes: int

    @property
    def num_layers(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def linear_params(self) -> int:
        """Active linear weights per token over every layer."""
        return sum(g.count * g.linear_params for g in self.groups)


def _check(name: str, **values: Any) -> None:
    for field, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: {field} must be an int >= 1, got {v!r}")


def dense_shape(name: str, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                vocab: int, weight_dtype: str = "bf16", windows: Sequence[int | None] | None = None,
                experts_per_token: int = 0, expert_ffn: int = 0) -> ModelShape:
    """A decoder of GQA layers with a gated MLP (Llama, Gemma, Qwen), optionally MoE.

    Args:
        windows: per layer its sliding window (None: full attention); default all full.
        experts_per_token / expert_ffn: routed experts per token and their width (0: dense MLP).
    Raises:
        ValueError: a size below 1, a window list of another length, or an unknown dtype.
    """
    _check(name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab)
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"{name}: weight_dtype must be one of {WEIGHT_DTYPES}, got {weight_dtype!r}")
    windows = [None] * layers if windows is None else list(windows)
    if len(windows) != layers:
        raise ValueError(f"{name}: {len(windows)} windows for {layers} layers")
    mlp = 3 * hidden * (experts_per_token * expert_ffn if experts_per_token else ffn)
    linear = hidden * head_dim * (2 * heads + 2 * kv_heads) + mlp
    groups = tuple(LayerGroup(windows.count(w), Attention(heads, head_dim, head_dim, window=w), linear)
                   for w in dict.fromkeys(windows))
    return _shape(name, groups, hidden * vocab, weight_dtype)


def _shape(name: str, groups: tuple[LayerGroup, ...], head_params: int, weight_dtype: str) -> ModelShape:
    per_param = 1 if weight_dtype == "fp8" else 2
    params = sum(g.count * g.linear_params for g in groups) + head_params
    return ModelShape(name, groups, head_params, weight_dtype, params * per_param)


def layered_shape(name: str, layer_kinds: Sequence[str], kinds: Mapping[str, tuple[Attention, int]],
                  head_params: int, weight_dtype: str = "bf16") -> ModelShape:
    """A model whose layer ``i`` is of kind ``layer_kinds[i]``, each kind's attention and linear
    weights per token in ``kinds`` (a linear-attention hybrid: `hicache.models.linear_hybrid`).

    Raises:
        KeyError: a layer of a kind ``kinds`` does not describe.
    """
    groups = tuple(LayerGroup(list(layer_kinds).count(k), *kinds[k]) for k in dict.fromkeys(layer_kinds))
    return _shape(name, groups, head_params, weight_dtype)


def deepseek_v3_shape(name: str = "deepseek-v3", sparse: bool = False) -> ModelShape:
    """DeepSeek-V3 (MLA, 61 layers: 3 dense, 58 MoE of 8 routed + 1 shared experts), fp8
    GEMMs; ``sparse``: V3.2's DSA (an indexer over every token, top-2048 attended in the
    absorbed 576 / 512 dims). Dims from the public config.json."""
    h, heads, q_lora, kv_lora, nope, rope, v = 7168, 128, 1536, 512, 128, 64, 128
    attn = h * q_lora + q_lora * heads * (nope + rope) + h * (kv_lora + rope) + kv_lora * heads * (nope + v) \
        + heads * v * h
    if sparse:
        attn += q_lora * 64 * 128 + h * 128 + h * 64  # the indexer's query, key and weights
        kind = Attention(heads, kv_lora + rope, kv_lora, window=0, ratio=1, topk=2048, index_heads=64, index_dim=128)
    else:
        kind = Attention(heads, nope + rope, v)
    dense, moe = attn + 3 * h * 18432, attn + 9 * 3 * h * 2048 + h * 256
    return _shape(name, (LayerGroup(3, kind, dense), LayerGroup(58, kind, moe)), h * 129280, "fp8")


V4_DIMS = {  # the public configs of DeepSeek-V4 (transformers' DeepseekV4Config field values)
    "deepseek-v4-flash": dict(hidden=4096, heads=64, q_lora=1024, o_groups=8, experts=256, moe_ffn=2048,
                              index_topk=512),
    "deepseek-v4-pro": dict(hidden=7168, heads=128, q_lora=1536, o_groups=16, experts=384, moe_ffn=3072,
                            index_topk=1024),
}


def deepseek_v4_shape(name: str, compress_ratios: Sequence[int]) -> ModelShape:
    """DeepSeek-V4 (`V4_DIMS`): per layer MQA over a 128-token window (head 512, K = V) plus,
    at ratio 4, the top-k of the compressed entries chosen by the Lightning indexer (64 x
    128, scoring every entry) or, at ratio 128, every compressed entry; 6 routed + 1 shared
    experts; the compressors' projections counted as linear weights; fp8 GEMMs."""
    d = V4_DIMS[name]
    h, heads, head, window, o_lora = d["hidden"], d["heads"], 512, 128, 1024
    base = (h * d["q_lora"] + d["q_lora"] * heads * head + h * head + heads * head * o_lora
            + d["o_groups"] * o_lora * h + 7 * 3 * h * d["moe_ffn"] + h * d["experts"])
    kinds = {
        0: (Attention(heads, head, head, window=window), base),
        4: (Attention(heads, head, head, window=window, ratio=4, topk=d["index_topk"], index_heads=64,
                      index_dim=128),
            base + 2 * h * 2 * head + d["q_lora"] * 64 * 128 + h * 64 + 2 * h * 2 * 128),
        128: (Attention(heads, head, head, window=window, ratio=128), base + 2 * h * head),
    }
    ratios = list(compress_ratios)
    groups = tuple(LayerGroup(ratios.count(r), *kinds[r]) for r in sorted(set(ratios)))
    return _shape(name, groups, h * 129280, "fp8")


def shape_from_hf(config: Mapping[str, Any], name: str = "model") -> ModelShape:
    """The shape of a Hugging Face decoder config (``config.json`` as a dict): GQA layers with a
    gated MLP, optionally sliding windows (``layer_types`` / ``sliding_window_pattern``) and
    routed experts (``num_experts_per_tok``); a multimodal config's ``text_config``.

    Raises:
        ValueError: a field missing or of the wrong type (the message names it).
    """
    config = config.get("text_config") or config

    def need(key: str) -> int:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: config field {key!r} must be an int >= 1, got {value!r}")
        return value

    layers, hidden, heads = need("num_hidden_layers"), need("hidden_size"), need("num_attention_heads")
    head_dim = config.get("head_dim") or hidden // heads
    experts = config.get("num_experts_per_tok") or 0
    expert_ffn = (config.get("moe_intermediate_size") or config.get("intermediate_size") or 0) if experts else 0
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return dense_shape(name, layers, hidden, heads, config.get("num_key_value_heads") or heads, head_dim,
                       need("intermediate_size") if not experts else 1, need("vocab_size"),
                       "fp8" if "float8" in dtype else "bf16", _windows(config, layers), experts, expert_ffn)


def _windows(config: Mapping[str, Any], layers: int) -> list[int | None]:
    """Per layer its sliding window (None: full attention), from a config's fields."""
    window = config.get("sliding_window")
    kinds = config.get("layer_types")
    if isinstance(kinds, list) and len(kinds) == layers:
        return [window if k == "sliding_attention" else None for k in kinds]
    pattern = config.get("sliding_window_pattern")
    if window and isinstance(pattern, int) and pattern > 0:  # every pattern-th layer is full
        return [None if (i + 1) % pattern == 0 else window for i in range(layers)]
    return [window if window and config.get("use_sliding_window", True) else None] * layers
