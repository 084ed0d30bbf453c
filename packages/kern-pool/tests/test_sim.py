"""kern-pool-sim: determinism, the JSON figures, clean ends, and bad knobs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kern_pool.sim import SplitMix64, Workload, main, simulate

KEYS = {
    "hit_rate", "tokens_total", "tokens_recomputed", "parks", "wakes", "evictions", "remaps",
    "peak_pages", "pages_in_use_end", "slots_in_use_end",
}
SMALL = ["--sessions", "24", "--turns", "3", "--system-len", "96", "--prompt-len", "24", "--answer-len", "24",
         "--tokens", "2048", "--unit", "16", "--batch", "4"]


@pytest.mark.parametrize(
    "extra",
    [[], ["--host-tokens", "1024"], ["--state-bytes", "4194304", "--host-tokens", "4096"]],
    ids=["device-only", "host-tier", "stateful"],
)
def test_same_arguments_same_json_and_nothing_left_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    outs = []
    for name in ("a.json", "b.json"):
        assert main([*SMALL, *extra, "--json", str(tmp_path / name)]) == 0
        outs.append((tmp_path / name).read_text())
    assert outs[0] == outs[1]
    figures = json.loads(outs[0])
    assert figures.keys() >= KEYS
    assert figures["pages_in_use_end"] == 0 and figures["slots_in_use_end"] == 0
    assert figures["turns"] == 24 * 3
    assert 0 < figures["tokens_recomputed"] < figures["tokens_total"]
    assert figures["evictions"] > 0
    captured = capsys.readouterr()
    assert "100% 72/72 turns" in captured.err
    assert "hit_rate" in captured.out


def test_host_tier_parks_and_wakes_and_improves_hits() -> None:
    base = Workload(sessions=40, turns=4, system_len=256, prompt_len=32, answer_len=32, tokens=4096, batch=4)
    device_only = simulate(base)
    with_host = simulate(replace(base, host_tokens=16384))
    assert with_host.parks > 0 and with_host.wakes > 0
    assert with_host.tokens_recomputed < device_only.tokens_recomputed
    assert device_only.parks == device_only.wakes == 0


def test_different_seeds_differ() -> None:
    a = simulate(Workload(sessions=10, turns=2, seed=1))
    b = simulate(Workload(sessions=10, turns=2, seed=2))
    assert (a.tokens_total, a.tokens_recomputed) != (b.tokens_total, b.tokens_recomputed)


@pytest.mark.parametrize("args", [["--turns", "0"], ["--host-tokens", "-1"], ["--tokens", "64", "--quiet"]])
def test_bad_knobs_exit_2_with_one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("kern-pool-sim: ")


def test_splitmix_is_fixed() -> None:
    rng = SplitMix64(0)
    assert [rng.next() for _ in range(2)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
