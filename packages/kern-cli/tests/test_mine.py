from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from kern_cli import mine
from kern_mining.synth import SynthSpec, write_capture


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    root = tmp_path / "capture"
    write_capture(SynthSpec(), root / "pid42")
    return root


def test_analyze_prints_the_report_and_writes_json(
    dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a.json"
    assert mine.main(["analyze", str(dump), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "5 request windows, 18 forwards" in text
    data = json.loads(out.read_text())
    assert [[f["tokens"] for f in w["forwards"]] for w in data["windows"]][1] == [7, 1, 1, 1]
    assert data["tokens_reference"]["symbol"] == "rms_norm"


def test_analyze_thresholds_are_options(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert mine.main(["analyze", str(dump), "--window-gap-ms", "1000"]) == 0
    assert "1 request windows, 18 forwards" in capsys.readouterr().out


def test_bad_input_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mine.main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"kern-mine: {tmp_path}: no launches.jsonl here or in a pid<N>/ subdirectory; capture first\n"


def test_capture_runs_the_command_after_the_separator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(mine, "build_library", lambda force=False: tmp_path / "fake.so")
    code = mine.main(
        ["capture", "-o", str(tmp_path / "out"), "--", sys.executable, "-c", "raise SystemExit(5)"]
    )
    assert code == 5
    assert "no process dump written" in capsys.readouterr().err


def _no_build(force: bool = False) -> Path:
    raise AssertionError("the injection library is built only after the inputs are checked")


def test_capture_without_a_command_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(mine, "build_library", _no_build)
    assert mine.main(["capture", "-o", str(tmp_path / "out"), "--"]) == 2
    assert capsys.readouterr().err == (
        "kern-mine: no command to capture: give it after `--`, e.g. kern-mine capture -o DIR -- python x.py\n"
    )
    assert not (tmp_path / "out").exists()


def test_build_prints_the_library_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[bool] = []

    def fake(force: bool = False) -> Path:
        calls.append(force)
        return tmp_path / "lib.so"

    monkeypatch.setattr(mine, "build_library", fake)
    assert mine.main(["build", "--rebuild"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "lib.so")
    assert calls == [True]


def test_registers_as_kern_mine(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kern")
    mine.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["mine", "analyze", str(dump / "pid42")])
    assert args.handler(args) == 0
    assert "tokens reference: rms_norm" in capsys.readouterr().out


def _bad(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    try:
        code = mine.main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1
    return captured.err.rstrip("\n")


def _no_analysis(*args: object) -> None:
    raise AssertionError("outputs are checked before the analysis")


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("missing/a.json", "{t}: directory {tmp}/missing does not exist"),
        (".", "{t}: is a directory"),
        ("file/a.json", "{t}: {tmp}/file is not a directory"),
    ],
    ids=["missing-directory", "a-directory", "under-a-file"],
)
def test_analyze_json_to_a_bad_path_is_refused_before_the_analysis(
    dump: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], target: str, why: str
) -> None:
    (tmp_path / "file").write_text("x")
    path = tmp_path / target
    monkeypatch.setattr(mine, "analyze_dir", _no_analysis)
    line = _bad(capsys, ["analyze", str(dump), "--json", str(path)])
    assert line == "kern-mine: --json " + why.format(t=path, tmp=tmp_path)


@pytest.mark.parametrize(
    ("target", "why"),
    [("file", "{t}: exists and is not a directory"), ("file/sub", "{t}: {tmp}/file is not a directory")],
    ids=["a-file", "under-a-file"],
)
def test_capture_into_a_file_is_refused_before_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], target: str, why: str
) -> None:
    (tmp_path / "file").write_text("x")
    path = tmp_path / target
    monkeypatch.setattr(mine, "build_library", _no_build)
    line = _bad(capsys, ["capture", "-o", str(path), "--", sys.executable, "-c", "pass"])
    assert line == "kern-mine: -o " + why.format(t=path, tmp=tmp_path)
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize(
    ("flag", "value", "what"),
    [
        ("--window-gap-ms", "nan", "a finite number of milliseconds >= 0"),
        ("--window-gap-ms", "-1", "a finite number of milliseconds >= 0"),
        ("--forward-gap-ms", "1e999", "a finite number of milliseconds >= 0"),
        ("--forward-gap-ms", "fast", "a finite number of milliseconds >= 0"),
        ("--burst-gap", "-3", "a whole number of launches >= 0"),
        ("--burst-gap", "2.5", "a whole number of launches >= 0"),
    ],
)
def test_nonsense_thresholds_are_one_line(
    dump: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, what: str
) -> None:
    assert _bad(capsys, ["analyze", str(dump), flag, value]) == (
        f"kern-mine: argument {flag}: must be {what}, got {value!r} (see kern-mine analyze --help)"
    )


def test_a_malformed_dump_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pid = tmp_path / "pid1"
    pid.mkdir()
    (pid / "launches.jsonl").write_text("{not json\n{}\n")
    assert _bad(capsys, ["analyze", str(tmp_path)]) == (
        f"kern-mine: {pid / 'launches.jsonl'}:1: Expecting property name enclosed in double quotes:"
        " line 1 column 2 (char 1); re-capture or cut the file before this line"
    )


def test_an_os_error_while_reading_is_one_line(
    dump: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def denied(*args: object) -> None:
        raise PermissionError(13, "Permission denied", "/x/launches.jsonl")

    monkeypatch.setattr(mine, "analyze_dir", denied)
    assert _bad(capsys, ["analyze", str(dump)]) == "kern-mine: /x/launches.jsonl: Permission denied"


def test_kern_mine_names_itself_under_kern(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kern_cli import main as kern_main

    assert kern_main.main(["mine", "analyze", str(tmp_path), "--json", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"kern mine: --json {tmp_path}: is a directory\n"


def test_unknown_subcommand_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert _bad(capsys, ["frob"]) == (
        "kern-mine: argument {capture,analyze,build}: invalid choice: 'frob'"
        " (choose from 'capture', 'analyze', 'build') (see kern-mine --help)"
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        mine.main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out == f"kern-mine {version('kern-cli')}\n"


@pytest.mark.parametrize("argv", [["-m", "kern_cli.mine"], ["-m", "kern_cli.main", "mine"]])
def test_a_closed_stdout_ends_quietly_with_141(dump: Path, argv: list[str]) -> None:
    """As `kern manifest expand | head`: no `Broken pipe` line, the status of a SIGPIPE."""
    import subprocess

    with subprocess.Popen([sys.executable, *argv, "analyze", str(dump)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode()
    assert (proc.returncode, err) == (141, "")


def test_a_number_too_long_for_python_is_our_own_line(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    launches = dump / "pid42" / "launches.jsonl"
    lines = launches.read_text().splitlines()
    lines[0] = lines[0].replace('"t_ns": ', '"t_ns": ' + "9" * 5000, 1)
    launches.write_text("\n".join(lines) + "\n")
    assert _bad(capsys, ["analyze", str(dump)]) == (
        f"kern-mine: {launches}:1: a number too long; re-capture or cut the file before this line")
