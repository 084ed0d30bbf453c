"""`kern bench serve` on the CPU backend (the tiny Qwen3 through the interpreter): the one-row level
and each client level, their counts and percentiles consistent, the JSON as printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kern_cli.main import main as kern_main
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_bench_serve_levels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=1, name="bench", root=tmp_path)
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--backend", "kern_interp.serve:engine", "--manifest", str(ROOT / "examples" / "qwen3-tiny-batch.json"),
            "--weights", str(weights), "--capacity", "4096", "--clients", "1,3", "--system", "40", "--question", "6",
            "--max-tokens", "5", "--rounds", "2", "--rows", "4", "--ride", "on", "--json", str(out)]
    assert kern_main(argv) == 0
    levels = json.loads(out.read_text())
    assert [lv["clients"] for lv in levels] == [0, 1, 3]
    assert [lv["requests"] for lv in levels] == [2, 2, 6]
    assert [lv["tokens"] for lv in levels] == [10, 10, 30]
    for lv in levels:
        assert lv["output_tok_s"] == pytest.approx(lv["tokens"] / lv["wall_s"])
        assert 0 < lv["ttft_p50_ms"] <= lv["ttft_p99_ms"] and 0 < lv["tpot_p50_ms"] <= lv["tpot_p99_ms"]
        assert lv["x_one_row"] == pytest.approx(lv["output_tok_s"] / levels[0]["output_tok_s"])
    assert [lv["pipelined"] for lv in levels] == [False, True, True]
    assert [lv["riding"] for lv in levels] == [False, True, True]
    # NOTE: each request's question rides (its last token at least), its system prompt's cached pages do not
    assert all(lv["requests"] <= lv["ridden"] <= lv["requests"] * (40 + 6 - 32) for lv in levels[1:])
    assert all(lv["hits"] == lv["requests"] for lv in levels[1:])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[0] == "clients" and [r.split()[0] for r in printed[1:]] == ["1", "1", "3"]
    assert [r.split()[-2] for r in printed[1:]] == ["turn", "pipelined", "pipelined"]
    assert [r.split()[-1] for r in printed[1:]] == ["head", "step", "step"]  # Engine.turn takes the head
    assert [lv["head"] for lv in levels] == [True, False, False]
    assert ["apart" in r.split() for r in printed[1:]] == [True, False, False]
    assert ["ride" in r.split() for r in printed[1:]] == [False, True, True]


def test_bench_serve_both_ways(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=1, name="bench", root=tmp_path)
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--backend", "kern_interp.serve:engine", "--manifest", str(ROOT / "examples" / "qwen3-tiny-batch.json"),
            "--weights", str(weights), "--capacity", "4096", "--clients", "2", "--system", "40", "--question", "6",
            "--max-tokens", "6", "--rounds", "1", "--rows", "4", "--pipeline", "both", "--ride", "both",
            "--json", str(out)]
    assert kern_main(argv) == 0
    levels = json.loads(out.read_text())
    assert [(lv["clients"], lv["riding"], lv["pipelined"], lv["tokens"]) for lv in levels] == [
        (0, False, False, 6), (2, False, False, 12), (2, False, True, 12), (2, True, False, 12), (2, True, True, 12)]
    assert [lv["ridden"] > 0 for lv in levels] == [False, False, False, True, True]
    capsys.readouterr()
    with pytest.raises(SystemExit) as bad:
        kern_main([*argv[:-6], "--pipeline", "sideways"])
    assert bad.value.code == 2
    assert "--pipeline" in capsys.readouterr().err


def test_bench_serve_first_tokens_both_ways(tmp_path: Path) -> None:
    """`--first-token both`: each client count from the step and from the head, the same tokens."""
    weights, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=1, name="bench", root=tmp_path)
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--backend", "kern_interp.serve:engine", "--manifest", str(ROOT / "examples" / "qwen3-tiny-batch.json"),
            "--weights", str(weights), "--capacity", "4096", "--clients", "3", "--system", "40", "--question", "6",
            "--max-tokens", "4", "--rounds", "1", "--rows", "4", "--first-token", "both", "--json", str(out)]
    assert kern_main(argv) == 0
    levels = json.loads(out.read_text())
    assert [(lv["clients"], lv["head"], lv["tokens"]) for lv in levels] == [(0, True, 4), (3, False, 12), (3, True, 12)]


def _stand_in(monkeypatch: pytest.MonkeyPatch, code: str) -> list[list[str]]:
    """The serving peer's process replaced by `code` (run with the real command's --json path as
    its argument); the real commands built are returned as they come."""
    import sys

    import kern_runtime.bench as kb
    from kern_runtime.bench import serve_peer

    monkeypatch.setattr(serve_peer, "_missing", lambda: None)
    real = kb.serve_peer_command
    built: list[list[str]] = []

    def command(*args: object) -> list[str]:
        cmd = real(*args)  # type: ignore[arg-type]
        built.append(cmd)
        return [sys.executable, "-c", code, cmd[-1]]

    monkeypatch.setattr(kb, "serve_peer_command", command)
    return built


def test_bench_serve_beside_the_serving_peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`--peer on`: after kern's levels the peer runs on the same checkpoint directory and workload,
    its result lands beside --json, and its levels are printed beside kern's."""
    weights, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=1, name="bench", root=tmp_path)
    levels = [{"clients": c, "requests": c, "output_tokens": 4 * c, "output_tok_s": 7.0 * c, "ttft_p50_ms": 3.0,
               "ttft_p99_ms": 4.0} for c in (1, 2)]
    result = json.dumps({"peer": "a stand-in", "levels": levels})
    built = _stand_in(monkeypatch, f"import sys; open(sys.argv[1], 'w').write({result!r})")
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--backend", "kern_interp.serve:engine", "--manifest", str(ROOT / "examples" / "qwen3-tiny-batch.json"),
            "--weights", str(weights), "--capacity", "4096", "--clients", "1,2", "--system", "40", "--question", "6",
            "--max-tokens", "4", "--rounds", "1", "--rows", "4", "--peer", "on", "--json", str(out)]
    assert kern_main(argv) == 0
    (cmd,) = built
    assert cmd[cmd.index("--weights") + 1] == str(weights) and cmd[cmd.index("--clients") + 1] == "1,2"
    assert [cmd[cmd.index(f) + 1] for f in ("--system", "--question", "--max-tokens", "--rounds")] == ["40", "6", "4", "1"]
    assert json.loads((tmp_path / "serve-peer.json").read_text())["peer"] == "a stand-in"
    printed = capsys.readouterr().out.splitlines()
    at = printed.index("beside a stand-in:")
    assert [r.split()[0] for r in printed[at + 2:]] == ["1", "2"]
    assert [r.split()[2] for r in printed[at + 2:]] == ["7.0", "14.0"]


def test_a_failed_serving_peer_is_one_line_and_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    weights, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=1, name="bench", root=tmp_path)
    _stand_in(monkeypatch, "raise SystemExit(4)")
    argv = ["bench", "serve", "--backend", "kern_interp.serve:engine", "--manifest", str(ROOT / "examples" / "qwen3-tiny-batch.json"),
            "--weights", str(weights), "--capacity", "4096", "--clients", "1", "--system", "40", "--question", "6",
            "--max-tokens", "4", "--rounds", "1", "--rows", "4", "--peer", "on"]
    assert kern_main(argv) == 1
    err = [x for x in capsys.readouterr().err.splitlines() if "serving peer failed" in x]
    assert err == ["kern bench serve: the serving peer failed (exit 4; its kern-peer-serve lines above say why)"]
