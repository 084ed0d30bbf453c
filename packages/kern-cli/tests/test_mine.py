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
    assert err.startswith("kern-mine: error: ") and err.count("\n") == 1


def test_capture_runs_the_command_after_the_separator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(mine, "build_library", lambda force=False: tmp_path / "fake.so")
    code = mine.main(
        ["capture", "-o", str(tmp_path / "out"), "--", sys.executable, "-c", "raise SystemExit(5)"]
    )
    assert code == 5
    assert "no process dump written" in capsys.readouterr().err


def test_capture_without_a_command_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(mine, "build_library", lambda force=False: tmp_path / "fake.so")
    assert mine.main(["capture", "-o", str(tmp_path / "out"), "--"]) == 2
    assert "no command to capture" in capsys.readouterr().err


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
