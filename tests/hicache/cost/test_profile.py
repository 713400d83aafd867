"""Device profiles: the shipped ones, their sources, a round trip, and bad files named in one line."""
from __future__ import annotations

import json

import pytest

from hicache.cost import PROFILE_NAMES, load_profile, profile_dict, profile_from_dict, save_profile
from hicache.cost.profile import MAX_PROFILE_BYTES


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_shipped_profiles_load_round_trip_and_say_where_each_figure_comes_from(name, tmp_path):
    p = load_profile(name)
    assert p.name == name and p.h2d.gbps > 0 and p.prefill.bf16_tflops > 0
    assert all(s.source for s in (p.h2d, p.d2h, p.prefill, *p.storage.values()))
    assert set(p.storage) >= {"file", "mooncake"}
    assert load_profile(save_profile(p, tmp_path / "copy.json")) == p
    assert profile_from_dict(json.loads(json.dumps(profile_dict(p)))) == p


def test_h100_is_measured_the_others_are_marked_unmeasured():
    h100 = load_profile("h100")
    assert h100.measured and "h100_measured.md" in h100.h2d.source and "53.6" in h100.h2d.source
    assert not h100.prefill.measured  # GEMM rates were never measured here: said so
    for name in ("h200", "b200"):
        p = load_profile(name)
        assert not p.measured and not p.prefill.measured and "unmeasured" in p.h2d.source


def _write(tmp_path, doc) -> str:
    path = tmp_path / "p.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def _h100() -> dict:
    return profile_dict(load_profile("h100"))


@pytest.mark.parametrize("edit,words", [
    (lambda d: d["h2d"].update(gbps=0), "h2d.gbps: must be > 0"),
    (lambda d: d["h2d"].update(enqueue_s=-1.0), "h2d.enqueue_s: must be >= 0"),
    (lambda d: d["prefill"].update(fp8_tflops="fast"), "prefill.fp8_tflops: must be a number"),
    (lambda d: d["storage"]["file"].update(read_gbps=float("nan")), "storage.file.read_gbps"),
    (lambda d: d["h2d"].update(speed=1), "unknown key 'speed'"),
    (lambda d: d["d2h"].pop("gbps"), "missing key 'gbps'"),
    (lambda d: d.pop("prefill"), "missing key 'prefill'"),
    (lambda d: d.update(version=2), "not a device profile"),
    (lambda d: d.update(measured="yes"), "measured must be true or false"),
])
def test_a_bad_profile_is_one_value_error_naming_the_flag_and_key(tmp_path, edit, words):
    doc = _h100()
    edit(doc)
    with pytest.raises(ValueError) as info:
        load_profile(_write(tmp_path, doc))
    assert words in str(info.value) and str(info.value).startswith("--device-profile ")


@pytest.mark.parametrize("text,words", [("{", "not valid JSON"), ("x" * (MAX_PROFILE_BYTES + 1), "more than"),
                                        ("[" * 100 + "]" * 100, "nested deeper than")])
def test_not_json_or_too_large_is_refused(tmp_path, text, words):
    with pytest.raises(ValueError, match=words) as info:
        load_profile(_write(tmp_path, text))
    assert str(info.value).startswith("--device-profile ") and "\n" not in str(info.value)


def test_an_unknown_name_lists_the_shipped_ones():
    with pytest.raises(ValueError, match="not a shipped profile \\(h100, h200, b200\\)"):
        load_profile("h300", "--hicache-device-profile")


def test_a_storage_backend_the_profile_lacks_is_named():
    with pytest.raises(ValueError, match="no storage figures for backend 'redis'; it has file, mooncake"):
        load_profile("h100").store("redis")
