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
    (["--arch", "gpt"], "--arch): must be one of deepseek-v4, mha"),
    (["--io-backend", "dma"], "argument --io-backend: invalid choice"),
    (["--hicache-write-policy", "never"], "argument --hicache-write-policy: invalid choice"),
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
    # in hicache/cli.py pulls in are imported
    root = Path(hicache.__file__).parent
    code = ("import sys, types; pkg = types.ModuleType('hicache'); pkg.__path__ = [%r]; "
            "sys.modules['hicache'] = pkg; import hicache.reference.cli; "
            "sys.exit(int('torch' in sys.modules))" % str(root))
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
