"""Closed forms of the token count t, fitted to (t, value) samples taken one per forward.

Forms, tried in this order (the first that fits wins): const c, tokens t, mul a*t, affine a*t+b,
ceil_div ceil(t/c), mul_ceil_div a*ceil(t/c), ceil_div_mul ceil(a*t/c). Divisors c are powers of
two from 2 to 2**16 and the smallest that fits is taken; in ceil_div_mul a is odd (a/c in lowest
terms), and two odd a fitting the same c leave the form underdetermined. A form needs at least three distinct token counts (const needs two);
fewer gives "underdetermined", and so does a form whose parameters the samples do not pin down.
Values that are not a function of t, or fit no form, give "unfit".
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["FORMS", "Fit", "fit_samples"]

Form = Literal[
    "const",
    "tokens",
    "mul",
    "ceil_div",
    "mul_ceil_div",
    "ceil_div_mul",
    "affine",
    "underdetermined",
    "unfit",
]
FORMS: tuple[Form, ...] = get_args(Form)
DIVISORS = tuple(2**k for k in range(1, 17))


def _ceil_div(x: int, y: int) -> int:
    return -(-x // y)


@dataclass(slots=True, frozen=True)
class Fit:
    """A fitted closed form: c, t, a*t, ceil(t/c), a*ceil(t/c), ceil(a*t/c) or a*t+b."""

    form: Form
    a: int | None = None
    b: int | None = None
    c: int | None = None

    @property
    def decided(self) -> bool:
        """True when the samples fix a closed form."""
        return self.form not in ("underdetermined", "unfit")

    def evaluate(self, t: int) -> int:
        """The form's value at t (a decided form only)."""
        a, b, c = self.a or 0, self.b or 0, self.c or 1
        match self.form:
            case "const":
                return c
            case "tokens":
                return t
            case "mul":
                return a * t
            case "ceil_div":
                return _ceil_div(t, c)
            case "mul_ceil_div":
                return a * _ceil_div(t, c)
            case "ceil_div_mul":
                return _ceil_div(a * t, c)
            case "affine":
                return a * t + b
            case _:
                raise ValueError(f"a {self.form} fit has no value")

    def to_json(self) -> dict[str, object]:
        """{"form", "a", "b", "c"} with null for the parameters the form does not use."""
        return {"form": self.form, "a": self.a, "b": self.b, "c": self.c}

    def render(self) -> str:
        """A short human-readable formula in t."""
        match self.form:
            case "const":
                return str(self.c)
            case "tokens":
                return "t"
            case "mul":
                return f"{self.a}*t"
            case "ceil_div":
                return f"ceil(t/{self.c})"
            case "mul_ceil_div":
                return f"{self.a}*ceil(t/{self.c})"
            case "ceil_div_mul":
                return f"ceil({self.a}*t/{self.c})"
            case "affine":
                return f"{self.a}*t{self.b:+d}"
            case _:
                return "?" if self.form == "underdetermined" else "unfit"


UNDERDETERMINED = Fit("underdetermined")
UNFIT = Fit("unfit")
Pairs = tuple[tuple[int, int], ...]


def _fit_mul(pairs: Pairs) -> list[Fit]:
    t0, y0 = pairs[0]
    if y0 % t0:
        return []
    a = y0 // t0
    ok = a >= 2 and all(y == a * t for t, y in pairs)
    return [Fit("mul", a=a)] if ok else []


def _fit_affine(pairs: Pairs) -> list[Fit]:
    (t0, y0), (t1, y1) = pairs[0], pairs[1]
    if (y1 - y0) % (t1 - t0):
        return []
    a = (y1 - y0) // (t1 - t0)
    b = y0 - a * t0
    ok = a != 0 and b != 0 and all(y == a * t + b for t, y in pairs)
    return [Fit("affine", a=a, b=b)] if ok else []


def _fit_ceil_div(pairs: Pairs) -> list[Fit]:
    for c in DIVISORS:
        if all(y == _ceil_div(t, c) for t, y in pairs):
            return [Fit("ceil_div", c=c)]
    return []


def _fit_mul_ceil_div(pairs: Pairs) -> list[Fit]:
    t0, y0 = pairs[0]
    for c in DIVISORS:
        q0 = _ceil_div(t0, c)
        if y0 % q0:
            continue
        a = y0 // q0
        if a >= 2 and all(y == a * _ceil_div(t, c) for t, y in pairs):
            return [Fit("mul_ceil_div", a=a, c=c)]
    return []


def _fit_ceil_div_mul(pairs: Pairs) -> list[Fit]:
    for c in DIVISORS:
        low, high = 2, None
        for t, y in pairs:
            # NOTE: ceil(a*t/c) == y  <=>  (y-1)*c < a*t <= y*c.
            low = max(low, (y - 1) * c // t + 1)
            top = y * c // t
            high = top if high is None else min(high, top)
        first_odd = low | 1
        if high is None or first_odd > high:
            continue
        found = [Fit("ceil_div_mul", a=first_odd, c=c)]
        if first_odd + 2 <= high:
            found.append(Fit("ceil_div_mul", a=first_odd + 2, c=c))
        return found
    return []


FITTERS = (_fit_mul, _fit_affine, _fit_ceil_div, _fit_mul_ceil_div, _fit_ceil_div_mul)


@functools.lru_cache(maxsize=65536)
def _fit_pairs(pairs: Pairs) -> Fit:
    if any(t <= 0 for t, _ in pairs):
        return UNFIT
    if all(t == y for t, y in pairs):
        return Fit("tokens")
    for fitter in FITTERS:
        found = fitter(pairs)
        if len(found) == 1:
            return found[0]
        if found:
            return UNDERDETERMINED
    return UNFIT


def fit_samples(samples: Iterable[tuple[int | None, int]]) -> Fit:
    """Fit one value per forward against the forward's token count.

    Args:
        samples: (t, value) per forward; t is None where the forward's token count is unknown.
            Such samples count for const only; the other forms are fitted to the known ones.

    Returns:
        The first form that fits with unique parameters, "underdetermined" when the samples
        cannot decide, or "unfit".
    """
    known: dict[int, int] = {}
    unknown: set[int] = set()
    count = 0
    for t, y in samples:
        count += 1
        if t is None:
            unknown.add(y)
        elif known.setdefault(t, y) != y:
            return UNFIT
    values = set(known.values()) | unknown
    if len(values) == 1:
        enough = len(known) >= 2 or (not known and count >= 2)
        return Fit("const", c=values.pop()) if enough else UNDERDETERMINED
    # NOTE: forwards of unknown token count say nothing about the form; the known ones decide it.
    if len(known) < 3:
        return UNDERDETERMINED
    return _fit_pairs(tuple(sorted(known.items())))
