"""kern_cli.console: the error prefix rule, output checks that write nothing, quiet ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from kern_cli.console import fail, output_dir_problem, output_file_problem, program, quiet_ends


@pytest.mark.parametrize(
    ("prog", "prefix"),
    [
        ("kern", "kern"),
        ("kern manifest", "kern manifest"),
        ("kern manifest verify", "kern manifest"),
        ("kern mine analyze", "kern mine"),
        ("kern-mine", "kern-mine"),
        ("kern-mine analyze", "kern-mine"),
        ("kern-run", "kern-run"),
    ],
)
def test_the_prefix_is_the_script_or_kern_and_its_subcommand(prog: str, prefix: str) -> None:
    assert program(prog) == prefix


def test_fail_prints_one_escaped_line_and_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert fail("kern-mine", "bad\nname\x1b[2J") == 2
    assert capsys.readouterr().err == "kern-mine: bad\\nname\\x1b[2J\n"


def test_output_checks_accept_what_can_be_written_and_create_nothing(tmp_path: Path) -> None:
    assert output_file_problem(tmp_path / "new.json") is None
    assert output_dir_problem(tmp_path / "a" / "b" / "c") is None
    assert list(tmp_path.iterdir()) == []


def test_a_name_too_long_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / ("x" * 5000) / "f.json"
    assert output_file_problem(path) == f"{path}: File name too long"
    assert output_dir_problem(path) == f"{path}: File name too long"


def test_ctrl_c_ends_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted() -> int:
        raise KeyboardInterrupt

    assert quiet_ends("kern-mine", interrupted) == 130
    assert capsys.readouterr().err == "kern-mine: interrupted\n"
