"""`kern manifest verify|digest|expand`: summaries, digests, and `kern manifest:` lines (exit 2,
no traceback) for every kind of bad input."""

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
    path = _write(tmp_path, doc)
    code, out, err = _run(capsys, "verify", str(path))
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "kern manifest: /vars/tokens/max: var max 0 < 1 (vars range over [1, max]; use max >= 1)"
        " (and 13 problems that follow from it)",
        "kern manifest: /ops/embed/impl/launches/0/block: block [2048, 1, 1] outside CUDA limits"
        " (each dim >= 1; x, y <= 1024; z <= 64)",
        "kern manifest: /buffers/spare: unused buffer 'spare' (remove it or reference it)",
        f"kern manifest: {path}: 3 problems",
    ]


def test_200000_unknown_fields_print_50_lines_and_a_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(TINY.read_text())
    doc.update({f"f{i}": 1 for i in range(200_000)})
    path = _write(tmp_path, doc)
    code, out, err = _run(capsys, "verify", str(path))
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 52
    hint = "(remove it: unknown fields are rejected (see docs/manifest.md))"
    assert lines[:2] == [f"kern manifest: /f0: unknown field 'f0' {hint}", f"kern manifest: /f1: unknown field 'f1' {hint}"]
    assert lines[49] == f"kern manifest: /f49: unknown field 'f49' {hint}"
    assert lines[50:] == ["kern manifest: ... and 199950 more problems", f"kern manifest: {path}: 200000 problems"]


def test_names_are_echoed_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(TINY.read_text())
    doc["buffers"]["spare\x1b[2J"] = {"dtype": "u8", "shape": [4], "kind": "workspace"}
    path = _write(tmp_path, doc)
    code, _, err = _run(capsys, "verify", str(path))
    assert code == 2 and "\x1b" not in err
    assert err.splitlines()[0] == "kern manifest: /buffers/spare\\x1b[2J: unused buffer 'spare\\x1b[2J' (remove it or reference it)"


def test_the_summary_escapes_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = TINY.read_text().replace('"decode"', '"dec\\u001bode"')
    code, out, err = _run(capsys, "verify", str(_write(tmp_path, text)))
    assert code == 0 and err == "" and "\x1b" not in out
    assert any(line.startswith("  dec\\x1bode ") for line in out.splitlines())


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "/: not JSON: Expecting value (line 1, column 1) (fix the JSON syntax)"),
        (b"not json at all", "/: not JSON: Expecting value (line 1, column 1) (fix the JSON syntax)"),
        (b'{"schema_version": 5, "model": "x"',
         "/: not JSON: Expecting ',' delimiter (line 1, column 35) (fix the JSON syntax)"),
        (b"[1, 2, 3]", "/: a manifest is a JSON object, not an array (wrap it in {...})"),
        (b'"a string"', "/: a manifest is a JSON object, not a string (wrap it in {...})"),
        (b"\xff" * 100, "/: not UTF-8 text (byte 0) (a manifest is a UTF-8 JSON file)"),
        (b"[" * 200_000, "/: not JSON: nested too deeply (a manifest nests only a few levels)"),
        (b'{"schema_version": 3}', "/schema_version: schema_version 3 is not 5 (regenerate the manifest for schema 5)"),
    ],
)
def test_garbage_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, expected: str) -> None:
    path = _write(tmp_path, data)
    for command in ("verify", "digest", "expand"):
        code, out, err = _run(capsys, command, str(path))
        assert code == 2 and out == ""
        assert err.splitlines() == [f"kern manifest: {expected}", f"kern manifest: {path}: 1 problem"]


