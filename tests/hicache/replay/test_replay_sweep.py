"""`hicache replay` sweeps: policies side by side with the bounds, built-in workloads, verdicts
and exit statuses, and what is printed when a later run fails."""
from __future__ import annotations

import json

import pytest

import hicache.replay.args as replay_args
import hicache.replay.cli as replay_mod
from hicache.cli import main
from hicache.config import EVICTION_POLICIES
from hicache.replay.builtin import WORKLOADS
from hicache.replay.content import ReplayMismatch
from hicache.replay.run import RunStats
from host_pools.memory import HostMemoryError

TINY = ["--no-progress", "--max-requests", "3", "--device-tokens", "4096", "--layers", "1", "--hicache-ratio", "2"]
SMALL = ["--no-progress", "--max-requests", "40", "--device-tokens", "8192", "--layers", "1"]


def one_line(capsys, code: int, expected: int, *names: str) -> tuple[str, str]:
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert code == expected and "Traceback" not in out.err, (code, out.err)
    assert lines and all(n in lines[-1] for n in names), out.err
    return out.out, lines[-1]


def fake_runs(monkeypatch, fail=None) -> list[tuple[float, str]]:
    """Replace the runs by records of (ratio, policy); ``fail(ratio, policy)`` may raise."""
    calls: list[tuple[float, str]] = []

    def record(args, stack, requests, ratio, device_tokens, device, progress, policy, hints="on"):
        if fail is not None:
            fail(ratio, policy)
        calls.append((ratio, policy))
        return RunStats(ratio, requests=len(requests), tokens_total=1000, device_hit_tokens=100,
                        host_hit_tokens=300 if ratio else 0, eviction_policy=policy,
                        capacity_tokens=int(4096 * (1 + ratio)))
    monkeypatch.setattr(replay_mod, "replay_one", record)
    return calls


# ---------------------------------------------------------------- policies side by side (issue 27 item 2)


def test_policies_sweep_like_ratios_each_row_with_its_bounds(monkeypatch, capsys):
    monkeypatch.setattr(replay_args, "EVICTION_POLICIES", ("lru", "lfu"))  # the flag's names, whatever is built
    calls = fake_runs(monkeypatch)
    argv = [*TINY, "--max-requests", "40", "--hicache-ratio", "1,2", "--hicache-eviction-policy", "lru,lfu", "--json"]
    assert main(["replay", *argv]) == 0
    assert calls == [(0, "lru"), (0, "lfu"), (1, "lru"), (1, "lfu"), (2, "lru"), (2, "lfu")]
    doc = json.loads(capsys.readouterr().out)
    rows = doc["runs"]
    assert [(r["hicache_ratio"], r["eviction_policy"]) for r in rows] == calls
    for r in rows:  # the bounds at each row's device + host tokens
        assert r["capacity_tokens"] == 4096 * (1 + r["hicache_ratio"])
        assert 0 <= r["bound_lru"] <= r["bound_belady"] <= r["bound_infinite"] <= 1
    assert rows[0]["bound_belady"] == rows[1]["bound_belady"] < rows[4]["bound_belady"]
    assert doc["verdict"] == "OK"


def test_the_bounds_table_puts_policies_beside_the_bounds(monkeypatch, capsys):
    monkeypatch.setattr(replay_args, "EVICTION_POLICIES", ("lru", "lfu"))
    fake_runs(monkeypatch)
    assert main(["replay", *TINY, "--hicache-eviction-policy", "lru,lfu"]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if "capacity tokens" in line)
    assert head.split() == ["ratio", "capacity", "tokens", "lru", "lfu", "|", "ideal", "LRU", "Belady", "infinite"]
    row = out.splitlines()[out.splitlines().index(head) + 3]  # head, rule, ratio 0, ratio 2
    assert row.split()[:5] == ["2", "12,288", "0.400", "0.400", "|"]


@pytest.mark.parametrize("value", ["fifo", "lru,fifo", ",", "LRU"])
def test_an_unknown_policy_is_one_line_naming_the_flag_and_the_choices(monkeypatch, capsys, value):
    calls = fake_runs(monkeypatch)
    _, line = one_line(capsys, main(["replay", *TINY, "--hicache-eviction-policy", value]), 2,
                       "--hicache-eviction-policy", f"one or more of {', '.join(EVICTION_POLICIES)}")
    assert calls == []


def test_real_runs_never_beat_belady_and_the_plot_has_the_bounds(tmp_path, capsys):
    plot = tmp_path / "hit.svg"
    assert main(["replay", *SMALL, "--hicache-ratio", "1,4", "--json", "--plot", str(plot)]) == 0
    rows = json.loads(capsys.readouterr().out)["runs"]
    for r in rows:  # no storage tier: the clairvoyant cache of the same size is a true ceiling
        assert r["hit_rate"] <= r["bound_belady"] + 1e-12 and r["bound_lru"] <= r["bound_belady"]
    svg = plot.read_text()
    assert "ideal LRU (bound)" in svg and "Belady: no policy beats it" in svg and "infinite cache" in svg


# ---------------------------------------------------------------- built-in workloads (issue 27 item 3)


