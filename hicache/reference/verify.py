"""`run_verify`: a multi-turn workload served through the hierarchy, every request's logits
checked against an uninterrupted recompute.

    for each turn (conversations interleaved at random, `hicache.reference.workload`):
        served    = ModelServer.serve(prompt, decode)   restored prefix + computed rest + decode
        reference = the whole sequence in one prefill on private pools (nothing restored)
        check     max |served - reference| over the served positions <= TOLERANCE, and
                  every greedy token == the reference's argmax at its position

The cache is sized small (``--device-tokens``, ``--hicache-ratio``) so prefixes leave the
device for the host and the host for storage, and come back at arbitrary turns. The
storage tier defaults to a file store in a temporary directory removed at the end.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field, replace
from typing import NamedTuple

import numpy as np
import torch

from hicache.build import build, build_device_pools
from hicache.radix import HiRadixCache
from hicache.reference.agreement import Agreement
from hicache.reference.config import LINEAR_ARCHS, Dsv4Config, MhaConfig, ToyConfig, toy_config
from hicache.reference.dsv4 import Dsv4Model
from hicache.reference.linear_config import NemotronHConfig, Qwen35Config
from hicache.reference.nemotron_h import NemotronHModel
from hicache.reference.qwen35 import Qwen35Model
from hicache.reference.options import (MAX_KL_TOLERANCE, TOLERANCE, TOY_INTERVAL_PAGES, WRONG_BOUNDARY, VerifyOptions,
                                       check_sizes, pool_kv_dtype, verify_config)
from hicache.reference.mha import MhaModel
from hicache.reference.paged import PagedModel, PagedSeq
from hicache.reference.serve import TIERS, Fault, ModelServer, Served, WrongBoundary
from hicache.reference.workload import longest_request, schedule
from hicache.tmpdirs import OwnedDir



@dataclass(slots=True)
class VerifyReport:
    """Totals of one run (``tokens_from`` counts prompt tokens; greedy counts decoded tokens).

    ``mean_kl`` / ``max_kl`` / ``top1_agreement``: over requests restored from host or storage
    (`hicache.reference.agreement`; ``None`` when none was). ``criterion``: ``exact`` (an fp32
    pool: every logit within ``tolerance``, greedy tokens identical) or ``distribution`` (a
    bf16 pool: the KL and top-1 tolerances of `hicache.reference.options`).
    """

    requests: int = 0
    tokens_from: dict = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    max_abs_logit_diff: float = 0.0
    greedy_identical: int = 0
    greedy_total: int = 0
    ok: bool = False
    tolerance: float = TOLERANCE
    mismatched_requests: int = 0
    arch: str = ""
    model: str = ""
    fault: str | None = None
    fault_rows: int = 0
    topk_exercised: float | None = None  # DeepSeek-V4: share of indexer queries with more entries than top-k
    topk_min_gap: float | None = None  # and the smallest score gap at the top-k boundary (near 0: a near-tie)
    host_dtype: str = "auto"
    kv_dtype: str = "float32"
    criterion: str = "exact"
    mean_kl: float | None = None
    max_kl: float | None = None
    top1_agreement: float | None = None
    restored_requests: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict:
        return asdict(self)


MODELS = {Dsv4Config: Dsv4Model, MhaConfig: MhaModel, Qwen35Config: Qwen35Model, NemotronHConfig: NemotronHModel}


def make_model(cfg: ToyConfig, device: str) -> PagedModel:
    """The paged reference model of ``cfg`` on ``device``."""
    return MODELS[type(cfg)](cfg, device)


class Recompute:
    """The reference: a whole sequence in one prefill on private device pools."""

    def __init__(self, model: PagedModel, cfg: ToyConfig, device: str) -> None:
        self.model, self.stack, self.device = model, cfg.stack(), torch.device(device)
        self.root, self.window = next(iter(self.stack.snapshot_slots.items()), (None, 0))
        self.pools, self.capacity = None, 0

    def logits(self, tokens: np.ndarray) -> torch.Tensor:
        page = self.stack.page_size
        if tokens.size > self.capacity:  # grow to whole pages (doubling, to rebuild rarely)
            self.capacity = max(-(-tokens.size // page) * page, 2 * self.capacity)
            roots = {self.stack.anchor.name: self.capacity, self.root: self.window}
            rows = {p.name: roots[self.stack.root_of(p.name).name] // p.tokens_per_row for p in self.stack}
            self.pools = build_device_pools(self.stack, rows, self.device)
        work = torch.arange(self.window) if self.window else None
        seq = PagedSeq(self.stack, self.pools, torch.arange(self.capacity), work, codecs=self.model.codecs)
        return self.model.forward(seq, torch.from_numpy(tokens)).cpu()


def snapshot_interval(opts: VerifyOptions, cfg: ToyConfig) -> int:
    """Tokens between the snapshots requests save: ``--hicache-state-interval``, by default
    `TOY_INTERVAL_PAGES` pages for the linear toys (their recurrent roots are sized by it)
    and every page for DeepSeek-V4 (its swa root by ``SWA_FULL_TOKENS_RATIO``).

    Raises:
        ValueError: an interval that is not a multiple of the page (naming the flag).
    """
    page = cfg.page_size
    if opts.state_interval % page or opts.state_interval < 0:
        raise ValueError(f"--hicache-state-interval: must be a multiple of the page ({page} tokens), "
                         f"got {opts.state_interval}")
    return opts.state_interval or page * (TOY_INTERVAL_PAGES if cfg.arch in LINEAR_ARCHS else 1)


def device_tokens(opts: VerifyOptions, page_size: int) -> int:
    """``--device-tokens``, or by default one page more than the longest request needs."""
    if opts.device_tokens:
        return opts.device_tokens
    return (-(-longest_request(opts.turns, opts.decode_tokens) // page_size) + 1) * page_size


def check_options(opts: VerifyOptions, cfg: ToyConfig) -> None:
    """Flag checks `HiCacheConfig` does not make; ``ValueError`` naming the flag."""
    stack = cfg.stack()
    faults = [p.name for p in stack.data_pools()] + ([WRONG_BOUNDARY] if stack.snapshot_slots else [])
    if opts.fault is not None and opts.fault not in faults:
        raise ValueError(f"--fault: {opts.fault!r} is not a pool of the {opts.arch} model; "
                         f"allowed: {', '.join(faults)}")
    snapshot_interval(opts, cfg)  # a page multiple
    if opts.storage_backend not in ("none", "file"):
        raise ValueError(f"--hicache-storage-backend: must be one of none, file, got {opts.storage_backend!r}")
    need = -(-longest_request(opts.turns, opts.decode_tokens) // cfg.page_size) * cfg.page_size
    if opts.device_tokens and opts.device_tokens < need:
        raise ValueError(f"--device-tokens: the longest request of {opts.turns} turns may take {need} tokens "
                         f"(whole pages); got {opts.device_tokens}")
    if opts.device != "cpu" and not (opts.device.startswith("cuda") and torch.cuda.is_available()):
        raise ValueError(f"--device: must be cpu or an available cuda device, got {opts.device!r}")


def run_verify(opts: VerifyOptions, progress=None) -> VerifyReport:
    """Serve the workload and check every request (module docstring).

    Raises:
        ValueError: a bad option (naming its flag), or a cache too small for one request.
    """
    check_sizes(opts)
    kv_dtype = pool_kv_dtype(opts)
    cfg = toy_config(opts.arch, opts.layers, opts.seed, opts.kv_format, kv_dtype)
    check_options(opts, cfg)
    system, turns = schedule(opts.conversations, opts.turns, cfg.vocab_size, opts.seed)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if opts.storage_backend == "file" and not opts.storage_dir:
            opts = replace(opts, storage_dir=str(stack.enter_context(OwnedDir("hicache-verify-")).path))
        interval = snapshot_interval(opts, cfg)
        cache = build(cfg.stack(), device_tokens(opts, cfg.page_size), verify_config(opts, cfg.identity, interval),
                      opts.device)
        stack.callback(cache.close)
        tree = HiRadixCache(cache)
        stack.callback(tree.close)
        model = make_model(cfg, opts.device)
        fault = _fault(opts, cache, model)
        report = VerifyReport(arch=opts.arch, model=cfg.identity, fault=opts.fault, host_dtype=opts.host_dtype,
                              kv_dtype="float64" if cfg.arch in LINEAR_ARCHS else kv_dtype,  # the linear toys' pools
                              criterion="exact" if kv_dtype == "float32" else "distribution")
        agreement = Agreement()
        server = ModelServer(model, cache, tree, fault, interval)
        _serve_all(server, Recompute(model, cfg, opts.device), system, turns, opts.decode_tokens, report, agreement,
                   progress)
        for key, value in agreement.as_json().items():
            setattr(report, key, value)
        report.fault_rows = fault.rows_corrupted if fault else 0
        topk = getattr(model, "topk", None)
        if topk is not None and topk.queries:
            report.topk_exercised = round(topk.exercised / topk.queries, 4)
            report.topk_min_gap = topk.min_gap if topk.exercised else None
    report.seconds = round(time.perf_counter() - t0, 3)
    report.ok = report.requests > 0 and report.mismatched_requests == 0
    if report.criterion == "distribution":
        report.ok = report.ok and agreement.within_tolerance()
    return report


def _fault(opts: VerifyOptions, cache, model: PagedModel) -> Fault | WrongBoundary | None:
    """The run's negative control (``--fault``), or ``None``."""
    if opts.fault is None:
        return None
    if opts.fault == WRONG_BOUNDARY:
        return WrongBoundary()
    return Fault(cache, opts.fault, opts.seed, model.codecs.get(opts.fault))


