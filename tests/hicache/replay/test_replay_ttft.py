"""`hicache replay --device-profile`: estimated time to first token in the table, the JSON and
the plot, and the load policy against its alternatives request by request.

The decision's test runs a dense MHA model (llama-3.1-8b with int8 KV, 2 layers replayed)
over a file store that reads at 0.5 GB/s after 20 ms, on a GPU 20 times slower than the h100
profile's: a long storage hit pays, a short one does not (its read's latency costs more than
recomputing it), so both outcomes occur in one replay.
"""
from __future__ import annotations

import json

import pytest

from hicache.cli import main
from hicache.cost import load_profile, profile_dict
from hicache.models import preset
from hicache.replay import JSON_KEYS
from hicache.replay.bounds import Bounds
from hicache.replay.report import format_table, json_row
from hicache.replay.run import RunStats
from hicache.replay.timing import RunTiming
from tests.hicache.test_cli import assert_one_line_error

SMALL = ["--max-requests", "40", "--device-tokens", "8192", "--no-progress"]


def test_table_json_and_plot_carry_the_estimates(tmp_path, capsys):
    plot = tmp_path / "ttft.png"
    assert main(["replay", *SMALL, "--hicache-ratio", "4", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "time to first token on h100, ESTIMATED from the device profile" in out
    assert "h2d GB/s" not in out and plot.stat().st_size > 0  # this machine's copy rates: behind a flag
    assert main(["replay", *SMALL, "--hicache-ratio", "4", "--json"]) == 0
    runs = [RunStats(**{k: v for k, v in r.items() if k in RunStats.__dataclass_fields__})
            for r in json.loads(capsys.readouterr().out)["runs"]]
    base, hier = (json_row(st) for st in runs)
    assert tuple(hier) == JSON_KEYS and hier["device_profile"] == "h100" and hier["load_policy"] == "cost"
    # reuse saves prefill: the host tier more than the device alone, and the median first token is earlier
    assert 0 < base["prefill_gpu_s_saved"] < hier["prefill_gpu_s_saved"] < hier["prefill_gpu_s_nocache"]
    assert hier["ttft_p50_s"] < hier["ttft_nocache_p50_s"] == base["ttft_nocache_p50_s"]
    bounds = [Bounds(st.capacity_tokens, 1.0, 1.0, 1.0) for st in runs]
    assert "h2d GB/s" in format_table(preset("deepseek-v3", 2), runs, bounds, copy_rates=True)


@pytest.mark.parametrize("argv,flag", [(["--device-profile", "h300"], "--device-profile h300"),
                                       (["--hicache-load-policy", "never"], "--hicache-load-policy")])
def test_a_bad_profile_or_policy_is_one_line(capsys, argv, flag):
    assert_one_line_error(capsys, main(["replay", *SMALL, *argv]), flag)


@pytest.fixture
def recorded(monkeypatch) -> list:
    """Every run's per-request estimates (`RunTiming.timeline.times`), in run order."""
    runs: list = []
    summary = RunTiming.summary

    def keep(self):
        runs.append(list(self.timeline.times))
        return summary(self)
    monkeypatch.setattr(RunTiming, "summary", keep)
    return runs


def test_cost_never_loses_to_always_or_never_and_both_policies_are_exact(tmp_path, capsys, recorded):
    doc = profile_dict(load_profile("h100"))
    doc["storage"]["file"] |= {"read_gbps": 0.5, "write_gbps": 0.5, "read_latency_s": 0.02}
    doc["prefill"] |= {k: doc["prefill"][k] / 20 for k in ("bf16_tflops", "fp8_tflops", "attention_tflops")}
    profile = tmp_path / "slow_store.json"
    profile.write_text(json.dumps(doc))
    rows = {}
    for policy in ("cost", "always"):
        argv = [*SMALL, "--max-requests", "60", "--model", "llama-3.1-8b-int8", "--hicache-ratio", "1", "--json",
                "--device-profile", str(profile), "--hicache-load-policy", policy, "--hicache-storage-backend", "file",
                "--hicache-storage-dir", str(tmp_path / policy), "--hicache-storage-prefetch-policy", "wait_complete"]
        assert main(["replay", *argv]) == 0
        rows[policy] = json.loads(capsys.readouterr().out)["runs"][1]
        assert rows[policy]["mismatches"] == 0 and rows[policy]["storage_hit_rate"] > 0
    cost_times = recorded[1]  # runs: cost's baseline, cost's ratio 1, always's two
    assert all(t.ttft_s <= 1.01 * min(t.always_s, t.never_s) for t in cost_times)
    cut = [t for t in cost_times if t.recomputed]
    assert cut and all(t.ttft_s < t.always_s for t in cut)  # a storage hit recomputed: faster
    assert rows["cost"]["requests_recomputing_hits"] == len(cut) > 0 == rows["always"]["requests_recomputing_hits"]
