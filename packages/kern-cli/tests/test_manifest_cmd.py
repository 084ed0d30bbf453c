"""`kern manifest verify|digest`: summaries, digests, and `error:` lines (exit 2, no traceback)
for every kind of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kern_cli import main as kern_main
from kern_cli.manifest_cmd import format_bytes, summary
from kern_manifest import digest_text, parse_manifest

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "examples" / "tiny.json"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = kern_main.main(["manifest", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _write(tmp_path: Path, data: bytes | str | dict[str, Any]) -> Path:
    path = tmp_path / "m.json"
    if isinstance(data, dict):
        data = json.dumps(data)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_verify_example_prints_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "verify", str(TINY))
    assert code == 0 and err == ""
    assert out.startswith(f"{TINY}: ok\n")
    assert "model 'tiny-lm', schema_version 5" in out
    assert "vars: tokens in [1, 64]" in out
    assert "weight" in out and "500 KiB" in out
    assert "kv (bytes_per_token 1024)" in out
    assert "decode" in out and "5 calls (graph)" in out


def test_summary_counts_buffers_by_kind() -> None:
    lines = summary(parse_manifest(TINY.read_bytes()))
    kinds = {ln.split()[0]: ln.split()[1] for ln in lines if ln.startswith("  ") and "calls" not in ln}
    assert kinds == {"input": "2", "output": "1", "weight": "2", "workspace": "3"}


def test_digest_prints_sha256(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "digest", str(TINY))
    assert code == 0
    assert out == f"{digest_text(TINY.read_bytes())}  {TINY}\n"


def test_invalid_manifest_prints_one_error_line_per_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(TINY.read_text())
    doc["vars"]["tokens"]["max"] = 0
    doc["ops"]["embed"]["impl"]["launches"][0]["block"] = [2048, 1, 1]
    doc["buffers"]["spare"] = {"dtype": "u8", "shape": [4], "kind": "workspace"}
    code, out, err = _run(capsys, "verify", str(_write(tmp_path, doc)))
    assert code == 2 and out == ""
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert "error: /vars/tokens/max: var max 0 < 1 (vars range over [1, max]; use max >= 1)" in errors
    assert any(ln.startswith("error: /ops/embed/impl/launches/0/block: ") for ln in errors)
    assert any(ln.startswith("error: /buffers/spare: unused buffer") for ln in errors)
    assert err.splitlines()[-1].endswith(f"{len(errors)} problem(s)")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "error: /: not JSON"),
        (b"not json at all", "error: /: not JSON"),
        (b'{"schema_version": 5, "model": "x"', "error: /: not JSON"),
        (b"[1, 2, 3]", "error: /: a manifest is a JSON object, not an array"),
        (b"\xff" * 100, "error: /: not UTF-8 text"),
        (b"[" * 200_000, "error: /: not JSON"),
        (b'{"schema_version": 5, "model": 7, "buffers": [], "modules": {}, "ops": {}, "programs": {}}', "error: /model: "),
        (b'{"schema_version": 3}', "error: /schema_version: schema_version 3 is not 5"),
    ],
)
def test_garbage_exits_2_with_error_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, expected: str) -> None:
    for command in ("verify", "digest"):
        code, out, err = _run(capsys, command, str(_write(tmp_path, data)))
        assert code == 2 and out == ""
        assert err.startswith(expected)
        assert "Traceback" not in err


def test_truncated_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = TINY.read_bytes()
    code, _, err = _run(capsys, "verify", str(_write(tmp_path, text[: len(text) // 2])))
    assert code == 2 and err.startswith("error: /: not JSON")


def test_fifty_megabytes_of_random_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, os.urandom(50 * 1024 * 1024))
    code, _, err = _run(capsys, "verify", str(path))
    assert code == 2 and err.startswith("error: /: not UTF-8 text")


def test_unreadable_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "verify", str(tmp_path / "missing.json"))
    assert code == 2 and err.startswith(f"error: {tmp_path / 'missing.json'}: cannot read")
    code, _, err = _run(capsys, "digest", str(tmp_path))
    assert code == 2 and err.startswith(f"error: {tmp_path}: cannot read")


def test_console_script_end_to_end(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "kern_cli.main", "manifest", "verify", str(TINY)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and ok.stdout.startswith(f"{TINY}: ok")
    bad = _write(tmp_path, b"\x00garbage")
    run = subprocess.run([sys.executable, "-m", "kern_cli.main", "manifest", "verify", str(bad)], capture_output=True, text=True, check=False)
    assert run.returncode == 2 and run.stderr.startswith("error: ") and "Traceback" not in run.stderr


@pytest.mark.parametrize(("n", "text"), [(0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (3 << 30, "3 GiB")])
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_expand_prints_the_canonical_json_with_constants_replaced(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(TINY.read_text())
    emb = next(n for n, b in doc["buffers"].items() if b["kind"] == "weight")
    rows = doc["buffers"][emb]["shape"][0]
    doc["constants"] = {"ROWS": rows}
    doc["buffers"][emb]["shape"][0] = "ROWS"
    code, out, err = _run(capsys, "expand", str(_write(tmp_path, doc)))
    assert code == 0 and err == ""
    expanded = json.loads(out)
    assert "constants" not in expanded and expanded["buffers"][emb]["shape"][0] == rows
    assert digest_text(out) == digest_text(TINY.read_bytes())
    code, _, err = _run(capsys, "expand", str(_write(tmp_path, b"{")))
    assert code == 2 and err.startswith("error: ")
