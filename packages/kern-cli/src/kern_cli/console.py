"""What the kern console scripts share: one error line, `--version`, output checks, quiet ends.

The error rule: every error is one line `PROG: message` on stderr, where PROG is the console
script's name (`kern-mine`, `kern-run`), or `kern <subcommand>` under the `kern` dispatcher
(`kern manifest`, `kern mine`); the message never starts with `error:` and shows non-printable
characters escaped. `Parser` applies it to argparse's own errors (a bad flag value, a missing
argument), which end in `(see PROG ... --help)` instead of a usage block. Bad input exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NoReturn

from kern_manifest import printable

__all__ = [
    "Parser",
    "add_version",
    "fail",
    "output_dir_problem",
    "output_file_problem",
    "positive_ints",
    "program",
    "quiet_ends",
    "run_handler",
]


def program(prog: str) -> str:
    """The error prefix of an argparse `prog`: its script, plus the subcommand under `kern`."""
    words = prog.split()
    return " ".join(words[:2]) if words[0] == "kern" else words[0]


def fail(prog: str, message: str) -> int:
    """Prints `PROG: message` (escaped, one line) on stderr; returns 2, the bad-input status."""
    print(f"{prog}: {printable(message)}", file=sys.stderr)
    return 2


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one `PROG: message (see ... --help)` line, exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(program(self.prog), f"{message} (see {self.prog} --help)")
        sys.exit(2)


def add_version(parser: argparse.ArgumentParser, name: str, distribution: str = "kern-cli") -> None:
    """Adds `--version`, printing `<name> <version of distribution>`."""
    try:
        number = version(distribution)
    except PackageNotFoundError:
        number = "unknown (not installed)"
    parser.add_argument("--version", action="version", version=f"{name} {number}")


def output_file_problem(path: Path) -> str | None:
    """Why `path` cannot be written as a file, or None when it can (checked, nothing written)."""
    try:
        return _file_problem(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"


def output_dir_problem(path: Path) -> str | None:
    """Why `path` cannot be (or be made) a writable directory, or None (nothing is created)."""
    try:
        return _dir_problem(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"


def _file_problem(path: Path) -> str | None:
    if path.is_dir():
        return f"{path}: is a directory"
    parent = path.parent
    if not parent.exists():
        return f"{path}: directory {parent} does not exist"
    if not parent.is_dir():
        return f"{path}: {parent} is not a directory"
    if not os.access(path if path.exists() else parent, os.W_OK):
        return f"{path}: not writable"
    return None


def _dir_problem(path: Path) -> str | None:
    if path.exists():
        if not path.is_dir():
            return f"{path}: exists and is not a directory"
        return None if os.access(path, os.W_OK) else f"{path}: not writable"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{path}: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK):
        return f"{path}: cannot create it under {ancestor} (not writable)"
    return None


def positive_ints(flag: str, text: str, error: Callable[[str], Exception]) -> tuple[int, ...]:
    """The comma-separated positive integers `text` that `flag` was given.

    Raises:
        Exception: `error(message)`, when `text` holds something else than integers, none, or one
            below 1.
    """
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise error(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise error(f"{flag} needs positive integers, got {text!r}")
    return values


def quiet_ends(prog: str, main: Callable[[], int]) -> int:
    """Runs `main`; a closed stdout (`| head`) or Ctrl-C ends it without a traceback."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return code


def run_handler(prog: str, parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parses `argv` and runs the handler it chose (`args.handler(args)`) under `quiet_ends(prog)`."""
    args = parser.parse_args(argv)
    return quiet_ends(prog, lambda: int(args.handler(args)))
