"""The linear-attention reference models' configs: tiny Qwen3.5 (Gated DeltaNet) and
Nemotron-H (Mamba-2) on the stack of `hicache.models.linear_hybrid`, pools and math float64.

    arch         layers (default 4)                       pools it reads and writes
    qwen3.5      linear, linear, linear, full (every 4th  attn_kv (k, v per page row), conv,
                 full, as the real model)                 recurrent (one working row each)
    nemotron-h   Mamba-2, MLP, Mamba-2, attention (the    the same; MLP layers hold no cache
                 real pattern's first blocks, repeated)

The dims keep what a cache must hold: a conv window of ``kernel - 1 = 3`` inputs, a
recurrent state of ``[heads, d_k, d_v]``, GQA attention over every earlier token (Qwen3.5
with its output gate and partial RoPE, Nemotron-H without RoPE).

float64: a chunk's projections round differently from the same tokens' in one pass (the
matmul blocks differ), and a recurrence carries that last-bit difference forward: in fp32
a request resumed from a snapshot and decoded token by token drifts up to ~1.1e-5 from
its one-pass recompute, at the 1e-5 tolerance. In float64 the drift is ~1e-13, so the
check sees the restored state alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from host_pools.spec import Stack
from hicache.models.linear_hybrid import HybridGeometry, deltanet, every_nth_full, linear_hybrid, mamba2

NEMOTRON_TOY_PATTERN = ("linear", "mlp", "linear", "full")  # M - M *, repeated past 4 layers


def check_positive(obj: object, names: tuple[str, ...]) -> None:
    """Every field in ``names`` of the config ``obj`` is an integer >= 1 (``ValueError`` naming it)."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(obj).__name__}.{name}: must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class _Attention:
    """Fields both toys share (the decoder, its GQA attention and the page)."""

    num_layers: int = 4
    hidden_size: int = 64
    vocab_size: int = 256
    intermediate_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    conv_kernel: int = 4
    page_size: int = 32
    rms_eps: float = 1e-6
    seed: int = 0

    def _check(self, extra: tuple[str, ...]) -> None:
        check_positive(self, ("num_layers", "hidden_size", "vocab_size", "intermediate_size", "num_heads",
                               "num_kv_heads", "head_dim", "page_size", *extra))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{type(self).__name__}.num_kv_heads: must divide num_heads={self.num_heads}")
        if self.conv_kernel < 2:
            raise ValueError(f"{type(self).__name__}.conv_kernel: must be >= 2, got {self.conv_kernel}")

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        return self.geometry().layer_kinds  # type: ignore[attr-defined]  (each arch's geometry)

    @property
    def identity(self) -> str:
        """The model identity (storage namespaces): arch, dims and seed."""
        g = self.geometry()  # type: ignore[attr-defined]
        return (f"hicache-reference/{self.arch}-L{self.num_layers}-h{self.hidden_size}-q{self.num_heads}"
                f"-kv{self.num_kv_heads}-d{self.head_dim}-c{g.conv_dim}x{self.conv_kernel}"
                f"-s{'x'.join(map(str, g.state_shape))}-p{self.page_size}-v{self.vocab_size}-seed{self.seed}")

    @property
    def compute_dtype(self) -> torch.dtype:
        """The model's math and pools: float64 (module docstring)."""
        return torch.float64

    def stack(self) -> Stack:
        """The hicache stack whose pools this model reads and writes."""
        return linear_hybrid(self.geometry(), self.identity)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Qwen35Config(_Attention):
    """A tiny Qwen3.5 text model (transformers' ``Qwen3_5TextConfig`` fields, small dims).

    Attributes (besides the shared ones):
        full_every: every ``full_every``-th layer is full attention (``full_attention_interval``).
        key_heads / value_heads / key_dim / value_dim: the Gated DeltaNet's heads.
        rotary: rotated channels of a head (``partial_rotary_factor * head_dim``).
    """

    full_every: int = 4
    key_heads: int = 2
    value_heads: int = 4
    key_dim: int = 8
    value_dim: int = 8
    rotary: int = 4
    rope_theta: float = 10000.0

    arch = "qwen3.5"

    def __post_init__(self) -> None:
        self._check(("full_every", "key_heads", "value_heads", "key_dim", "value_dim", "rotary"))
        if self.value_heads % self.key_heads:
            raise ValueError(f"Qwen35Config.key_heads: must divide value_heads={self.value_heads}")
        if self.rotary % 2 or self.rotary > self.head_dim:
            raise ValueError(f"Qwen35Config.rotary: must be even and <= head_dim, got {self.rotary}")

    def geometry(self) -> HybridGeometry:
        return deltanet(every_nth_full(self.num_layers, self.full_every), self.num_kv_heads, self.head_dim,
                        self.key_heads, self.value_heads, self.key_dim, self.value_dim, self.conv_kernel,
                        **_F64, page_size=self.page_size)


@dataclass(frozen=True)
class NemotronHConfig(_Attention):
    """A tiny Nemotron-H (transformers' ``NemotronHConfig`` fields, small dims).

    Attributes (besides the shared ones):
        mamba_heads / mamba_head_dim / n_groups / ssm_state: the Mamba-2 mixer.
        time_step_min: the floor of every time step (``time_step_limit``).
    """

    mamba_heads: int = 4
    mamba_head_dim: int = 8
    n_groups: int = 2
    ssm_state: int = 8
    time_step_min: float = 0.001
    rms_eps: float = 1e-5

    arch = "nemotron-h"

    def __post_init__(self) -> None:
        self._check(("mamba_heads", "mamba_head_dim", "n_groups", "ssm_state"))
        if self.mamba_heads % self.n_groups:
            raise ValueError(f"NemotronHConfig.n_groups: must divide mamba_heads={self.mamba_heads}")

    def geometry(self) -> HybridGeometry:
        kinds = tuple(NEMOTRON_TOY_PATTERN[i % len(NEMOTRON_TOY_PATTERN)] for i in range(self.num_layers))
        if set(kinds) == {"mlp"}:
            raise ValueError("NemotronHConfig.num_layers: the first layers must hold a cache")
        return mamba2(kinds, self.num_kv_heads, self.head_dim, self.mamba_heads, self.mamba_head_dim,
                      self.n_groups, self.ssm_state, self.conv_kernel, **_F64, page_size=self.page_size)


_F64 = {"kv_dtype": torch.float64, "conv_dtype": torch.float64, "state_dtype": torch.float64}
LinearConfig = Qwen35Config | NemotronHConfig
