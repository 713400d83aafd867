"""DeepSeek-V4's ``fp8_ds_mla`` rows in the reference model (issue 22, item 3).

The layout rules reproduce the real model's row bytes (DESIGN §4); writes and reads are
checked byte for byte on random rows; the fp8 model equals the fp32 model run on the
dequantized cache values, and transformers' model whose cache is quantized the same way;
`verify-model` with fp8 rows is exact through host and storage, and faults of the values or
of the scales alone are caught.
"""
from __future__ import annotations

import functools
import json

import pytest
import torch

from hicache.cli import main
from hicache.models.deepseek_v4 import C4_INDEXER_ROW_BYTES, C4_KV_ROW_BYTES, C128_KV_ROW_BYTES, SWA_ROW_BYTES
from hicache.reference import fp8_ds_mla, oracle, verify
from hicache.reference.config import Dsv4Config, toy_config
from hicache.reference.dsv4 import Dsv4Model
from hicache.reference.fp8_ds_mla import Fp8Rows, ceil_log2, kv_layout, layouts
from hicache.reference.options import TOLERANCE, VerifyOptions
from hicache.reference.serve import Fault
from tests.hicache.reference.test_oracle import MODES, paged_logits, token_ids
from tests.set_up import require

FP8 = Dsv4Config(kv_format="fp8_ds_mla")
SMALL = dict(arch="deepseek-v4", decode_tokens=2, conversations=5, turns=3, hicache_ratio=1.0, seed=0,
             kv_format="fp8_ds_mla")


def test_the_rules_give_the_real_models_row_bytes():
    lay = fp8_ds_mla.real_layouts()
    assert {n: (l.value_bytes + l.scale_bytes) for n, l in lay.items()} == {
        "swa": 584, "c4_kv": 584, "c128_kv": 584, "c4_indexer": 132}
    assert {n: l.row_bytes for n, l in lay.items()} == {
        "swa": SWA_ROW_BYTES, "c4_kv": C4_KV_ROW_BYTES, "c128_kv": C128_KV_ROW_BYTES,
        "c4_indexer": C4_INDEXER_ROW_BYTES}


def test_the_toy_stack_has_byte_rows_and_fp32_state():
    pools = {p.name: p.buffers[0] for p in FP8.stack().data_pools()}
    assert {n: (b.row_shape, b.dtype) for n, b in pools.items() if b.dtype == torch.uint8} == {
        "swa": ((1440,), torch.uint8), "c4_kv": ((720,), torch.uint8), "c128_kv": ((240,), torch.uint8),
        "c4_indexer": ((288,), torch.uint8)}
    assert pools["c4_state"].dtype == pools["c4_indexer_state"].dtype == torch.float32
    assert FP8.identity == Dsv4Config().identity + "-fp8_ds_mla-t16"  # its own storage namespace
    with pytest.raises(ValueError, match=r"kv_format \(--kv-format\): must be one of fp32, fp8_ds_mla"):
        Dsv4Config(kv_format="fp8")
    with pytest.raises(ValueError, match="the mha model takes fp32 only"):
        toy_config("mha", 2, 0, "fp8_ds_mla")
    with pytest.raises(ValueError, match="fp8_tile: must divide the NoPE channels"):
        Dsv4Config(kv_format="fp8_ds_mla", fp8_tile=20)


def test_scale_exponents_are_exact_at_powers_of_two():
    v = torch.tensor([1.0, 0.5, 1.0000001, 0.99999994, 3.0, 2.0 ** -20])
    assert ceil_log2(v).tolist() == [0, -1, 1, 0, 2, -20]