def test_workload_names_in_the_flags_are_the_builtin_ones():
    assert replay_args.WORKLOAD_NAMES == tuple(WORKLOADS)


@pytest.mark.parametrize("name", ["shared-prompts", "agents"])
def test_each_builtin_workload_replays_exact_and_restores(capsys, name):
    assert main(["replay", *SMALL, "--workload", name, "--hicache-ratio", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "OK" and all(r["mismatches"] == 0 for r in doc["runs"])
    assert doc["runs"][1]["host_hit_rate"] > 0


def test_a_workload_with_a_trace_is_refused(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}\n')
    one_line(capsys, main(["replay", *TINY, "--trace", str(trace), "--workload", "agents"]), 2, "--workload")


# ---------------------------------------------------------------- verdicts (issue 28 item 10)


def test_nothing_restored_exits_1_unless_allowed_and_the_json_says_so(capsys):
    # was: exit 0, and the JSON had no verdict
    out, line = one_line(capsys, main(["replay", *TINY, "--json"]), 1, "NOT CHECKED", "--allow-device-only")
    doc = json.loads(out)
    assert doc["verdict"] == "NOT CHECKED" and doc["verdict_line"].startswith("verdict: NOT CHECKED")
    assert main(["replay", *TINY, "--json", "--allow-device-only"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "NOT CHECKED"


# ---------------------------------------------------------------- a later run fails (issue 28 item 3)


def test_a_later_run_without_memory_keeps_the_finished_rows(monkeypatch, capsys):
    # was: nothing printed but the error (exit 2): minutes of finished runs lost
    real_build = replay_mod.build

    def build(stack, device_tokens, config, device):
        if config.hicache_ratio == 4:  # other processes took the memory since the start-up check
            raise HostMemoryError("host allocation failed ([Errno 12] Cannot allocate memory): host pools need "
                                  "1.00 GiB, budget is 0.50 GiB.\n  kv  1.000 GiB\nLower --hicache-ratio")
        return real_build(stack, device_tokens, config, device=device)
    monkeypatch.setattr(replay_mod, "build", build)
    for as_json in (True, False):
        code = main(["replay", *SMALL, "--hicache-ratio", "2,4", *(["--json"] if as_json else [])])
        out, line = one_line(capsys, code, 1, "ratio 4: cannot get its memory", "Cannot allocate memory",
                             "after 2 of 3 runs")
        if as_json:
            doc = json.loads(out)
            assert [r["hicache_ratio"] for r in doc["runs"]] == [0, 2] and doc["verdict"] == "NO MEMORY"
        else:
            assert [r.split()[:2] for r in out.splitlines()[3:5]] == [["0", "adaptive"], ["2", "adaptive"]]


def test_a_torch_allocation_failure_is_no_memory_too(monkeypatch, capsys):
    def fail(ratio, policy):
        if ratio:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")
    fake_runs(monkeypatch, fail)
    out, _ = one_line(capsys, main(["replay", *TINY, "--json"]), 1, "ratio 2: cannot get its memory")
    assert len(json.loads(out)["runs"]) == 1


@pytest.mark.parametrize("error, code, words, verdict", [
    (ReplayMismatch("request 7: loaded tokens [0, 64): pool 'kv' ..."), 1, "MISMATCH: request 7", "MISMATCH"),
    (ValueError("--hicache-storage-dir: the store went away"), 2, "the store went away", None),
])
def test_a_mismatch_or_a_store_gone_keeps_the_finished_rows(monkeypatch, capsys, error, code, words, verdict):
    def fail(ratio, policy):
        if ratio:
            raise error
    fake_runs(monkeypatch, fail)
    out, _ = one_line(capsys, main(["replay", *TINY, "--json"]), code, words)
    assert len(json.loads(out)["runs"]) == 1 and json.loads(out).get("verdict") == verdict


# ---------------------------------------------------------------- --plot checked first (issue 28 item 12)


@pytest.mark.parametrize("name, words", [("x.txt", ".txt is not a format matplotlib writes"),
                                         ("hit", "no extension is not a format")])
def test_a_plot_format_matplotlib_cannot_write_is_refused_before_the_runs(tmp_path, monkeypatch, capsys, name, words):
    # was: every ratio ran, then the plot failed on the extension
    calls = fake_runs(monkeypatch)
    _, line = one_line(capsys, main(["replay", *TINY, "--plot", str(tmp_path / name)]), 2, "--plot", words, ".png")
    assert calls == [] and list(tmp_path.iterdir()) == []


def test_each_policy_of_a_ratio_has_its_own_storage_namespace(monkeypatch):
    # two policies side by side at one ratio: the second must not start warm from the first's pages
    import types

    import hicache.replay.storage as replay_storage
    seen = []
    monkeypatch.setattr(replay_storage, "open_store", lambda cache, extra: seen.append(extra))
    for policy in ("lru", "lfu"):
        cache = types.SimpleNamespace(config=types.SimpleNamespace(storage_backend="file", eviction_policy=policy))
        replay_storage.open_run_store(cache, 2.0)
    assert len(set(seen)) == 2 and all("ratio 2" in extra for extra in seen)
