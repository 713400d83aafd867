"""Size flags bounded at the edge, errors naming the flag the user gave, a long run's progress
(issue 28, item 2), and ``--hicache-io-backend dma`` without CUDA (item 14)."""
from __future__ import annotations

import io

import pytest
import torch

from hicache.cli import main
from hicache.reference.options import VerifyOptions

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.parametrize("argv, message", [
    # was: a storage namespace message ("namespace.json would be 79,255 B") naming no flag
    (["--layers", "10000"], "--layers: must be in [1, 64], got 10,000"),
    # was: minutes of silence
    (["--decode-tokens", "100000"], "--decode-tokens: must be in [1, 1,024], got 100,000"),
    (["--conversations", "1000000"], "--conversations: must be in [1, 1,024], got 1,000,000"),
    (["--turns", "100000"], "--turns: must be in [1, 64], got 100,000"),
    (["--conversations", "0"], "--conversations: must be in [1, 1,024], got 0"),
    # was: "Overflow when unpacking long long"
    (["--seed", str(10**23)], "--seed: must be in [0, 9,223,372,036,854,775,807], got"),
    # was: a host-memory table naming --hicache-ratio
    (["--device-tokens", str(10**12)], "--device-tokens: must be in [0, 1,048,576], got 1,000,000,000,000"),
    # was: "kv_dtype (--kv-dtype): bfloat16 is for --arch mha", a flag the user did not pass
    (["--hicache-host-dtype", "int8"], "--hicache-host-dtype: int8 quantizes bf16/fp16 KV; the deepseek-v4 toy"),
])
def test_verify_model_sizes_are_bounded_naming_the_flag_given(capsys, argv, message):
    assert main(["verify-model", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    if "--hicache-host-dtype" in argv:
        assert "--kv-dtype" not in err


@pytest.mark.parametrize("argv, message", [
    # was: accepted, the budget split over 1e21 ranks ("host pools do NOT fit")
    (["--hicache-ranks-per-host", str(10**21)], "(--hicache-ranks-per-host): must be at most 65536 ranks"),
    (["--hicache-tp-size", str(10**21)], "(--hicache-tp-size): must be at most 65536 ranks"),
    # was: accepted; a thread's wait of 1e300 s raises OverflowError
    (["--hicache-storage-backend", "file", "--hicache-storage-dir", "/nonexistent", "--hicache-storage-model-id",
      "m", "--hicache-storage-prefetch-timeout", "1e300"], "(--hicache-storage-prefetch-timeout): must be at most"),
])
def test_plan_sizes_are_bounded(capsys, argv, message):
    assert main(["plan", "--model", "llama-3.1-8b", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_replay_sweep_length_is_bounded(capsys):
    ratios = ",".join(["1"] * 65)
    assert main(["replay", "--hicache-ratio", ratios, "--max-requests", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--hicache-ratio: at most 64 ratios (each a whole run of the workload), got 65" in err
    assert err.count("\n") == 1


def test_a_long_verify_run_prints_its_progress_and_eta(monkeypatch):
    """The gate is the run's size (deterministic), the lines' spacing is time: set to 0 here."""
    from hicache.reference import progress
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    out = io.StringIO()
    small = progress.RunProgress(VerifyOptions(), out)
    big = progress.RunProgress(VerifyOptions(decode_tokens=1024), out)
    assert not small.enabled and big.enabled
    for done in (1, 2, 3):
        big(done, 4)
    small(1, 4)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].startswith("hicache verify-model: 1/4 requests, ")
    assert all(line.endswith(" left") and ", about " in line for line in lines)
    assert [progress.duration(s) for s in (3, 65, 7500)] == ["3 s", "1 min 5 s", "2 h 5 min"]


@pytest.mark.skipif(not NO_CUDA, reason="a machine without CUDA")
@pytest.mark.parametrize("argv", [
    ["plan", "--model", "llama-3.1-8b", "--hicache-io-backend", "dma"],
    ["replay", "--hicache-io-backend", "dma", "--max-requests", "1", "--no-progress"],
    ["verify-model", "--arch", "mha", "--hicache-io-backend", "dma"],
])
def test_dma_without_cuda_says_it_needs_cuda(capsys, argv):
    # was: "must be one of ('auto', 'triton', 'copy_engine', 'torch')", dma not among them
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--hicache-io-backend): 'dma' needs CUDA" in err and err.count("\n") == 1


def test_build_refuses_dma_on_a_cpu_device_even_with_cuda_present(monkeypatch):
    from hicache import HiCacheConfig, build
    from hicache.models import preset
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match=r"^io_backend \(--hicache-io-backend\): 'dma' needs CUDA \(the device is "
                                         r"cpu\)"):
        build(preset("llama-3.1-8b", 1), 4096, HiCacheConfig(io_backend="dma"), device="cpu")
