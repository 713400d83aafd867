"""``bench/device_profile.py``: the fit of measured transfers and a profile file updated in place
(no measurement here: the GPU check and the benches run those)."""
from __future__ import annotations

import pytest
import torch

from bench import device_profile
from hicache.cost import Link, Store, load_profile


def test_fit_recovers_rate_and_fixed_cost():
    samples = [(n, 0.001 + n / 20e9) for n in (1e6, 8e6, 64e6)]
    gbps, fixed = device_profile.fit(samples)
    assert gbps == pytest.approx(20.0) and fixed == pytest.approx(0.001)
    with pytest.raises(ValueError, match="two sizes"):
        device_profile.fit([(1e6, 0.1), (1e6, 0.2)])


def test_a_profile_is_written_then_updated_keeping_what_it_did_not_measure(tmp_path):
    path, cpu = tmp_path / "p.json", torch.device("cpu")
    link = Link(3.0, 0.001, 0.0, measured=True, source="measured here")
    device_profile.update(path, "h100", cpu, h2d=link)
    first = load_profile(path)
    assert first.h2d == link and first.measured and first.name == "measured-cpu"
    assert first.d2h.source.startswith("not measured here: from the h100 profile")
    store = Store(2.0, 1.0, 0.001, 0.002, measured=True, source="bench")
    device_profile.update(path, "h100", cpu, storage={"file": store})
    second = load_profile(path)
    assert second.h2d == link and second.storage["file"].read_gbps == 2.0  # the links kept, the store added
    assert second.storage["mooncake"] == first.storage["mooncake"]


def test_a_store_whose_times_do_not_grow_is_left_out_of_the_profile(capsys):
    from bench import storage
    rows = [{"backend": "file", "op": op, "KB": kb, "batch_pages": 2, "p50_ms": ms}
            for op in ("get", "set") for kb, ms in ((64, 0.6), (512, 0.4))]  # noise: bigger was faster
    rows += [{"backend": "mooncake", "op": op, "KB": kb, "batch_pages": 2, "p50_ms": kb / 100}
             for op in ("get", "set") for kb in (64, 512)]
    stores = storage.fitted_stores(rows, ["file", "mooncake", "absent"])
    assert set(stores) == {"mooncake"} and isinstance(stores["mooncake"], Store)
    assert "device profile: file left out: samples: the time does not grow" in capsys.readouterr().out
