"""`verify-model` with a bf16 kv pool and the int8 host tier: judged as distributions.

The MHA toy's pool is bf16 with ``--hicache-host-dtype int8`` (its default ``--kv-dtype``);
requests restored from host (and storage) must stay within the documented KL and top-1
tolerances, the bf16 pool alone must be near-exact as distributions, the default (fp32,
auto) run stays exact, and the negative control is still caught.
"""
from __future__ import annotations

import json

import pytest
import torch

from hicache.cli import main
from hicache.reference.agreement import Agreement
from hicache.reference.config import MhaConfig, toy_config
from hicache.reference.options import (MAX_KL_TOLERANCE, MEAN_KL_TOLERANCE, TOP1_TOLERANCE, VerifyOptions,
                                       pool_kv_dtype)
from hicache.reference.verify import TOLERANCE, run_verify

SMALL = dict(arch="mha", layers=2, conversations=5, turns=3, decode_tokens=2, hicache_ratio=1.0)


def test_int8_host_restores_within_the_tolerances():
    r = run_verify(VerifyOptions(**SMALL, host_dtype="int8", storage_backend="none"))
    assert r.ok and r.criterion == "distribution" and r.kv_dtype == "bfloat16", r
    assert r.tokens_from["host"] > 0 and r.restored_requests > 0
    assert 0 < r.mean_kl <= MEAN_KL_TOLERANCE and r.max_kl <= MAX_KL_TOLERANCE
    assert r.top1_agreement >= TOP1_TOLERANCE


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_int8_host_and_storage_restore_within_the_tolerances(tmp_path, policy):
    kw = {**SMALL, "conversations": 6 if policy == "write_back" else 5, "seed": int(policy == "write_back")}
    r = run_verify(VerifyOptions(**kw, host_dtype="int8", write_policy=policy, storage_dir=str(tmp_path)))
    assert r.ok and r.tokens_from["host"] > 0 and r.tokens_from["storage"] > 0, r
    assert 0 < r.mean_kl <= MEAN_KL_TOLERANCE and r.top1_agreement >= TOP1_TOLERANCE


def test_int8_quantizes_what_the_bf16_host_keeps_exact():
    # same bf16 pool, byte-exact host: restored requests are the recompute's up to rounding
    exact = run_verify(VerifyOptions(**SMALL, kv_dtype="bfloat16", storage_backend="none"))
    int8 = run_verify(VerifyOptions(**SMALL, host_dtype="int8", storage_backend="none"))
    assert exact.ok and exact.criterion == "distribution" and exact.restored_requests > 0
    assert exact.mean_kl < 1e-8 and exact.top1_agreement == 1.0
    assert int8.mean_kl > 10 * exact.mean_kl  # the int8 rows really came back quantized


def test_int8_a_corrupted_pool_is_caught():
    r = run_verify(VerifyOptions(**SMALL, host_dtype="int8", storage_backend="none", fault="kv"))
    assert r.fault_rows > 0 and not r.ok and r.mismatched_requests > 0
    assert r.max_kl > MAX_KL_TOLERANCE


def test_the_default_run_stays_exact_and_reports_kl(tmp_path):
    r = run_verify(VerifyOptions(**SMALL, storage_dir=str(tmp_path)))
    assert r.ok and r.criterion == "exact" and r.kv_dtype == "float32" and r.host_dtype == "auto"
    assert r.max_abs_logit_diff <= TOLERANCE and r.greedy_identical == r.greedy_total
    assert r.restored_requests > 0 and r.mean_kl < 1e-10 and r.top1_agreement == 1.0


def test_json_carries_the_kl_fields(capsys):
    argv = ["verify-model", "--arch", "mha", "--layers", "2", "--conversations", "5", "--turns", "3",
            "--decode-tokens", "2", "--hicache-ratio", "1", "--hicache-storage-backend", "none",
            "--hicache-host-dtype", "int8", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["criterion"] == "distribution" and out["ok"] is True
    assert {"mean_kl", "max_kl", "top1_agreement", "restored_requests"} <= set(out)


@pytest.mark.parametrize("argv, message", [
    (["--arch", "mha", "--hicache-host-dtype", "int8", "--kv-dtype", "float32"],
     "--kv-dtype: the int8 host tier quantizes bf16/fp16 KV; use bfloat16"),
    (["--kv-dtype", "bfloat16"], "--kv-dtype): bfloat16 is for --arch mha"),
    (["--arch", "mha", "--hicache-host-dtype", "fp8"], "argument --hicache-host-dtype: invalid choice"),
    (["--arch", "mha", "--kv-dtype", "fp16"], "argument --kv-dtype: invalid choice"),
])
def test_a_bad_combination_is_one_line_and_exit_2(capsys, argv, message):
    assert main(["verify-model", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_kv_dtype_defaults_follow_the_host_dtype():
    assert pool_kv_dtype(VerifyOptions(arch="mha")) == "float32"
    assert pool_kv_dtype(VerifyOptions(arch="mha", host_dtype="int8")) == "bfloat16"
    with pytest.raises(ValueError, match="--hicache-host-dtype: must be one of auto, int8"):
        pool_kv_dtype(VerifyOptions(arch="mha", host_dtype="int4"))


def test_a_bf16_pool_is_its_own_model_identity():
    fp32, bf16 = toy_config("mha", 2, 0), toy_config("mha", 2, 0, kv_dtype="bfloat16")
    assert fp32.identity != bf16.identity and bf16.identity.endswith("-bfloat16")
    assert bf16.stack().anchor.buffers[0].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="MhaConfig.kv_dtype"):
        MhaConfig(kv_dtype=torch.float16)


def test_agreement_of_equal_and_of_different_logits(gen):
    logits = torch.randn(8, 32, generator=gen)
    a = Agreement()
    assert a.add(logits, logits.clone(), restored=True) == 0.0
    assert a.mean_kl == 0.0 and a.top1_agreement == 1.0 and a.within_tolerance()
    worse = logits.clone()
    worse[:, 0] += 100.0  # every position's argmax moved to token 0
    assert a.add(logits, worse, restored=False) > MAX_KL_TOLERANCE  # counted in the max, not the mean
    assert a.restored_requests == 1 and a.top1_agreement == 1.0 and not a.within_tolerance()


def test_no_restored_request_reports_none():
    a = Agreement()
    assert a.as_json() == {"mean_kl": None, "max_kl": None, "top1_agreement": None, "restored_requests": 0}
    assert a.within_tolerance()