def test_truncated_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = TINY.read_bytes()
    code, _, err = _run(capsys, "verify", str(_write(tmp_path, text[: len(text) // 2])))
    assert code == 2 and err.startswith("kern manifest: /: not JSON")


def test_fifty_megabytes_of_random_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, os.urandom(50 * 1024 * 1024))
    code, _, err = _run(capsys, "verify", str(path))
    assert code == 2 and err.startswith("kern manifest: /: not UTF-8 text")


@pytest.mark.parametrize(
    ("name", "why"),
    [("missing.json", "no such file"), (".", "is a directory"), ("fifo", "not a regular file"),
     ("huge.json", "256 MiB, over the 256 MiB a manifest may be")],
)
def test_unreadable_paths_are_one_line_before_any_read(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, why: str) -> None:
    os.mkfifo(tmp_path / "fifo")
    with (tmp_path / "huge.json").open("wb") as f:
        f.truncate((256 << 20) + 1)
    path = tmp_path / name
    for command in ("verify", "digest", "expand"):
        code, out, err = _run(capsys, command, str(path))
        assert (code, out, err) == (2, "", f"kern manifest: {path}: {why}\n")


def test_console_script_end_to_end(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "kern_cli.main", "manifest", "verify", str(TINY)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and ok.stdout.startswith(f"{TINY}: ok")
    bad = _write(tmp_path, b"\x00garbage")
    run = subprocess.run([sys.executable, "-m", "kern_cli.main", "manifest", "verify", str(bad)], capture_output=True, text=True, check=False)
    assert run.returncode == 2 and run.stderr.startswith("kern manifest: /: not JSON") and "Traceback" not in run.stderr


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
    assert code == 2 and err.startswith("kern manifest: /: not JSON")


def test_version_names_the_program(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        kern_main.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"kern {version('kern-cli')}\n"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        ([], "kern: the following arguments are required: COMMAND (see kern --help)"),
        (["frob"], "kern: argument COMMAND: invalid choice: 'frob' (choose from 'manifest', 'run', 'chat', 'kernels', 'bench', 'mine', 'serve', 'test') (see kern --help)"),
        (["manifest"], "kern manifest: the following arguments are required: {verify,digest,expand} (see kern manifest --help)"),
        (["manifest", "verify"], "kern manifest: the following arguments are required: file (see kern manifest verify --help)"),
    ],
)
def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    with pytest.raises(SystemExit) as info:
        kern_main.main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["manifest", "verify", "a", "b"], "kern manifest: unrecognized arguments: b (see kern manifest --help)"),
        (["run", "--bogus"], "kern run: unrecognized arguments: --bogus (see kern run --help)"),
        (["kernels", "--frob"], "kern kernels: unrecognized arguments: --frob (see kern kernels --help)"),
    ],
)
def test_extra_words_name_the_subcommand_typed(capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    assert kern_main.main(argv) == 2
    assert capsys.readouterr() == ("", line + "\n")


def test_a_closed_stdout_ends_quietly() -> None:
    big = REPO / "examples" / "qwen3-4b.json"
    assert big.stat().st_size > 1 << 18
    script = "import sys; from kern_cli.main import main; sys.exit(main(sys.argv[1:]))"
    with subprocess.Popen([sys.executable, "-c", script, "manifest", "expand", str(big)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.read(10)
        proc.stdout.close()
        err = proc.stderr.read().decode()
    assert proc.returncode == 141 and err == ""


def _tiny_with(edit: str, name: str) -> dict[str, Any]:
    doc = json.loads(TINY.read_text())
    if edit == "model":
        doc["model"] = name
    elif edit == "rename":
        doc["buffers"][name] = doc["buffers"].pop("h")
    else:
        doc["buffers"]["h"]["shape"] = [1_000_000_000_000_000]
    return doc


@pytest.mark.parametrize(
    ("edit", "lines"),
    [
        ("model", ["/model: longer than 256 characters (shorten it)"]),
        ("rename", ["/buffers/" + "n" * 48 + "...(10000000 chars): longer than 256 characters (shorten it)"]),
        ("shape", ["/buffers/h/shape: 2000000000000000 bytes at the vars' maxima, over the 1099511627776 (1 TiB) "
                   "a buffer may take (lower the var maxima or the dims)"]),
    ],
)
def test_a_10_mb_name_or_an_impossible_buffer_is_one_short_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: str, lines: list[str]) -> None:
    path = _write(tmp_path, _tiny_with(edit, "n" * 10_000_000))
    code, out, err = _run(capsys, "verify", str(path))
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"kern manifest: {line}" for line in lines] + [f"kern manifest: {path}: 1 problem"]


def test_a_long_name_that_verifies_is_cut_in_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = TINY.read_text().replace('"decode"', '"' + "d" * 256 + '"').replace('"tiny-lm"', '"' + "m" * 256 + '"')
    code, out, err = _run(capsys, "verify", str(_write(tmp_path, text)))
    assert code == 0 and err == ""
    assert f"model '{'m' * 48}...(256 chars)', schema_version 5" in out
    assert any(line.startswith(f"  {'d' * 48}...(256 chars) ") for line in out.splitlines())
    assert max(map(len, out.splitlines())) < 120


def test_a_number_too_long_for_python_is_our_own_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, b'{"schema_version": 5, "model": 1' + b"0" * 5000 + b"}")
    code, _, err = _run(capsys, "verify", str(path))
    assert code == 2
    assert err.splitlines()[0] == "kern manifest: /: not JSON: a number too long (numbers in a manifest fit in 64 bits)"
