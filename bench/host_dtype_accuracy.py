"""What an int8 host tier costs a real model: SmolLM2-135M, prefixes restored through
hicache's int8 host tier vs its default (bf16) tier, the continuation scored teacher-forced.

    python bench/host_dtype_accuracy.py                  # 6 x 1024-token prefixes, 256 scored
    python bench/host_dtype_accuracy.py --quick          # 1 x 256, 64 scored (seconds)

Per prefix: the model (transformers, CPU, ``--dtype``) prefills it; its KV is held in bf16
(a server's device pool), backed up through hicache's controller into the host tier and
loaded back (`bench.kv_tier`), once with ``--hicache-host-dtype auto`` (bf16 host rows,
byte-exact) and once with ``int8`` (int8 rows + an fp32 scale per token and head); the
restored bytes are checked against the format's definition (`transfer_kernels.quant.reference`).
Then the next ``--score`` tokens are fed teacher-forced on each restored KV and compared:
mean and max KL(bf16 tier || int8 tier) per position, top-1 agreement, ΔNLL of the real
next tokens. For scale, the same against the prefix's unrounded KV (the cost of holding KV
in bf16 at all) is reported too. Targets (fp32 compute, the default): mean KL <= 5e-4, top-1
agreement >= 0.99. With ``--dtype bfloat16`` the bf16 arithmetic's own distance from fp32
compute on the same KV is reported beside them: there the int8 row is of that noise's order.

Text: the Python language reference shipped with CPython (``pydoc_data.topics``), cut into
prefixes far apart; no download. Writes JSON and a PNG under ``bench/results/local/``
unless ``--out`` names the JSON (the PNG goes beside it).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.harness import RESULTS_DIR, format_table, write_json  # noqa: E402
from bench.kv_tier import KV, reference_round_trip, same_bytes, tier_round_trip  # noqa: E402

TARGET_MEAN_KL = 5e-4
TARGET_TOP1 = 0.99
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def corpus_text() -> str:
    """The Python language reference (``pydoc_data.topics``, shipped with CPython)."""
    import pydoc_data.topics as topics
    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def segments(text: str, tokenizer, count: int, length: int) -> list[list[int]]:
    """``count`` windows of ``length`` tokens spread evenly over ``text`` (far apart); only
    the windows are tokenized (~8 characters per token asked, far more than English takes).

    Raises:
        ValueError: the text is too short for ``count`` such windows.
    """
    chars = 8 * length
    stride = (len(text) - chars) // max(1, count - 1) if count > 1 else 0
    if stride < 0 or (count > 1 and stride < chars):
        raise ValueError(f"the corpus ({len(text)} characters) is too short for {count} x {length} tokens")
    out = []
    for i in range(count):
        ids = tokenizer(text[i * stride:i * stride + chars])["input_ids"]
        if len(ids) < length:
            raise ValueError(f"window {i} of the corpus has {len(ids)} tokens, {length} are needed")
        out.append(ids[:length])
    return out


def prefill_kv(model, prefix: torch.Tensor) -> KV:
    """The prefix's KV per layer as ``[T, H, D]`` in the model's dtype (post-RoPE keys)."""
    with torch.no_grad():
        cache = model(prefix.unsqueeze(0), use_cache=True).past_key_values
    return [(layer.keys[0].transpose(0, 1).contiguous(), layer.values[0].transpose(0, 1).contiguous())
            for layer in cache.layers]


def score(model, kv: KV, inputs: torch.Tensor) -> torch.Tensor:
    """Log-probabilities ``[N, vocab]`` (fp32) of ``inputs`` fed after a restored ``kv``."""
    from transformers import DynamicCache
    cache = DynamicCache()
    dtype = next(model.parameters()).dtype
    for i, (k, v) in enumerate(kv):
        cache.update(k.transpose(0, 1).unsqueeze(0).to(dtype), v.transpose(0, 1).unsqueeze(0).to(dtype), i)
    with torch.no_grad():
        logits = model(inputs.unsqueeze(0), past_key_values=cache).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def compare(ref: torch.Tensor, test: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """KL(ref || test) per position (mean, max), top-1 agreement and ΔNLL of ``targets``."""
    kl = (ref.exp() * (ref - test)).sum(-1).clamp_min(0)
    nll_ref = -ref.gather(1, targets[:, None]).mean()
    nll_test = -test.gather(1, targets[:, None]).mean()
    return {"mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
            "top1_agreement": float((ref.argmax(-1) == test.argmax(-1)).float().mean()),
            "nll_ref": float(nll_ref), "delta_nll": float(nll_test - nll_ref), "kl": kl}


def run_prefix(model, tokens: torch.Tensor, args: argparse.Namespace, fp32_model=None) -> list[dict]:
    """Both tiers on one prefix: rows ``int8 vs bf16 tier`` and ``bf16 tier vs unrounded KV``;
    with ``fp32_model`` (a bf16 ``model``), also the bf16 arithmetic's own distance from fp32
    on the same restored KV (the noise floor the int8 row is measured against)."""
    prefix, inputs, targets = tokens[:args.prefix], tokens[args.prefix:-1], tokens[args.prefix + 1:]
    raw = prefill_kv(model, prefix)
    held = [(k.to(torch.bfloat16), v.to(torch.bfloat16)) for k, v in raw]  # the device pool's bf16
    logp = {"unrounded": score(model, raw, inputs)}
    for host_dtype in ("auto", "int8"):
        restored = tier_round_trip(held, host_dtype, page_size=args.page_size, backend=args.io_backend)
        if not same_bytes(restored, reference_round_trip(held, host_dtype)):
            raise RuntimeError(f"host dtype {host_dtype}: the tier's bytes differ from quant_ref's")
        logp[host_dtype] = score(model, restored, inputs)
    rows = [{"compare": "int8 tier vs bf16 tier", **compare(logp["auto"], logp["int8"], targets)},
            {"compare": "bf16 tier vs unrounded KV", **compare(logp["unrounded"], logp["auto"], targets)}]
    if fp32_model is not None:
        fp32 = score(fp32_model, reference_round_trip(held), inputs)
        rows.append({"compare": "bf16 vs fp32 compute, bf16 tier", **compare(fp32, logp["auto"], targets)})
    return rows


def summarize(per_prefix: list[list[dict]]) -> list[dict]:
    """One row per comparison over every scored position of every prefix."""
    rows = []
    for j in range(len(per_prefix[0])):
        kl = torch.cat([p[j]["kl"] for p in per_prefix])
        n = len(per_prefix)
        rows.append({"compare": per_prefix[0][j]["compare"], "positions": int(kl.numel()),
                     "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
                     "top1_agreement": sum(p[j]["top1_agreement"] for p in per_prefix) / n,
                     "delta_nll": sum(p[j]["delta_nll"] for p in per_prefix) / n,
                     "nll_ref": sum(p[j]["nll_ref"] for p in per_prefix) / n})
    return rows


def plot(per_prefix: list[list[dict]], path: Path) -> None:
    """KL per scored position (each prefix, int8 vs bf16 tier) and the target line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, rows in enumerate(per_prefix):
        ax.plot(rows[0]["kl"].clamp_min(1e-9).numpy(), lw=0.8, label=f"prefix {i}")
    ax.axhline(TARGET_MEAN_KL, color="k", ls="--", lw=1, label=f"mean-KL target {TARGET_MEAN_KL:g}")
    ax.set_yscale("log")
    ax.set_xlabel("scored position after the restored prefix")
    ax.set_ylabel("KL(bf16 tier || int8 tier)")
    ax.set_title("SmolLM2-135M: KV restored through hicache's int8 vs bf16 host tier")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from hicache.integrations.vllm.env import model_dir
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=model_dir(), help="HF folder (default: the set-up SmolLM2)")
    p.add_argument("--prefixes", type=int, default=6, help="prefixes restored (default 6)")
    p.add_argument("--prefix", type=int, default=1024, help="tokens per prefix (default 1024)")
    p.add_argument("--score", type=int, default=256, help="tokens scored after each (default 256)")
    p.add_argument("--quick", action="store_true", help="1 prefix of 256 tokens, 64 scored")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                   help="the model's compute dtype (the KV is held in bf16 either way; bfloat16 adds a row: "
                        "bf16 vs fp32 compute on the same KV, the arithmetic's own noise floor)")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--io-backend", default="torch", help="hicache's io backend (CPU: torch/auto/triton)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "host_dtype_accuracy.json")
    args = p.parse_args(argv)
    if args.quick:
        args.prefixes, args.prefix, args.score = 1, 256, 64
    for name in ("prefixes", "prefix", "score", "page_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1")
    if not (args.model / "config.json").exists():
        p.error(f"--model: no model folder at {args.model} (run scripts/setup_vllm.sh)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(args.model))
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=DTYPES[args.dtype]).eval()
    length = args.prefix + args.score + 1
    fp32_model = (None if args.dtype == "float32" else
                  AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32).eval())
    per_prefix = [run_prefix(model, torch.tensor(ids), args, fp32_model)
                  for ids in segments(corpus_text(), tok, args.prefixes, length)]
    rows = summarize(per_prefix)
    ok = rows[0]["mean_kl"] <= TARGET_MEAN_KL and rows[0]["top1_agreement"] >= TARGET_TOP1
    config = {k: str(v) for k, v in vars(args).items()} | {
        "targets": {"mean_kl": TARGET_MEAN_KL, "top1_agreement": TARGET_TOP1}, "meets_targets": ok,
        "seconds": round(time.perf_counter() - t0, 1), "text": "pydoc_data.topics (CPython)"}
    prefix_rows = [{"prefix": i, **{k: v for k, v in r[0].items() if k != "kl"}}
                   for i, r in enumerate(per_prefix)]
    write_json(args.out, rows + prefix_rows, config, torch.device("cpu"))
    plot(per_prefix, args.out.with_suffix(".png"))
    print(format_table(rows, ("compare", "positions", "mean_kl", "max_kl", "top1_agreement", "delta_nll")))
    print(f"targets (int8 vs bf16 tier): mean KL <= {TARGET_MEAN_KL:g}, top-1 >= {TARGET_TOP1}: "
          f"{'met' if ok else 'NOT met'}; {args.out} and {args.out.with_suffix('.png')}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
