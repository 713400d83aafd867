"""`hicache replay` with the storage tier: storage columns, a second replay starts warm
(another process, every hit byte-checked), and storage mistakes are one line naming the flag."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hicache.cli import main
from hicache.replay import JSON_KEYS
from tests.hicache.test_cli import assert_one_line_error

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--max-requests", "60", "--device-tokens", "8192", "--hicache-ratio", "4", "--no-progress"]


def replay_in_child(*argv: str) -> list[dict]:
    run = subprocess.run([sys.executable, "-m", "hicache.cli", "replay", "--json", *SMALL, *argv],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)["runs"]


def test_second_replay_starts_warm_from_the_first_ones_pages(tmp_path, capsys):
    store = ["--hicache-storage-backend", "file", "--hicache-storage-dir", str(tmp_path / "store")]
    # 1. the first replay (this process) starts cold: storage hits only for pages it wrote itself
    assert main(["replay", "--json", *SMALL, *store]) == 0
    base, first = json.loads(capsys.readouterr().out)["runs"]
    assert all(tuple(r) == JSON_KEYS for r in (base, first))
    assert base["bytes_storage_written"] == base["storage_hit_rate"] == 0  # no host tier: no storage
    assert first["bytes_storage_written"] > 0 and first["mismatches"] == 0
    # 2. a second process on the same store starts warm; every storage hit was byte-checked
    _, second = replay_in_child(*store)
    assert second["mismatches"] == 0
    assert second["storage_hit_rate"] > first["storage_hit_rate"] + 0.2
    assert second["bytes_storage_read"] > first["bytes_storage_read"]
    assert second["hit_rate"] > first["hit_rate"]
    assert second["bytes_storage_written"] < first["bytes_storage_written"]  # stored pages are not re-sent
    for r in (first, second):
        total = r["device_hit_rate"] + r["host_hit_rate"] + r["storage_hit_rate"]
        assert r["hit_rate"] == pytest.approx(total)
        assert r["tokens_recomputed"] == round(r["tokens_total"] * (1 - r["hit_rate"]))


def test_table_has_the_storage_columns(tmp_path, capsys):
    assert main(["replay", *SMALL, "--max-requests", "10", "--hicache-storage-backend", "file",
                 "--hicache-storage-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert " storage " in out.splitlines()[1]
    assert f"storage tier: file at {tmp_path}, write_through, prefetch timeout" in out
    assert "GB read  GB written  read GB/s  write GB/s" in out


def test_file_store_in_the_default_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["replay", *SMALL, "--max-requests", "5", "--hicache-storage-backend", "file"]) == 0
    assert f"file at {tmp_path / 'hicache' / 'storage'}" in capsys.readouterr().out
    assert any((tmp_path / "hicache" / "storage").iterdir())


@pytest.mark.parametrize("argv, flag", [
    (["--hicache-storage-backend", "tape"], "--hicache-storage-backend"),
    (["--hicache-storage-prefetch-policy", "eventually"], "--hicache-storage-prefetch-policy"),
    (["--hicache-storage-prefetch-timeout", "0"], "--hicache-storage-prefetch-timeout"),
    (["--hicache-storage-write-policy", "never"], "--hicache-storage-write-policy"),
    (["--hicache-storage-capacity", "-1"], "--hicache-storage-capacity"),
    (["--hicache-storage-backend", "mooncake", "--hicache-storage-master", "nohost"], "--hicache-storage-master"),
])
def test_storage_mistakes_are_one_line_naming_the_flag(tmp_path, capsys, argv, flag):
    code = main(["replay", "--no-progress", "--max-requests", "2", "--hicache-storage-dir", str(tmp_path), *argv])
    assert_one_line_error(capsys, code, flag)


def test_unusable_store_is_one_line_or_with_the_flag_a_replay_without_it(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store = ["--hicache-storage-backend", "file", "--hicache-storage-dir", str(blocker / "store")]
    line = assert_one_line_error(capsys, main(["replay", *SMALL, *store]), "--hicache-storage-dir")
    assert "--hicache-storage-optional" in line
    assert main(["replay", "--json", *SMALL, "--max-requests", "5", *store, "--hicache-storage-optional"]) == 0
    out = capsys.readouterr()
    runs = json.loads(out.out)["runs"]
    assert runs[1]["bytes_storage_written"] == 0 and "running without the storage tier" in out.err
