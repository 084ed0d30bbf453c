"""kern-peer answers --version (as every console script does) and refuses an empty list item."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from kern_peer import cli


@pytest.mark.parametrize("argv", [["-m", "kern_peer"], ["-c", "import sys; from kern_peer.cli import main; sys.exit(main())"]])
def test_version(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, *argv, "--version"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"kern-peer {version('kern-peer')}\n", "")


@pytest.mark.parametrize("flag", ["--contexts", "--prefill"])
def test_an_empty_item_is_one_line(flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--weights", str(tmp_path), "--json", str(tmp_path / "r.json"), flag, "128,,2048"]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "", f"kern-peer: {flag} has an empty item in '128,,2048': give comma-separated positive integers\n")
