"""`hicache verify-model`: the JSON contract, the human report, exit statuses, one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hicache

from hicache.cli import main
from hicache.reference.cli import JSON_KEYS

SMALL = ["--layers", "2", "--conversations", "5", "--turns", "3", "--decode-tokens", "2", "--hicache-ratio", "1"]


def test_json_has_the_contract_keys_and_exit_0(capsys, tmp_path):
    assert main(["verify-model", "--arch", "mha", *SMALL, "--hicache-storage-dir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(JSON_KEYS) <= set(out)
    assert set(out["tokens_from"]) == {"device", "host", "storage", "computed"}
    assert out["ok"] is True and out["greedy_identical"] == out["greedy_total"] == 2 * out["requests"] == 30
    assert out["tokens_from"]["host"] > 0 and out["tokens_from"]["storage"] > 0
    assert out["max_abs_logit_diff"] <= out["tolerance"]


def test_human_report_and_a_caught_fault_exit_1(capsys):
    assert main(["verify-model", "--arch", "mha", *SMALL, "--fault", "kv"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH in" in out and "rows of kv corrupted on loads" in out and "prompt tokens from device" in out


@pytest.mark.parametrize("argv, message", [
    (["--fault", "kv"], "--fault: 'kv' is not a pool of the deepseek-v4 model; allowed: swa, c4_kv, c4_indexer, "
                        "c128_kv, c4_state, c4_indexer_state"),
    (["--arch", "mha", "--fault", "swa"], "--fault: 'swa' is not a pool of the mha model; allowed: kv"),
    (["--arch", "gpt"], "--arch): must be one of deepseek-v4, mha, qwen3.5, nemotron-h"),
    (["--arch", "qwen3.5", "--fault", "kv"], "--fault: 'kv' is not a pool of the qwen3.5 model; allowed: attn_kv, "
                                             "conv, recurrent, wrong-boundary"),
    (["--arch", "nemotron-h", "--hicache-state-interval", "48"], "--hicache-state-interval: must be a multiple of "
                                                                 "the page (32 tokens)"),
    (["--arch", "qwen3.5", "--kv-format", "fp8_ds_mla"], "the qwen3.5 toy's pools are float64"),
    (["--hicache-io-backend", "cuda"], "argument --hicache-io-backend/--io-backend: invalid choice"),
    (["--hicache-write-policy", "never"], "argument --hicache-write-policy: invalid choice"),
    (["--hicache-eviction-policy", "fifo"], "argument --hicache-eviction-policy: invalid choice"),
    (["--hicache-storage-backend", "mooncake"], "argument --hicache-storage-backend: invalid choice"),
    (["--device-tokens", "100"], "--device-tokens: the longest request of 4 turns may take 288 tokens"),
    (["--hicache-ratio", "0"], "--hicache-ratio): must be > 0"),
    (["--arch", "mha", *SMALL, "--hicache-storage-dir", "/proc/no/such/dir"], "cannot use --hicache-storage-dir"),
])
def test_a_user_mistake_is_one_line_and_exit_2(capsys, argv, message):
    assert main(["verify-model", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_the_subcommand_module_imports_no_torch():
    # hicache/__init__.py is bypassed (a bare package): only the modules the registration
    # in hicache/cli/command.py pulls in are imported
    root = Path(hicache.__file__).parent
    code = ("import sys, types; pkg = types.ModuleType('hicache'); pkg.__path__ = [%r]; "
            "sys.modules['hicache'] = pkg; import hicache.reference.cli; "
            "sys.exit(int('torch' in sys.modules))" % str(root))
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---------------------------------------------------------------- issue 23 items 6 and 12

DEVICE_ONLY = ["--arch", "mha", *SMALL, "--device-tokens", "65536", "--hicache-storage-backend", "none"]


def test_a_run_that_restored_nothing_exits_1_with_a_line_saying_so(capsys):
    # was: exit 0 ("OK") with host 0 and storage 0: no restore had been checked
    assert main(["verify-model", *DEVICE_ONLY]) == 1
    out = capsys.readouterr()
    assert "host 0, storage 0" in out.out and "NOTHING RESTORED" in out.out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "NOTHING RESTORED" in lines[0] and "--allow-device-only" in lines[0]


def test_allow_device_only_accepts_it_and_json_says_so(capsys):
    assert main(["verify-model", *DEVICE_ONLY, "--allow-device-only", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["nothing_restored"] is False
    assert out["tokens_from"]["host"] == out["tokens_from"]["storage"] == 0
    assert main(["verify-model", *DEVICE_ONLY, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["nothing_restored"] is True


@pytest.mark.parametrize("long, short", [("--hicache-io-backend", "--io-backend")])
def test_verify_model_spells_transfer_flags_like_plan_and_replay(long, short):
    # was: only --io-backend; replay and the server flags say --hicache-io-backend
    from hicache.cli import build_parser
    parser = build_parser("verify-model")
    for flag in (long, short):
        assert parser.parse_args(["verify-model", flag, "torch"]).io_backend == "torch"
    for flag in ("--hicache-io-backend", "--hicache-mem-layout", "--hicache-write-policy"):
        for command in ("plan", "replay", "verify-model"):
            assert flag in build_parser(command)._subparsers._group_actions[0].choices[command].format_help()


def test_an_unknown_flag_points_at_the_subcommands_help(capsys):
    # was: "(see hicache --help)", which lists no verify-model flag
    assert main(["verify-model", "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--no-such-flag" in err and "see hicache verify-model --help" in err
