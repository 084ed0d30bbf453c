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
import stat
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NoReturn

from kern_manifest import printable, short

__all__ = [
    "Parser",
    "add_version",
    "fail",
    "first_paragraph",
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


def first_paragraph(doc: str | None) -> str | None:
    """A module docstring's first paragraph as one line (a parser's description: its first line
    alone may stop mid-sentence)."""
    if not doc:
        return None
    return " ".join(doc.strip().split("\n\n")[0].split())


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one `PROG: message (see ... --help)` line, exit 2."""

    def error(self, message: str) -> NoReturn:
        # NOTE: argparse quotes the user's values whole: each long word is cut as names are
        cut = " ".join(short(word) for word in message.split(" "))
        fail(program(self.prog), f"{cut} (see {self.prog} --help)")
        sys.exit(2)


def add_version(parser: argparse.ArgumentParser, name: str, distribution: str = "kern-cli") -> None:
    """Adds `--version`, printing `<name> <version of distribution>`."""
    try:
        number = version(distribution)
    except PackageNotFoundError:
        number = "unknown (not installed)"
    parser.add_argument("--version", action="version", version=f"{name} {number}")


def output_file_problem(path: Path) -> str | None:
    """Why `path` cannot be written as a file, or None when it can (checked, nothing written: an
    existing file, or a device such as /dev/full, takes a write of no bytes)."""
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
    if path.exists():
        _write_nothing(path)
    return None


def _write_nothing(path: Path) -> None:
    """Writes no bytes to the existing `path`, appending: a regular file stays as it is, a device
    that refuses every write (/dev/full) raises OSError now. A FIFO or a socket is left unopened
    (opening a FIFO would wait for its reader)."""
    mode = path.stat().st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        os.write(fd, b"")
    finally:
        os.close(fd)


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


def positive_ints(flag: str, text: str, error: Callable[[str], Exception],
                  most: int | None = None) -> tuple[int, ...]:
    """The comma-separated positive integers `text` that `flag` was given, each at most `most`.

    Raises:
        Exception: `error(message)`, when `text` holds something else than integers, an empty
            item, one below 1 or one above `most`.
    """
    items = text.split(",")
    if any(not t.strip() for t in items):
        raise error(f"{flag} has an empty item in {short(text)!r}: give comma-separated positive integers")
    try:
        values = tuple(int(t) for t in items)
    except ValueError:
        raise error(f"{flag} must be comma-separated integers, got {short(text)!r}") from None
    if min(values) < 1:
        raise error(f"{flag} needs positive integers, got {short(text)!r}")
    if most is not None and max(values) > most:
        raise error(f"{flag} allows at most {most}, got {short(str(max(values)))}")
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
