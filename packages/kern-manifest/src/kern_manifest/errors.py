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
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ExprError",
    "ManifestError",
    "ManifestParse",
    "ManifestRejected",
    "ManifestVerify",
    "escape_pointer",
]


def escape_pointer(token: str | int) -> str:
    """Escapes one reference token for a JSON pointer (`~` -> `~0`, `/` -> `~1`)."""
    return str(token).replace("~", "~0").replace("/", "~1")


class ManifestError(Exception):
    """Base class: one problem at one place of the manifest.

    Attributes:
        pointer: JSON pointer to the offending field ("" is the whole document).
        message: what is wrong, one line.
        hint: what to do about it, one line.
    """

    def __init__(self, pointer: str, message: str, hint: str) -> None:
        self.pointer = pointer
        self.message = message
        self.hint = hint
        super().__init__(self.line())

    def line(self) -> str:
        """The one-line rendering: `<pointer>: <message> (<hint>)`; the root shows as `/`."""
        where = self.pointer or "/"
        return f"{where}: {self.message} ({self.hint})" if self.hint else f"{where}: {self.message}"

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.pointer, self.message, self.hint))


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
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.problems,))