class Comparison(NamedTuple):
    """A served request against the reference: max |logit diff|, greedy tokens identical, its
    max KL per position, and which criterion judges it (`VerifyReport.criterion`)."""

    max_abs_logit_diff: float
    greedy_identical: int
    greedy_total: int
    max_kl: float = 0.0
    criterion: str = "exact"

    @property
    def ok(self) -> bool:
        if self.criterion == "distribution":  # a bf16 pool: rounding moves logits, not distributions
            return self.max_kl <= MAX_KL_TOLERANCE
        return self.max_abs_logit_diff <= TOLERANCE and self.greedy_identical == self.greedy_total


def compare(recompute: Recompute, prompt: np.ndarray, served: Served, agreement: Agreement | None = None,
            criterion: str = "exact") -> Comparison:
    """Check ``served`` (a request of ``prompt``) against the uninterrupted recompute of its
    sequence; its KL and top-1 agreement are accounted in ``agreement`` (a fresh one if ``None``)."""
    full = np.concatenate([prompt, np.asarray(served.generated[:-1], np.int64)])
    reference = recompute.logits(full)
    diff = float((served.logits - reference[served.start:]).abs().max())
    greedy = reference[prompt.size - 1:].argmax(dim=-1).tolist()
    same = sum(a == b for a, b in zip(greedy, served.generated))
    restored = served.tokens_from["host"] + served.tokens_from["storage"] > 0
    max_kl = (agreement or Agreement()).add(reference[served.start:], served.logits, restored)
    return Comparison(diff, same, len(served.generated), max_kl, criterion)


def _serve_all(server: ModelServer, recompute: Recompute, system: np.ndarray, turns, decode: int,
               report: VerifyReport, agreement: Agreement, progress) -> None:
    history: dict[int, np.ndarray] = {}
    for i, turn in enumerate(turns):
        prompt = np.concatenate([history.get(turn.conversation, system), turn.user])
        served = server.serve(prompt, decode)
        c = compare(recompute, prompt, served, agreement, report.criterion)
        report.requests += 1
        for tier, n in served.tokens_from.items():
            report.tokens_from[tier] += n
        report.max_abs_logit_diff = max(report.max_abs_logit_diff, c.max_abs_logit_diff)
        report.greedy_identical += c.greedy_identical
        report.greedy_total += c.greedy_total
        report.mismatched_requests += int(not c.ok)
        server.tree.check_integrity()  # every invariant of tree and allocators, between requests
        history[turn.conversation] = np.concatenate([prompt, np.asarray(served.generated, np.int64)])
        if progress is not None:
            progress(i + 1, len(turns))
