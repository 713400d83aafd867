"""`bench/host_dtype_accuracy.py` and `bench/kv_tier.py`: a model's KV through hicache's host
tier gives back exactly the format's bytes (bf16: itself; int8: quant_ref's round trip), the
scoring pieces on a tiny random Llama, and the quick mode on the set-up SmolLM2."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from bench import host_dtype_accuracy as acc
from bench.kv_tier import reference_round_trip, same_bytes, tier_round_trip
from hicache.integrations.vllm.env import model_dir
from tests.set_up import require


def random_kv(gen, layers=2, tokens=45, heads=3, dim=64, dtype=torch.bfloat16):
    return [tuple((torch.randn(tokens, heads, dim, generator=gen) * 3).to(dtype) for _ in "kv")
            for _ in range(layers)]


@pytest.mark.parametrize("backend", ["torch", "copy_engine", "triton"])
@pytest.mark.parametrize("host_dtype", ["auto", "int8"])
def test_the_tier_gives_back_the_formats_bytes(gen, backend, host_dtype):
    kv = random_kv(gen)  # 45 tokens: the last page of 16 is partly padding
    before = [tuple(t.clone() for t in pair) for pair in kv]
    out = tier_round_trip(kv, host_dtype, page_size=16, backend=backend)
    assert same_bytes(out, reference_round_trip(kv, host_dtype))
    assert same_bytes(kv, before)  # the source is not touched
    assert same_bytes(out, kv) == (host_dtype == "auto")


def test_fp16_kv_round_trips_through_int8(gen):
    kv = random_kv(gen, layers=1, tokens=16, dtype=torch.float16)
    assert same_bytes(tier_round_trip(kv, "int8", page_size=16), reference_round_trip(kv, "int8"))


@pytest.mark.parametrize("kv, match", [
    ([], "kv: needs at least one layer"),
    ([(torch.zeros(4, 2, 8), torch.zeros(4, 2, 8))], r"kv: layers must be \[T, H, D\] bf16/fp16"),
    ([(torch.zeros(4, 2, 8, dtype=torch.bfloat16), torch.zeros(4, 2, 4, dtype=torch.bfloat16))],
     r"kv\[0\]: k and v must both be"),
])
def test_a_malformed_kv_is_refused(kv, match):
    with pytest.raises(ValueError, match=match):
        tier_round_trip(kv)


def test_an_unknown_host_dtype_is_refused(gen):
    with pytest.raises(ValueError, match="host_dtype"):
        reference_round_trip(random_kv(gen, layers=1), "int4")


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_restored_prefixes_are_scored_on_a_tiny_model():
    model = tiny_llama()
    args = argparse.Namespace(prefix=40, score=12, page_size=16, io_backend="torch")
    tokens = torch.randint(0, 128, (args.prefix + args.score + 1,), generator=torch.Generator().manual_seed(1))
    rows = acc.run_prefix(model, tokens, args)
    assert [r["compare"] for r in rows] == ["int8 tier vs bf16 tier", "bf16 tier vs unrounded KV"]
    int8 = rows[0]
    assert int8["kl"].shape == (args.score,) and 0 < int8["mean_kl"] < 1e-2
    summary = acc.summarize([rows, rows])
    assert summary[0]["positions"] == 2 * args.score and summary[0]["mean_kl"] == pytest.approx(int8["mean_kl"])


def test_bf16_compute_adds_its_noise_floor_row():
    model = tiny_llama()
    args = argparse.Namespace(prefix=16, score=8, page_size=16, io_backend="torch")
    tokens = torch.randint(0, 128, (25,), generator=torch.Generator().manual_seed(3))
    rows = acc.run_prefix(model.to(torch.bfloat16), tokens, args, fp32_model=tiny_llama())
    assert rows[-1]["compare"] == "bf16 vs fp32 compute, bf16 tier" and rows[-1]["mean_kl"] > 0


def test_compare_of_equal_log_probabilities_is_zero():
    logp = torch.log_softmax(torch.randn(5, 11, generator=torch.Generator().manual_seed(2)), -1)
    c = acc.compare(logp, logp.clone(), torch.arange(5))
    assert c["mean_kl"] == 0.0 and c["top1_agreement"] == 1.0 and c["delta_nll"] == 0.0


def test_segments_are_spread_over_the_corpus():
    def chars(text):  # a tokenizer of one token per character
        return {"input_ids": [ord(c) for c in text]}
    text = "".join(chr(65 + i % 26) for i in range(1000))
    parts = acc.segments(text, chars, 3, 10)
    assert [p[0] for p in parts] == [65, 65 + 460 % 26, 65 + 920 % 26] and all(len(p) == 10 for p in parts)
    with pytest.raises(ValueError, match="too short"):
        acc.segments(text, chars, 8, 100)
    assert len(acc.corpus_text()) > 100_000  # the shipped text holds the default 6 x 1281 tokens


def test_quick_mode_on_smollm2(tmp_path):
    require(None if (model_dir() / "config.json").exists() else f"no model at {model_dir()}",
            "SmolLM2", "scripts/setup_vllm.sh")
    out = tmp_path / "acc.json"
    assert acc.main(["--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["meets_targets"] is True and out.with_suffix(".png").exists()
    assert doc["rows"][0]["compare"] == "int8 tier vs bf16 tier" and doc["rows"][0]["positions"] == 64
