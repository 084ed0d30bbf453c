"""kern-pool-sim: determinism, the JSON figures, clean ends, and bad knobs."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from kern_pool import sim
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


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    try:
        code = main(["--quiet", *argv])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1
    return captured.err.rstrip("\n")


WORKLOAD = "(sessions x longest session + system prompts)"
POOL = "raise --unit or --state-bytes, or lower --tokens"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--tokens", "99999999999999999999"], "--tokens 99999999999999999999 is over 9223372036854775807"),
        (["--bytes-per-token", "999999999999999999999"], "--bytes-per-token 999999999999999999999 is over 9223372036854775807"),
        (["--host-tokens", "99999999999999999999"], "--host-tokens 99999999999999999999 is over 9223372036854775807"),
        (["--tokens", "-5"], "--tokens must be positive"),
        (["--batch", "0"], "--batch must be positive"),
        (["--state-bytes", "-1"], "--system-len, --host-tokens and --state-bytes must not be negative"),
        (["--zipf", "nan"], "--zipf must be a finite number in [0, 10], got nan"),
        (["--zipf", "inf"], "--zipf must be a finite number in [0, 10], got inf"),
        (["--zipf", "-0.5"], "--zipf must be a finite number in [0, 10], got -0.5"),
        (["--zipf", "1e308"], "--zipf must be a finite number in [0, 10], got 1e+308"),
        (["--seed", "-1"], "--seed -1 is outside [0, 2**64)"),
        (["--seed", str(1 << 64)], f"--seed {1 << 64} is outside [0, 2**64)"),
        (["--sessions", "999999999999"],
         f"the workload is 2944000000001152 tokens {WORKLOAD}, over 16777216: lower --sessions, --turns or the lengths"),
        (["--system-len", "99999999999"],
         f"the workload is 20400000383796 tokens {WORKLOAD}, over 16777216: lower --sessions, --turns or the lengths"),
        (["--tokens", str(1 << 30)],
         "the device budget is 158329674399744 bytes (--tokens x --bytes-per-token, plus --state-bytes per slot),"
         " over 1099511627776 (1 TiB): lower them"),
        (["--tokens", str(1 << 30), "--unit", "1", "--bytes-per-token", "1"],
         f"the pool would hold 1073741824 pages and 0 slots, over 4194304 in all: {POOL}"),
        (["--state-bytes", "1"], f"the pool would hold 4124 pages and 9730785280 slots, over 4194304 in all: {POOL}"),
        (["--unit", "99999999999"], "Capacity.tokens 65536 is less than one page of 99999999999 tokens: the pool would hold no page"),
        (["--tokens", "abc"], "argument --tokens: invalid int value: 'abc' (see kern-pool-sim --help)"),
        (["--zipf", "skewed"], "argument --zipf: invalid float value: 'skewed' (see kern-pool-sim --help)"),
        (["--zipf"], "argument --zipf: expected one argument (see kern-pool-sim --help)"),
        (["--frob"], "unrecognized arguments: --frob (see kern-pool-sim --help)"),
    ],
)
def test_nonsense_knobs_are_refused_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    assert _refused(capsys, argv) == f"kern-pool-sim: {line}"


def _no_run(*args: object) -> None:
    raise AssertionError("--json is checked before the run")


@pytest.mark.parametrize(
    ("target", "why"),
    [("missing/f.json", "{t}: directory {tmp}/missing does not exist"), (".", "{t}: is a directory"),
     ("file/f.json", "{t}: directory {tmp}/file is not a directory")],
    ids=["missing-directory", "a-directory", "under-a-file"],
)
def test_json_to_a_bad_path_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], target: str, why: str
) -> None:
    monkeypatch.chdir(tmp_path)  # NOTE: short paths: a message cuts a long one
    Path("file").write_text("x")
    monkeypatch.setattr(sim, "simulate", _no_run)
    line = _refused(capsys, ["--json", target])
    assert line == "kern-pool-sim: --json " + why.format(t=target, tmp=".").replace("./", "")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out == f"kern-pool-sim {version('kern-pool')}\n"


@pytest.mark.parametrize("argv", [["--sessions", "9" * 3000], ["--zipf", "x" * 3000], ["serve", "--requests", "9" * 3000]])
def test_a_long_value_is_cut_in_the_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with contextlib.suppress(SystemExit):
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and len(err) < 300 and "chars)" in err and "9" * 100 not in err, err[:400]
    assert "x" * 100 not in err
