"""`kern bench serve`: every flag is refused in one line, exit 2, before the engine loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kern_cli import serve
from kern_cli.main import main as kern_main
from kern_cli.options import RunError

REPO = Path(__file__).resolve().parents[3]
TINY = str(REPO / "examples" / "qwen3-tiny-batch.json")


def _line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test when a check lets the run reach the engine."""
    def reached(*_: object, **__: object) -> None:
        pytest.fail("the engine's options were resolved")

    monkeypatch.setattr(serve, "resolve", reached)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--clients", "100000000000000000000"], "--clients allows at most 1024, got 100000000000000000000"),
        (["--clients", "1,1025"], "--clients allows at most 1024, got 1025"),
        (["--clients", "1,,2"], "--clients has an empty item in '1,,2': give comma-separated positive integers"),
        (["--clients", "4,"], "--clients has an empty item in '4,': give comma-separated positive integers"),
        (["--clients", ""], "--clients has an empty item in '': give comma-separated positive integers"),
        (["--clients", "9" * 5000], f"--clients must be comma-separated integers, got '{'9' * 48}...(5000 chars)'"),
        (["--rounds", "10001"], "--rounds allows at most 10000, got 10001"),
        (["--json", "/dev/full"], "--json /dev/full: No space left on device"),
    ],
)
def test_bad_flags_are_one_line_before_the_engine(no_engine: None, capsys: pytest.CaptureFixture[str],
                                                  argv: list[str], line: str) -> None:
    assert kern_main(["bench", "serve", "--manifest", TINY, *argv]) == 2
    assert _line(capsys) == f"kern bench serve: {line}"


def test_a_request_longer_than_the_pool_is_one_line_before_the_engine(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def loaded(*_: object, **__: object) -> None:
        pytest.fail("the engine was loaded")

    monkeypatch.setattr(serve, "with_engine", loaded)
    assert kern_main(["bench", "serve", "--manifest", TINY, "--capacity", "4096", "--system", "100000000000"]) == 2
    assert _line(capsys) == ("kern bench serve: --system 100000000000 + --question 32 + --max-tokens 128 = "
                             "100000000160 tokens a request, past --capacity 4096")


def test_the_most_clients_pass_the_checks(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def stop(*_: object, **__: object) -> None:
        raise RunError("reached the engine")

    monkeypatch.setattr(serve, "resolve", stop)
    assert kern_main(["bench", "serve", "--manifest", TINY, "--clients", "1,1024", "--rounds", "10000",
                      "--json", "/dev/null"]) == 2
    assert _line(capsys) == "kern bench serve: reached the engine"


def test_a_console_script_run_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "kern_cli.main", "bench", "serve", "--clients", "1,,2"],
                          capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("kern bench serve: --clients has an empty item in '1,,2': give comma-separated positive "
                           "integers\n")


def test_weights_that_are_not_safetensors_are_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    Path("w.txt").write_text("hello\n")
    argv = ["bench", "serve", "--manifest", TINY, "--backend", "kern_interp.serve:engine", "--weights", "w.txt",
            "--clients", "1", "--rounds", "1"]
    assert kern_main(argv) == 2
    assert _line(capsys) == "kern bench serve: weights w.txt: not a safetensors file (6 bytes, no header)"


def test_peer_on_without_the_serving_peer_is_one_line_before_the_engine(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from kern_runtime.bench import serve_peer

    def loaded(*_: object, **__: object) -> None:
        pytest.fail("the engine was loaded")

    monkeypatch.setattr(serve, "with_engine", loaded)
    monkeypatch.setattr(serve_peer, "_missing", lambda: "transformers is not installed (uv sync --group gpu-test)")
    assert kern_main(["bench", "serve", "--manifest", TINY, "--peer", "on"]) == 2
    assert _line(capsys) == ("kern bench serve: --peer on: the serving peer cannot run: transformers is not "
                             "installed (uv sync --group gpu-test)")
