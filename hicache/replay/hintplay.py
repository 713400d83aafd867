"""Client hints in a replay: a trace line's envelopes sent to the tree around its request,
as the trace has them (``--hints on``), not at all (``off``), or turned wrong (``wrong``).

    mode    what the tree gets
    on      the trace's envelopes as they are
    off     nothing (the same workload, its policy alone)
    wrong   a bad client's: every retain (and the demote that goes with it: the context
            kept on the host) becomes a release and every release a retain (the trace's
            median retain_s, default priority): it retains what never returns and
            releases what does; prefetch and persist stay

Each envelope's tickets are kept; the run reports how many ended in each state.
"""
from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Callable, Sequence

from hicache.replay.args import HINT_MODES
from hicache.replay.workload import Request

__all__ = ["HINT_MODES", "HintPlayer", "wrong_envelope"]


def wrong_envelope(envelope: dict, ttl_s: float) -> dict:
    """``envelope`` as a bad client sends it (module docstring)."""
    out = {k: v for k, v in envelope.items() if k not in ("retain_s", "priority", "release")}
    if "retain_s" in envelope:
        out.pop("demote", None)
        out["release"] = True
    if envelope.get("release"):
        out["retain_s"] = ttl_s
    return out


class HintPlayer:
    """Sends the hints of a replay's requests to its tree (module docstring).

    Args:
        tree: the `HiRadixCache`; mode: one of `HINT_MODES`; requests: the workload (for
            the wrong mode's retain_s); step: a scheduler step (launch, poll), run after
            each request's hints so that the copies they queued run.
    """

    def __init__(self, tree: Any, mode: str, requests: Sequence[Request], step: Callable[[], None]) -> None:
        self.tree, self.mode, self.step = tree, mode, step
        ttls = [h.envelope["retain_s"] for r in requests for h in r.hints if "retain_s" in h.envelope]
        self.wrong_ttl_s = statistics.median(ttls) if ttls else 60.0
        self.tickets: list = []

    def send(self, req: Request, tokens: Any, when: str) -> None:
        """Send ``req``'s hints of ``when`` (``"before"`` / ``"after"``) on its prompt, then a step."""
        envelopes = [h.envelope for h in req.hints if h.when == when] if self.mode != "off" else []
        for env in envelopes:
            env = env if self.mode == "on" else wrong_envelope(env, self.wrong_ttl_s)
            self.tickets += self.tree.hint_envelope(tokens, env)
        if envelopes:
            self.step()

    def states(self) -> dict[str, int]:
        """Tickets per final state (``accepted``: still in force at the end)."""
        return dict(Counter(t.state.value for t in self.tickets))