def test_writes_land_byte_exact_and_touch_nothing_else():
    codec = Fp8Rows(kv_layout(48, 16, 16, 8))
    lay, gen = codec.layout, torch.Generator().manual_seed(0)
    t = torch.randint(0, 256, (3, lay.row_bytes), dtype=torch.uint8, generator=gen)
    before = t.clone()
    x = torch.randn((2, 64), generator=gen) * torch.tensor([[0.01], [30.0]])
    rows, slots = torch.tensor([1, 2]), torch.tensor([7, 0])
    codec.write(t, rows, slots, x)
    for i, (r, s) in enumerate(zip(rows.tolist(), slots.tolist())):
        exps = ceil_log2(x[i, :48].view(3, 16).abs().amax(-1) / 448)
        fp8 = (x[i, :48].view(3, 16) * 2.0 ** -exps[:, None].float()).to(torch.float8_e4m3fn)
        want = torch.cat([fp8.view(torch.uint8).flatten(), x[i, 48:].to(torch.bfloat16).view(torch.uint8)])
        assert torch.equal(t[r, s * 80:(s + 1) * 80], want)
        scales = t[r, 640 + s * 8:640 + (s + 1) * 8]
        assert scales.tolist() == [e + 127 for e in exps.tolist()] + [0] * 5
        t[r, s * 80:(s + 1) * 80], t[r, 640 + s * 8:640 + (s + 1) * 8] = before[r, s * 80:(s + 1) * 80], \
            before[r, 640 + s * 8:640 + (s + 1) * 8]
    assert torch.equal(t, before)  # nothing else changed: other entries, other rows, padding
    codec.write(t, rows, slots, x)
    assert torch.equal(codec.read(t, rows, slots), codec.round_trip(x))
    assert (codec.round_trip(x) - x).abs().max() <= x.abs().max() / 16  # e4m3: 3 mantissa bits


@pytest.mark.parametrize("pool", ["c4_kv", "c4_indexer"])
@pytest.mark.parametrize("parts", [("values",), ("scales",)])
def test_corrupt_changes_exactly_the_part_it_names(pool, parts):
    codec = Fp8Rows(layouts(FP8)[pool])
    lay, gen = codec.layout, torch.Generator().manual_seed(1)
    t = torch.zeros((2, lay.row_bytes), dtype=torch.uint8)
    slots = torch.arange(lay.entries).repeat(2)
    codec.write(t, torch.arange(2).repeat_interleave(lay.entries), slots,
                torch.randn((slots.numel(), lay.dim), generator=gen))
    out = codec.corrupt(t, gen, parts)
    values_end, scales_end = lay.entries * lay.value_bytes, lay.entries * (lay.value_bytes + lay.scale_bytes)
    changed = (out != t)
    assert not changed[:, scales_end:].any()  # padding
    scales = changed[:, values_end:scales_end].view(2, lay.entries, lay.scale_bytes)
    if parts == ("scales",):
        assert not changed[:, :values_end].any()
        per_entry = scales.any(-1) if lay.scale_bytes_each == 4 else scales[..., :lay.tiles]
        assert per_entry.all()  # every scale of every entry moved
    else:
        assert not scales.any() and changed[:, :values_end].float().mean() > 0.5
    with pytest.raises(ValueError, match="parts: must be a non-empty subset"):
        codec.corrupt(t, gen, ("padding",))


class FakeQuant:
    """fp32 typed rows holding dequantize(quantize(x)): the fp32 model on the fp8 values."""

    def __init__(self, codec: Fp8Rows) -> None:
        self.codec = codec

    def entries(self, t):
        return t.shape[1]

    def read(self, t, rows, slots):
        return t[rows, slots]

    def write(self, t, rows, slots, values):
        t[rows, slots] = self.codec.round_trip(values)

    def round_trip(self, values):
        return self.codec.round_trip(values)


def test_the_fp8_model_is_the_fp32_model_on_the_dequantized_cache():
    ids = token_ids(FP8)
    fp8 = paged_logits(Dsv4Model(FP8), FP8, ids, MODES["chunks"])
    model = Dsv4Model(Dsv4Config(), dtype=torch.float64)
    plain = paged_logits(model, Dsv4Config(), ids, MODES["chunks"])
    model.codecs = {name: FakeQuant(c) for name, c in fp8_ds_mla.codecs(FP8).items()}
    assert torch.equal(paged_logits(model, Dsv4Config(), ids, MODES["chunks"]), fp8)
    assert (plain - fp8).abs().max() > 0.1  # the quantization really is in the loop
    # and a token's bytes do not depend on the chunking (float64 math)
    assert (paged_logits(Dsv4Model(FP8), FP8, ids, MODES["decode"]) - fp8).abs().max() < 1e-12


