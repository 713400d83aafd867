"""How close served logits are to the recompute's as distributions: KL and top-1 agreement.

``verify-model`` is exact (`TOLERANCE` on every logit) when the MHA toy's pool is fp32. A
bf16 pool (``--kv-dtype bfloat16``, the default with ``--hicache-host-dtype int8``) is not:
a chunked prefill and the recompute's one prefill round K and V to bf16 from fp32 values
that differ in the last bits, and an int8 host tier gives back a quantized prefix. Such a
run is judged by distributions instead (tolerances in `hicache.reference.options`):

    per served position   KL(recompute || served) of the softmaxed logits, and
                          whether both argmaxes agree
    restored requests     (any prompt token from host or storage): mean KL, max KL and
                          top-1 agreement over all their positions -> the report's
                          ``mean_kl``, ``max_kl``, ``top1_agreement``
    every request         max KL <= MAX_KL_TOLERANCE (else it counts as mismatched)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hicache.reference.options import MAX_KL_TOLERANCE, MEAN_KL_TOLERANCE, TOP1_TOLERANCE


def kl_per_position(reference: torch.Tensor, served: torch.Tensor) -> torch.Tensor:
    """KL(softmax(reference) || softmax(served)) per row of ``[N, vocab]`` logits (fp64 math)."""
    ref = torch.log_softmax(reference.double(), dim=-1)
    test = torch.log_softmax(served.double(), dim=-1)
    return (ref.exp() * (ref - test)).sum(-1).clamp_min(0)


@dataclass(slots=True)
class Agreement:
    """Per-position KL and top-1 agreement, accumulated over a run's requests."""

    restored_requests: int = 0
    restored_positions: int = 0
    top1_same: int = 0
    kl_sum: float = 0.0
    max_kl_restored: float = 0.0
    max_kl_any: float = 0.0

    def add(self, reference: torch.Tensor, served: torch.Tensor, restored: bool) -> float:
        """Account one request's served logits against the recompute's; returns its max KL.

        Args:
            reference / served: ``[N, vocab]`` logits of the same positions.
            restored: whether any prompt token came from host or storage.
        """
        kl = kl_per_position(reference, served)
        worst = float(kl.max()) if kl.numel() else 0.0
        self.max_kl_any = max(self.max_kl_any, worst)
        if restored:
            self.restored_requests += 1
            self.restored_positions += int(kl.numel())
            self.kl_sum += float(kl.sum())
            self.max_kl_restored = max(self.max_kl_restored, worst)
            self.top1_same += int((reference.argmax(-1) == served.argmax(-1)).sum())
        return worst

    @property
    def mean_kl(self) -> float | None:
        return self.kl_sum / self.restored_positions if self.restored_positions else None

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_same / self.restored_positions if self.restored_positions else None

    def within_tolerance(self) -> bool:
        """Restored requests' mean KL and top-1 agreement, and every request's max KL, in bounds."""
        if self.max_kl_any > MAX_KL_TOLERANCE:
            return False
        if not self.restored_positions:
            return True
        return self.mean_kl <= MEAN_KL_TOLERANCE and self.top1_agreement >= TOP1_TOLERANCE

    def as_json(self) -> dict:
        """``mean_kl``, ``max_kl`` and ``top1_agreement`` of restored requests (``None``: none)."""
        none = not self.restored_positions
        return {"mean_kl": self.mean_kl, "max_kl": None if none else self.max_kl_restored,
                "top1_agreement": self.top1_agreement, "restored_requests": self.restored_requests}
