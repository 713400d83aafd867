"""A trace line may not ask for more than a cache could serve (issue 37 item 6): a prompt
over ``--max-prompt-tokens`` or over the sweep's largest cache (device + host + storage)
is refused naming its line before anything is allocated for it; ``hash_ids`` past the
prompt are dropped; the new flags are checked like every other."""
from __future__ import annotations

import pytest

import hicache.replay.cli as replay_mod
from hicache.cli import main
from hicache.replay.workload import BLOCK_TOKENS, MAX_PROMPT_TOKENS, parse_line

GOOD = '{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}'
SMALL = ["--no-progress", "--layers", "1", "--device-tokens", "8192", "--hicache-ratio", "1,2"]


def _line(input_length: int, ids: int, hash_id: int = 0) -> str:
    return (f'{{"timestamp": 1, "input_length": {input_length}, "output_length": 1, '
            f'"hash_ids": [{",".join([str(hash_id)] * ids)}]}}')


def test_a_one_mib_line_of_zeros_is_refused_at_the_default_limit():
    # was: accepted as a 268 M-token prompt; the replay then reached 6.5 GB of memory
    line = _line(268_390_400, 524_200)
    assert 1_000_000 < len(line) < 1 << 20  # within the line bound
    with pytest.raises(ValueError, match=rf"^--trace t: line 4: input_length 268,390,400 is over "
                                         rf"{MAX_PROMPT_TOKENS:,} tokens, the limit of --max-prompt-tokens; "
                                         "refused before anything is allocated for it$"):
        parse_line(line, 4, "t")


def test_a_prompt_longer_than_the_largest_cache_is_refused_before_anything_is_allocated(tmp_path, monkeypatch,
                                                                                          capsys):
    def never(*_a, **_k):
        raise AssertionError("allocated for a refused trace")

    monkeypatch.setattr(replay_mod, "replay_one", never)
    monkeypatch.setattr(replay_mod, "TraceBounds", never)
    trace = tmp_path / "long.jsonl"
    trace.write_text(f"{GOOD}\n{_line(40_000, 79, 7)}\n")  # device 8,192 + host 16,384 at ratio 2: 24,576
    assert main(["replay", "--trace", str(trace), *SMALL]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1, out
    assert out.err.startswith(f"hicache replay: error: --trace {trace}: line 2: input_length 40,000 is over "
                              "24,576 tokens, the most the largest cache of this sweep holds"), out.err


def test_hash_ids_past_the_prompt_are_checked_then_dropped():
    req = parse_line(_line(BLOCK_TOKENS + 1, 100_000, 5), 1)
    assert req.input_length == BLOCK_TOKENS + 1 and req.hash_ids == (5, 5)
    with pytest.raises(ValueError, match=r"'hash_ids' must be a list of integers"):
        parse_line(_line(1, 3, -1), 1)


@pytest.mark.parametrize("flag, value", [("--max-prompt-tokens", "0"), ("--trace-stall-timeout", "0"),
                                         ("--trace-stall-timeout", "nan"), ("--trace-stall-timeout", "inf")])
def test_the_limit_flags_are_checked_in_one_line(tmp_path, capsys, flag, value):
    trace = tmp_path / "t.jsonl"
    trace.write_text(GOOD + "\n")
    assert main(["replay", "--trace", str(trace), flag, value, *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hicache replay: error: {flag}: must be") and "\n" not in err, err


def test_the_help_states_the_defaults_the_code_uses(capsys):
    from bounded_input import STALL_S
    assert main(["replay", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {MAX_PROMPT_TOKENS:,})" in text and f"(default {STALL_S:g})" in text