def _quantizing_cache(hf):
    """transformers' cache for ``hf`` whose window K=V and compressed entries are stored (and
    returned) as dequantize(quantize(x)), in the toy's layouts."""
    from transformers import DynamicCache
    lay = layouts(FP8)
    kv, ix = Fp8Rows(lay["swa"]), Fp8Rows(lay["c4_indexer"])

    def fq(codec, x):
        return codec.round_trip(x.reshape(-1, x.shape[-1])).to(x.dtype).reshape(x.shape)

    cache = DynamicCache(config=hf.config)
    for layer in cache.layers:
        layer.update = functools.partial(lambda up, k, v, *a, **kw: up(fq(kv, k), fq(kv, v), *a, **kw), layer.update)
        if hasattr(layer, "update_compressor_states"):
            layer.update_compressor_states = functools.partial(
                lambda up, name, c: up(name, fq(kv if name == "compressor" else ix, c)), layer.update_compressor_states)
    return cache


def test_the_fp8_model_matches_transformers_with_a_quantizing_cache():
    # transformers has no fp8 cache (5.23: fp8 only for weights): its cache layers are
    # wrapped to quantize what they store. It computes in fp32, the fp8 toy in float64: a
    # last-bit difference now and then crosses an fp8 / bf16 rounding step, hence 1e-3, four
    # hundred times below the fp8 model's distance from the unquantized one.
    require(oracle.missing(), "DeepSeek-V4 oracle", "scripts/setup.sh installs it")
    hf, ids = oracle.oracle_model(Dsv4Config()), token_ids(FP8)
    cache, out, start = _quantizing_cache(hf), [], 0
    with torch.no_grad():
        for n in MODES["chunks"]:
            out.append(hf(input_ids=ids[start:start + n].view(1, -1), past_key_values=cache,
                          use_cache=True).logits[0])
            start += n
    theirs = torch.cat(out).double()
    ours = paged_logits(Dsv4Model(FP8), FP8, ids, MODES["chunks"])
    assert (ours - theirs).abs().max() <= 1e-3
    assert (oracle.oracle_logits(hf, ids).double() - ours).abs().max() > 0.4


def test_verify_model_is_exact_through_host_and_storage(tmp_path):
    r = verify.run_verify(VerifyOptions(**SMALL, layers=3, storage_dir=str(tmp_path)))
    assert r.ok and r.max_abs_logit_diff < 1e-12 and r.greedy_identical == r.greedy_total == 30, r
    assert r.tokens_from["host"] > 0 and r.tokens_from["storage"] > 0


@pytest.mark.parametrize("pool", ["c4_kv", "c4_indexer"])
@pytest.mark.parametrize("parts", [("values", "scales"), ("scales",)])
def test_a_fault_of_the_values_or_of_the_scales_alone_is_caught(tmp_path, monkeypatch, pool, parts):
    monkeypatch.setattr(verify, "Fault", functools.partial(Fault, parts=parts))
    r = verify.run_verify(VerifyOptions(**SMALL, layers=2, fault=pool, storage_dir=str(tmp_path)))
    assert r.fault_rows > 0 and not r.ok and r.mismatched_requests > 0
    assert r.max_abs_logit_diff > 100 * TOLERANCE


def test_the_cli_flag(capsys, tmp_path):
    argv = ["verify-model", "--kv-format", "fp8_ds_mla", "--layers", "2", "--conversations", "5", "--turns", "3",
            "--decode-tokens", "2", "--hicache-ratio", "1", "--hicache-storage-dir", str(tmp_path), "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["model"].endswith("-fp8_ds_mla-t16")
    assert main(["verify-model", "--arch", "mha", "--kv-format", "fp8_ds_mla"]) == 2
    assert "the mha model takes fp32 only" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("io_backend", ["triton", "copy_engine"])
def test_on_cuda(tmp_path, io_backend):
    r = verify.run_verify(VerifyOptions(**SMALL, layers=3, device="cuda", io_backend=io_backend,
                                        storage_dir=str(tmp_path)))
    assert r.ok and r.max_abs_logit_diff < 1e-12, r
    r = verify.run_verify(VerifyOptions(**SMALL, layers=2, device="cuda", io_backend=io_backend, fault="c4_kv",
                                        storage_dir=str(tmp_path / "fault")))
    assert r.fault_rows > 0 and not r.ok
