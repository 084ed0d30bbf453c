"""kern-pool-sim serve: a serving workload replayed through the scheduler, in steps."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kern_pool.sim import SimError
from kern_pool.sim import main as sim_main
from kern_pool.sim_serve import ServeWorkload, replay

SMALL = ServeWorkload(requests=120, rate=0.8, prefixes=2, prefix_len=64, prompt_min=4, prompt_max=40,
                      output_min=2, output_max=24, rows=8, step_tokens=64, chunk=32, pages=128, unit=16)


def test_every_request_ends_and_the_replay_is_deterministic() -> None:
    f = replay(SMALL)
    assert f == replay(SMALL)
    assert f.requests == f.finished == 120 and f.refused == 0
    assert 2 * 120 <= f.tokens <= 24 * 120
    assert 0 < f.rows_mean <= 8 and f.ttft_p50 >= f.queue_p50 and f.tpot_p50 >= 1
    assert 100 <= f.prefix_hits <= 120  # two system prompts, cached after their first prefill


def test_a_small_pool_with_growth_parks_and_still_finishes() -> None:
    w = ServeWorkload(requests=60, rate=0.8, prefixes=2, prefix_len=32, prompt_min=4, prompt_max=20, output_min=8,
                      output_max=40, rows=8, step_tokens=64, chunk=32, pages=16, unit=16, grow=4)
    f = replay(w)
    assert f.parks > 0 and f.finished == 60


def test_a_burst_sharing_a_cached_system_prompt_is_admitted_within_one_step_budget() -> None:
    burst = ServeWorkload(requests=32, rate=1000.0, prefixes=1, prefix_len=512, prompt_min=32, prompt_max=32,
                          output_min=64, output_max=64, step_tokens=2048, chunk=2048)
    f = replay(burst)
    assert f.prefix_hits == 31 and f.queue_p99 == 0 and f.ttft_p50 == f.ttft_p99 == 1  # 543 + 31 x 32 tokens
    assert f.steps == 1 + 64 + 1  # every first token on the second step, one step to retire them
    more = replay(dataclasses.replace(burst, requests=64))
    assert more.ttft_p50 == 1 and more.ttft_p99 == 2  # 47 fit the first step's 2,048 tokens


def test_a_burst_rides_on_the_decode_steps_rows() -> None:
    """The same burst riding on 64-row steps: the first request's 544 prompt tokens take 9 steps
    (the ninth samples its first token), then the 31 others' 32 questions ride two a step beside
    the decode rows while rows are left, their system prompt cached; every request ends, none
    ever shares a step's rows past 64."""
    burst = ServeWorkload(requests=32, rate=1000.0, prefixes=1, prefix_len=512, prompt_min=32, prompt_max=32,
                          output_min=64, output_max=64, step_tokens=2048, chunk=2048, ride=64)
    f = replay(burst)
    assert f.finished == 32 and f.prefix_hits == 31 and f.ridden == 544 + 31 * 32
    assert f.ttft_p50 > 9 and f.queue_p50 > 0 and f == replay(burst)
    assert f.tokens == 32 * 64 and f.rows_mean <= 64


def test_first_tokens_with_the_prefill() -> None:
    """`head`: the burst's first tokens come on the step that prefills them (TTFT 0 steps, not 1),
    the tokens and steps otherwise as before, and a mixed workload drains as without it."""
    burst = ServeWorkload(requests=32, rate=1000.0, prefixes=1, prefix_len=512, prompt_min=32, prompt_max=32,
                          output_min=64, output_max=64, step_tokens=2048, chunk=2048, head=1)
    f = replay(burst)
    assert f.ttft_p50 == f.ttft_p99 == 0 and f.tokens == 32 * 64 and f.steps == 64 + 1
    mixed = replay(dataclasses.replace(SMALL, head=1))
    base = replay(SMALL)
    assert mixed.finished == base.finished == 120 and mixed.tokens == base.tokens
    assert mixed.ttft_p50 < base.ttft_p50


def test_a_short_queue_refuses() -> None:
    w = ServeWorkload(requests=80, rate=5.0, prefixes=1, prefix_len=16, prompt_min=4, prompt_max=8, output_min=16,
                      output_max=16, rows=2, queued=4, pages=64, unit=16)
    f = replay(w)
    assert f.refused > 0 and f.finished == 80 - f.refused


@pytest.mark.parametrize(("knob", "value", "match"), [
    ("rate", 0.0, "--rate"), ("rate", float("nan"), "--rate"), ("rows", 0, "--rows"),
    ("requests", True, "--requests"), ("prompt_min", 9, "--prompt-min"), ("head", 2, "--head is 0"),
])
def test_bad_knobs(knob: str, value: object, match: str) -> None:
    fields: dict[str, object] = {knob: value, "prompt_max": 8} if knob == "prompt_min" else {knob: value}
    w = ServeWorkload(**fields)  # pyright: ignore[reportArgumentType]
    with pytest.raises(SimError, match=match):
        replay(w)


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "f.json"
    assert sim_main(["serve", "--requests", "40", "--pages", "256", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["finished"] == 40 and "ttft_p99" in capsys.readouterr().out
    assert sim_main(["serve", "--rows", "0"]) == 2
    assert "kern-pool-sim serve: --rows must be at least 1" in capsys.readouterr().err


def test_a_json_path_that_cannot_be_written_is_refused_before_the_replay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import kern_pool.sim_serve as sim_serve

    def no_replay(w: ServeWorkload) -> None:
        raise AssertionError("the replay ran")

    monkeypatch.setattr(sim_serve, "replay", no_replay)
    assert sim_main(["serve", "--json", str(tmp_path / "missing" / "f.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kern-pool-sim serve: --json ") and "does not exist" in err and len(err.splitlines()) == 1


def test_a_closed_stdout_ends_the_serve_replay_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    import kern_pool.sim_serve as sim_serve

    def closed(w: ServeWorkload) -> None:
        raise BrokenPipeError

    monkeypatch.setattr(sim_serve, "replay", closed)
    monkeypatch.setattr("os.dup2", lambda fd, fd2: None)
    assert sim_main(["serve", "--requests", "4"]) == 141
