"""The kern_manifest error tree.

Every problem the package reports is a `ManifestError` that names the offending field with a JSON
pointer (RFC 6901, "" for the whole document), says what is wrong in one line and hints at the fix:

- `ManifestParse`: the bytes are not a manifest (not UTF-8, not JSON, wrong JSON shape or types,
  unknown fields, duplicate keys, malformed param strings or expressions).
- `ManifestVerify`: the manifest parses but means something invalid (a reference that does not
  resolve, a write through an `in` param, an offset out of bounds...).
- `ManifestRejected`: raised by the loading entry points; carries every problem found, not just
  the first.
- `ExprError`: an expression cannot be evaluated for the given var values (unknown var, division by
  zero). Raised by `Expr.eval` / `Expr.range`; the verifier turns these into `ManifestVerify`.

Rendered lines are printable: control and other non-printable characters in echoed names show as
Python escapes (`\\x1b`, `\\u202e`), so a line never spans two terminal lines or moves the cursor.
Lines are short: every name a message echoes goes through `short` (its first `SHOWN` characters
and its length), and so does every token of the pointer a line shows (`.pointer` keeps it whole).
Names are at most `MAX_NAME` characters (the schema refuses longer ones).
A problem that others follow from (a var whose max is 0 breaks every size that reads it) carries
`follows`, the number of problems folded into it. `problem_lines` renders at most `PROBLEM_LIMIT`
problems and one `... and N more problems` line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

__all__ = [
    "MAX_NAME",
    "PROBLEM_LIMIT",
    "SHOWN",
    "ExprError",
    "ManifestError",
    "ManifestParse",
    "ManifestRejected",
    "ManifestVerify",
    "escape_pointer",
    "name_list",
    "printable",
    "problem_lines",
    "short",
    "short_pointer",
]

PROBLEM_LIMIT: Final = 50
"""How many problems `problem_lines` (and `kern manifest`) show before `... and N more problems`."""

MAX_NAME: Final = 256
"""The longest name (of a var, buffer, state, op, module, program, group, scratch, label, checkpoint
tensor or the model) a manifest may use; the longest in examples/ has 47 characters."""

SHOWN: Final = 48
"""How many characters of a name (or of a pointer token) a message shows; `short` cuts the rest."""

_ESCAPES: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_pointer(token: str | int) -> str:
    """Escapes one reference token for a JSON pointer (`~` -> `~0`, `/` -> `~1`)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def short(text: str) -> str:
    """`text` as a message echoes it: whole up to `SHOWN` characters, else its first `SHOWN` and
    its length (`abc...(10485760 chars)`), so no name makes a line long."""
    if len(text) <= SHOWN:
        return text
    return f"{text[:SHOWN]}...({len(text)} chars)"


LISTED: Final = 12
"""How many names `name_list` shows before `(+N more)`."""


def name_list(names: Iterable[str]) -> str:
    """Names for a message: sorted, each cut by `short`, the first `LISTED` then `(+N more)`;
    empty for none."""
    listed = sorted(names)
    shown = ", ".join(map(short, listed[:LISTED]))
    return shown + (f" (+{len(listed) - LISTED} more)" if len(listed) > LISTED else "")


def short_pointer(pointer: str) -> str:
    """A JSON pointer as a message shows it: each token cut as `short` cuts a name."""
    if len(pointer) <= SHOWN:
        return pointer
    return "/".join(short(token) for token in pointer.split("/"))


def printable(text: str) -> str:
    """`text` with every non-printable character written as its Python escape (`\\x1b`, `\\n`)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def problem_lines(problems: Sequence[ManifestError], limit: int = PROBLEM_LIMIT) -> list[str]:
    """The first `limit` problems' lines, then `... and N more problems` if there are more.

    Raises:
        ValueError: `limit` is below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    lines = [p.line() for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"... and {_count(len(problems) - limit, 'more problem')}")
    return lines


class ManifestError(Exception):
    """Base class: one problem at one place of the manifest.

    Attributes:
        pointer: JSON pointer to the offending field ("" is the whole document).
        message: what is wrong, one line.
        hint: what to do about it, one line.
        follows: how many further problems follow from this one and are not listed.
    """

    def __init__(self, pointer: str, message: str, hint: str, follows: int = 0) -> None:
        self.pointer = pointer
        self.message = message
        self.hint = hint
        self.follows = follows
        super().__init__(self.line())

    def line(self) -> str:
        """`<pointer>: <message> (<hint>)`, the root shown as `/`, non-printables escaped; then
        `(and N problems that follow from it)` when `follows` is set."""
        where = short_pointer(self.pointer) or "/"
        text = f"{where}: {self.message} ({self.hint})" if self.hint else f"{where}: {self.message}"
        if self.follows:
            verb = "follows" if self.follows == 1 else "follow"
            text += f" (and {_count(self.follows, 'problem')} that {verb} from it)"
        return printable(text)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.pointer, self.message, self.hint, self.follows))


class ManifestParse(ManifestError):
    """The document is not a well-formed manifest (syntax, JSON shape, field types)."""


class ManifestVerify(ManifestError):
    """The manifest is well-formed but its meaning is invalid."""


class ExprError(ManifestError):
    """An expression cannot be evaluated or bounded (unknown var, division by zero)."""


class ManifestRejected(ManifestError):
    """A manifest was rejected; `problems` holds every `ManifestParse` / `ManifestVerify` found."""

    def __init__(self, problems: Sequence[ManifestError]) -> None:
        self.problems: tuple[ManifestError, ...] = tuple(problems)
        first = self.problems[0] if self.problems else None
        count = len(self.problems)
        summary = f"manifest rejected: {count} problem{'s' if count != 1 else ''}"
        super().__init__(first.pointer if first else "", summary, first.line() if first else "")

    def line(self) -> str:
        """`manifest rejected: N problems (<first problem>)`."""
        return printable(f"{self.message} ({self.hint})" if self.hint else self.message)

    def lines(self, limit: int = PROBLEM_LIMIT) -> list[str]:
        """Every problem's line, capped as `problem_lines` caps them."""
        return problem_lines(self.problems, limit)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.problems,))
