"""`Adaptive` (the default): the candidate score that would have hit most on the live traffic.

No fixed score wins everywhere: recency wins where the next request reuses what was just
used (a chat's next turn), frequency where a few prefixes return among many that do not
(popular system prompts, sessions that come back after a while), and how much frequency
should weigh against recency depends on the traffic. So the policy runs the candidates
side by side on a sample of the traffic (`hicache.radix.policies.shadow`: miniature
simulation) and ranks the live cache by the one that hits most:

    every request    (`requested`: the tree's match, the plugin's lookup) the traffic's
                     pace is counted; a sampled request is served by every mini cache
    every `WINDOW`   each candidate's hit tokens in the window join its running total
    sampled requests (older windows weigh `DECAY` less each); the live score changes to
                     the best candidate only when it leads the live one by `MARGIN`
                     (relative) at `PATIENCE` decisions in a row: hysteresis, so that
                     near-equal candidates do not flap
    evictions        rank by the live candidate; every candidate's aging (lfuda's L)
                     follows the live cache's victims, so a switch finds it current

    candidates   rf1 (live first: recency with a little frequency), lru, lfuda, rf4, rf16
                 (`hicache.radix.policies.scores`)

Cost: a hash of two 64-byte pieces per request, and the mini caches' work on the sampled
ones (bounded by `hicache.radix.policies.shadow.MAX_CHUNKS` chunks each); memory:
``stats()["memory_bytes"]``. Which score is live and why (each candidate's hit rate in
the mini caches) is in ``stats()``.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

from hicache.radix.policies.base import EvictionPolicy
from hicache.radix.policies.ghosts import Ghosts
from hicache.radix.policies.scores import Pace, Score, make_score
from hicache.radix.policies.shadow import Shadows

CANDIDATES = ("rf1", "lru", "lfuda", "rf4", "rf16")  # the first is live until the mini caches say otherwise
WINDOW = 16  # sampled requests per decision
DECAY = 0.8  # weight of the running totals at each decision
MARGIN = 0.03  # a challenger must beat the live score's total by this much (relative)
PATIENCE = 3  # at this many decisions in a row


class Adaptive(EvictionPolicy):
    """The live score chosen among `CANDIDATES` by mini caches (module docstring).

    Args:
        tiers: the owner's tier names.
        distinct_tokens: tokens the tiers hold together (what the mini caches model).
        chains: the owner's requests as chains (`hicache.radix.policies.requests`).
        history: the ghosts of items that left; clock: the owner's clock.
        candidates: the candidate scores' names (default `CANDIDATES`).
    """

    name = "adaptive"
    hears_requests = True

    def __init__(self, tiers: Iterable[str], distinct_tokens: int, chains, history: Ghosts | None,
                 clock: Callable[[], int], candidates: Sequence[str] = CANDIDATES) -> None:
        tiers = tuple(tiers)
        self.pace = Pace(distinct_tokens, clock)
        self.candidates = tuple(candidates)
        self._per_tier = [{t: make_score(n, self.pace) for t in tiers} for n in self.candidates]
        self.shadows = Shadows([make_score(n, self.pace) for n in self.candidates], distinct_tokens,
                               chains.chunk_tokens)
        self.chains = chains
        self.index = 0  # the live candidate
        super().__init__(self._per_tier[0], history, clock)
        self._ages = any(type(s).evicted is not Score.evicted for c in self._per_tier for s in c.values())
        self.totals = [0.0] * len(self.candidates)  # decayed hit tokens per candidate
        self.tokens = 0.0  # decayed tokens of the sampled requests (the totals' denominator)
        self._window_tokens = 0
        self._lead = 0  # decisions in a row the best challenger led by MARGIN
        self.switches = 0
        self._shadow_versions = [0] * len(self.candidates)

    @property
    def version(self) -> int:
        return self.switches + sum(s.version for c in self._per_tier for s in c.values())

    @property
    def live(self) -> str:
        return self.candidates[self.index]

    def _evicted(self, tier: str, item) -> None:
        for scores in self._per_tier:  # every candidate ages with the live cache's victims
            score = scores.get(tier)
            if score is not None:
                score.evicted(score.key(item.last_access, item.hit_count), self.clock())

    # ---- the traffic ---------------------------------------------------------------------
    def requested(self, request) -> None:
        """A request arrived: counted once (heard again: nothing), simulated if sampled."""
        heard = self.chains.heard(request)
        if heard is None:
            return
        tokens, sample = heard
        self.pace.add(tokens)
        shadows = self.shadows
        if not shadows.sampled(sample):
            return
        chain = self.chains.chain(request)
        shadows.observe(chain, self.clock())
        self._window_tokens += sum(t for _, t in chain)
        if shadows.requests % WINDOW == 0:
            self._decide()

    def _decide(self) -> None:
        """Fold the window into the totals; switch on a lead held `PATIENCE` times (hysteresis)."""
        hits = self.shadows.take_hits()
        self.totals = [DECAY * t + h for t, h in zip(self.totals, hits)]
        self.tokens = DECAY * self.tokens + self._window_tokens
        self._window_tokens = 0
        for i, mini in enumerate(self.shadows.minis):  # a blend's W follows the pace
            mini.score.refresh()
            if mini.score.version != self._shadow_versions[i]:
                self._shadow_versions[i] = mini.score.version
                self.shadows.rescore(i)
        best = max(range(len(self.totals)), key=self.totals.__getitem__)
        if best != self.index and self.totals[best] > self.totals[self.index] * (1 + MARGIN):
            self._lead += 1
            if self._lead >= PATIENCE:
                self.index, self._lead = best, 0
                self.scores = self._per_tier[best]
                self.switches += 1
        else:
            self._lead = 0

    def all_scores(self) -> list[Score]:
        return [s for c in self._per_tier for s in c.values()] + [m.score for m in self.shadows.minis]

    def stats(self) -> dict:
        """The live score, why (each candidate's hit rate in the mini caches), switches and memory."""
        out = super().stats()
        denom = max(self.tokens, 1.0)
        out.update({"switches": self.switches, "sample_rate": self.shadows.rate,
                    "sampled_requests": self.shadows.requests,
                    "why": {n: round(t / denom, 4) for n, t in zip(self.candidates, self.totals)},
                    "memory_bytes": out["memory_bytes"] + self.shadows.nbytes()})
        return out
