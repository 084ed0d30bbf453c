"""kern_cli.console: the error prefix rule, output checks that write nothing, quiet ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kern_cli.console import (
    fail,
    output_dir_problem,
    output_file_problem,
    positive_ints,
    program,
    quiet_ends,
)


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


def test_a_device_that_refuses_writes_is_a_problem_before_anything_runs() -> None:
    assert output_file_problem(Path("/dev/full")) == "/dev/full: No space left on device"
    assert output_file_problem(Path("/dev/null")) is None


def test_the_write_check_leaves_an_existing_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text("kept")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert output_file_problem(path) is None
    assert path.read_text() == "kept" and path.stat().st_mtime_ns == 1_000_000_000


def test_a_fifo_is_not_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    assert output_file_problem(tmp_path / "pipe") is None


@pytest.mark.parametrize(
    ("text", "most", "message"),
    [
        ("1,,2", None, "--n has an empty item in '1,,2': give comma-separated positive integers"),
        (" ", None, "--n has an empty item in ' ': give comma-separated positive integers"),
        ("1,x", None, "--n must be comma-separated integers, got '1,x'"),
        ("3,0", None, "--n needs positive integers, got '3,0'"),
        ("5,9", 8, "--n allows at most 8, got 9"),
    ],
)
def test_positive_ints_refuse_in_one_line(text: str, most: int | None, message: str) -> None:
    with pytest.raises(ValueError) as info:
        positive_ints("--n", text, ValueError, most)
    assert str(info.value) == message


def test_positive_ints_take_spaces_around_items() -> None:
    assert positive_ints("--n", " 1, 8 ,32", ValueError, 32) == (1, 8, 32)


def test_a_long_value_argparse_refuses_is_cut_in_its_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from kern_cli.console import Parser

    p = Parser(prog="kern-x")
    p.add_argument("--steps", type=int)
    with pytest.raises(SystemExit) as exit_:
        p.parse_args(["--steps", "9" * 100_000])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and len(err) < 200, err[:300]
    assert err.startswith("kern-x: argument --steps: invalid int value: '999") and "(100002 chars)" in err
