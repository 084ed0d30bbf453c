"""kern-qwen3 on bad input: one line `kern-qwen3: ...` on stderr, exit 2, no traceback, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kern_qwen3 import QWEN3_TINY_CONFIG, cli

FAKE = {"qwen3_core": "a" * 64}


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: bytes) -> list[str]:
    cfg = tmp_path / "config.json"
    cfg.write_bytes(config)
    out = tmp_path / "m.json"
    assert cli.main([str(cfg), "-o", str(out), "--kernels-src", "tools/kernels-src"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kern-qwen3: ")
    return lines


@pytest.mark.parametrize(("config", "words"), [
    (b"[1, 2]", "must be a JSON object, got a JSON list"),
    (b"\xff\xfe{}", "is not UTF-8"),
    (b"{not json", "is not JSON"),
    (json.dumps({**QWEN3_TINY_CONFIG, "head_dim": 0}).encode(), "'head_dim' must be a positive integer"),
    (json.dumps({**QWEN3_TINY_CONFIG, "head_dim": -64}).encode(), "'head_dim' must be a positive integer"),
    (json.dumps({**QWEN3_TINY_CONFIG, "head_dim": 64.0}).encode(), "'head_dim' must be a positive integer"),
    (json.dumps({**QWEN3_TINY_CONFIG, "num_hidden_layers": "2"}).encode(), "'num_hidden_layers' must be"),
    (json.dumps({k: v for k, v in QWEN3_TINY_CONFIG.items() if k != "vocab_size"}).encode(), "'vocab_size' must be"),
])
def test_bad_configs_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: bytes, words: str) -> None:
    assert words in _run(tmp_path, capsys, config)[0]


def test_a_manifest_the_verifier_rejects_is_not_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "build_and_hash", lambda src, out: dict.fromkeys(
        ("attention", "gemv", "gemv_defer", "qwen3_core", "sampling", "qwen3_f32"), "c" * 64))
    line = _run(tmp_path, capsys, json.dumps({**QWEN3_TINY_CONFIG, "vocab_size": 10**12}).encode())[0]
    assert "the generated manifest does not verify" in line


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("kern-qwen3 ")
