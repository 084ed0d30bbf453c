"""The peer's command line and config on the host (no torch, no GPU): every bad input is one
`kern-peer: ...` line and exit 2 before torch is imported."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

import kern_peer.cli as cli
from kern_peer import PeerConfigError, checkpoint_files, read_config
from kern_peer.config import parse_config
from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG


def test_config_of_the_4b_and_the_tiny() -> None:
    c = parse_config(dict(QWEN3_4B_CONFIG))
    assert (c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim, c.group) == (2560, 36, 32, 8, 128, 4)
    assert (c.inter, c.vocab, c.tied, c.max_pos, c.theta, c.eps) == (9728, 151936, True, 40960, 1e6, 1e-6)
    t = parse_config({**QWEN3_TINY_CONFIG, "tie_word_embeddings": False})
    assert (t.heads, t.kv_heads, t.group, t.tied) == (4, 2, 2, False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "llama"}, "model_type must be 'qwen3', got 'llama'"),
        ({"num_key_value_heads": 3}, "32 attention heads are not a multiple of 3 kv heads"),
        ({"rms_norm_eps": 1}, "'rms_norm_eps' must be a float in (0, 1), got 1"),
        ({"rope_scaling": {"rope_type": "yarn"}}, "is not supported (only the default rope)"),
        ({"hidden_size": 0}, "'hidden_size' must be a positive integer, got 0"),
        ({"head_dim": 128.5}, "'head_dim' must be a positive integer, got 128.5"),
        ({"head_dim": 127}, "head_dim 127 is odd (rope rotates pairs)"),
        ({"attention_bias": True}, "'attention_bias' true is not supported"),
    ],
)
def test_configs_it_refuses(change: dict[str, Any], message: str) -> None:
    with pytest.raises(PeerConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config({**QWEN3_4B_CONFIG, **change})


def test_checkpoint_files(ckpt: Path, tmp_path: Path) -> None:
    config, files = checkpoint_files([ckpt])
    assert config == ckpt / "config.json" and files == [ckpt / "model-00001-of-00001.safetensors"]
    assert checkpoint_files(files)[0] == config
    assert read_config(config).layers == 36
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PeerConfigError, match=r"directory holds no \.safetensors file"):
        checkpoint_files([empty])
    (empty / "x.safetensors").write_bytes(b"")
    with pytest.raises(PeerConfigError, match=r"no config\.json beside them"):
        checkpoint_files([empty])


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    rc = cli.main(argv)
    captured = capsys.readouterr()
    assert captured.out == ""
    return rc, captured.err.strip().splitlines()


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (["--contexts", "128,x"], "--contexts must be comma-separated integers, got '128,x'"),
        (["--prefill", "0"], "--prefill needs positive integers, got '0'"),
        (["--steps", "3"], "--steps must be at least 16, got 3"),
        (["--prefill-reps", "0"], "--prefill-reps must be at least 1 and --gpu not negative, got 0, 0"),
        (["--contexts", "40960"], "the contexts and prompts need 41232 positions; the model holds 40960 "
                                  "(max_position_embeddings)"),
        (["--steps"], "argument --steps: expected one argument (see kern-peer --help)"),
    ],
)
def test_bad_flags_are_one_line(extra: list[str], line: str, ckpt: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(["--weights", str(ckpt), "--json", str(tmp_path / "r.json"), *extra], capsys)
    assert (rc, err) == (2, [f"kern-peer: {line}"])


def test_missing_inputs_are_one_line(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _main(["--weights", str(ckpt), "--json", str(tmp_path / "no" / "r.json")], capsys)
    assert (rc, err) == (2, [f"kern-peer: --json {tmp_path / 'no' / 'r.json'}: not a file in an existing directory"])
    rc, err = _main(["--json", str(tmp_path / "r.json")], capsys)
    assert (rc, err) == (2, ["kern-peer: the following arguments are required: --weights (see kern-peer --help)"])
    (ckpt / "config.json").write_text(json.dumps({**QWEN3_4B_CONFIG, "model_type": "mistral"}))
    rc, err = _main(["--weights", str(ckpt), "--json", str(tmp_path / "r.json")], capsys)
    assert (rc, err) == (2, ["kern-peer: config.json: model_type must be 'qwen3', got 'mistral'"])


def test_no_torch_is_one_line(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    rc, err = _main(["--weights", str(ckpt), "--json", str(tmp_path / "r.json")], capsys)
    assert (rc, err) == (2, ["kern-peer: torch is not installed (uv sync --group gpu-test, or pip install torch)"])
    assert not (tmp_path / "r.json").exists()


def test_cache_covers_every_context_and_prompt(ckpt: Path, tmp_path: Path) -> None:
    args = cli.parse_args(["--weights", str(ckpt), "--json", str(tmp_path / "r.json"), "--contexts", "128,8192",
                           "--prefill", "709,16384", "--steps", "256"])
    assert args.cache_tokens == 16384
    args = cli.parse_args(["--weights", str(ckpt), "--json", str(tmp_path / "r.json"), "--contexts", "32768"])
    assert args.cache_tokens == 32768 + 256 + 16
