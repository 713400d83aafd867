"""`hicache serve-vllm MODEL` refuses, in one line and before vLLM starts, a model vLLM
could not load (issue 28, item 13): not a path, not in the Hugging Face cache, and offline
(``HF_HUB_OFFLINE``) or the Hub unreachable. Paths, cached ids and the set-up alias pass.
No network: the Hub is a closed port on 127.0.0.1."""
from __future__ import annotations

import socket

import pytest

from hicache.cli import main
from hicache.integrations.vllm.model_source import check_model


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty hub cache, no offline flag, and a Hub endpoint nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    return tmp_path / "hub"


def _cache(root, model_id: str) -> None:
    snap = root / ("models--" + model_id.replace("/", "--")) / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")


@pytest.mark.parametrize("offline", [True, False])
def test_serve_vllm_refuses_an_unknown_model_in_one_line_before_starting_vllm(tmp_path, hub, monkeypatch,
                                                                              capsys, offline):
    started = tmp_path / "vllm-started"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ntouch {started}\n")
    python.chmod(0o755)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["serve-vllm", "not-a-model", "--vllm-python", str(python), "--enable-hierarchical-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("hicache serve-vllm: error: MODEL not-a-model: not a local folder and not in the "
                          f"Hugging Face cache ({hub})")
    assert ("HF_HUB_OFFLINE is set" if offline else "cannot be reached") in err
    assert not started.exists()


def test_paths_cached_ids_and_the_alias_pass(tmp_path, hub, monkeypatch):
    assert check_model(str(tmp_path)) == str(tmp_path)  # a folder
    _cache(hub, "org/cached-model")
    assert check_model("org/cached-model") == "org/cached-model"
    downloads = tmp_path / "downloads"
    _cache(downloads, "org/elsewhere")
    assert check_model("org/elsewhere", ["--download-dir", str(downloads)]) == "org/elsewhere"
    assert check_model("org/elsewhere", [f"--download-dir={downloads}"]) == "org/elsewhere"
    with pytest.raises(ValueError, match="org/elsewhere: not a local folder"):
        check_model("org/elsewhere")
    alias = tmp_path / "smollm2"
    monkeypatch.setenv("HICACHE_MODEL_DIR", str(alias))
    with pytest.raises(ValueError, match=r"smollm2-135m: the set-up model is not at .*make vllm-setup"):
        check_model("smollm2-135m")
    alias.mkdir()
    (alias / ".hicache-model").touch()
    assert check_model("smollm2-135m") == str(alias)


@pytest.mark.parametrize("path", ["/no/such/model", "./no-such-model", "~/no-such-model", "a/b/c"])
def test_a_missing_path_is_named(hub, path):
    with pytest.raises(ValueError, match=f"MODEL {path}: no such file or folder"):
        check_model(path)
