"""kern bench serve's serving peer, planned, checked and set beside kern's levels on the host (no
torch, no GPU; the peer's process is a stand-in script)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import kern_runtime.bench as kb
from kern_runtime.bench import serve_peer

W = kb.ServeWorkload(clients=(1, 4), system=8, question=2, max_tokens=3, rounds=2)


def _level(clients: int, **over: Any) -> dict[str, Any]:
    lv = {"clients": clients, "requests": clients * 2, "output_tokens": clients * 6, "output_tok_s": 10.0 * clients,
          "ttft_p50_ms": 5.0, "ttft_p99_ms": 9.0}
    return lv | over


def _result(*levels: dict[str, Any]) -> dict[str, Any]:
    return {"peer": "transformers 5 continuous batching", "levels": list(levels)}


def test_a_good_result_passes() -> None:
    data = _result(_level(1), _level(4))
    assert kb.check_serve_result(data, W) is data


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({}, "missing or malformed field 'levels'"),
        (_result(_level(1)), "no level of 4 clients"),
        (_result(_level(1), _level(4, requests=7)), "answered 7 requests with 24 tokens, not 8 with 24"),
        (_result(_level(1), _level(4, output_tokens=23)), "answered 8 requests with 23 tokens"),
        (_result(_level(1), _level(4, ttft_p50_ms=0)), "ttft_p50_ms of 4 clients must be a positive number, got 0"),
        (_result(_level(1, output_tok_s=True), _level(4)), "output_tok_s of 1 clients must be a positive number"),
    ],
)
def test_a_bad_result_is_one_line(data: Any, words: str) -> None:
    with pytest.raises(kb.PeerError, match=words):
        kb.check_serve_result(data, W)


def test_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kb.plan_serve_peer("off", None) == kb.PeerPlan(False)
    monkeypatch.setattr(serve_peer, "_missing", lambda: None)
    assert kb.plan_serve_peer("on", {"model_type": "qwen3"}).run
    assert kb.plan_serve_peer("auto", None).run
    with pytest.raises(kb.PeerError, match="--peer on: the serving peer cannot run: it runs Qwen3 checkpoints"):
        kb.plan_serve_peer("on", {"model_type": "llama"})
    monkeypatch.setattr(serve_peer, "_missing", lambda: "transformers is not installed (uv sync --group gpu-test)")
    plan = kb.plan_serve_peer("auto", None)
    assert not plan.run and plan.note.startswith("the serving peer is skipped: transformers is not installed")
    with pytest.raises(kb.PeerError, match="must be one of auto, on, off"):
        kb.plan_serve_peer("sometimes", None)


def test_the_checkpoint_directory(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text("{}")
    files = [tmp_path / "a" / "1.safetensors", tmp_path / "a" / "2.safetensors"]
    assert kb.checkpoint_dir(files) == tmp_path / "a" == kb.checkpoint_dir([tmp_path / "a"])
    with pytest.raises(kb.PeerError, match="the weights lie in 2"):
        kb.checkpoint_dir([*files, tmp_path / "b.safetensors"])
    with pytest.raises(kb.PeerError, match=r"needs .*config\.json beside the weights"):
        kb.checkpoint_dir([tmp_path / "c.safetensors"])


def test_the_command_and_a_stand_in_run(tmp_path: Path) -> None:
    out = tmp_path / "peer.json"
    cmd = kb.serve_peer_command(tmp_path, W, 3, out)
    assert cmd[:3] == [sys.executable, "-m", "kern_peer.serve_cli"]
    assert cmd[3:] == ["--weights", str(tmp_path), "--clients", "1,4", "--system", "8", "--question", "2",
                       "--max-tokens", "3", "--rounds", "2", "--gpu", "3", "--json", str(out)]
    write = f"import json, sys; open(sys.argv[1], 'w').write({json.dumps(json.dumps(_result(_level(1), _level(4))))})"
    assert kb.run_serve_peer([sys.executable, "-c", write, str(out)], out, W)["levels"][1]["clients"] == 4
    with pytest.raises(kb.PeerError, match=r"the serving peer failed \(exit 3"):
        kb.run_serve_peer([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "none.json", W)
    with pytest.raises(kb.PeerError, match="wrote no readable result"):
        kb.run_serve_peer([sys.executable, "-c", "pass"], tmp_path / "none.json", W)


def test_side_by_side_pairs_the_client_counts() -> None:
    from kern_runtime.bench import Level

    def kern(clients: int, rate: float, pipelined: bool = False) -> Level:
        return Level(clients, 2, 6, 1.0, rate, 4.0, 8.0, 1.0, 1.0, 1.0, pipelined=pipelined)

    text = kb.side_by_side([kern(0, 5.0), kern(1, 20.0), kern(4, 80.0), kern(4, 99.0, True)],
                           _result(_level(1), _level(4)))
    lines = text.splitlines()
    assert lines[0] == "beside transformers 5 continuous batching:" and lines[1].split()[0] == "clients"
    assert [r.split()[:4] for r in lines[2:]] == [["1", "20.0", "10.0", "2.00"], ["4", "80.0", "40.0", "2.00"]]
