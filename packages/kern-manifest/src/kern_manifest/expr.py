"""The manifest's closed expression language: grids, shared memory, shapes, offsets, scalar args.

JSON forms (nothing else is an expression):

- a non-negative integer constant: `4096`;
- a var name, as a bare string: `"tokens"`;
- `{"add": [a, b]}`, `{"mul": [a, b]}`, `{"min": [a, b]}`, `{"max": [a, b]}`;
- `{"ceil_div": [a, b]}`: the divisor `b` must be >= 1 over the vars' ranges.

Every value is a non-negative integer (vars are >= 1 at run time, constants >= 0), so each operator
is monotone in each operand: `add`, `mul`, `min`, `max` and a `ceil_div` numerator are
non-decreasing, a `ceil_div` divisor non-increasing. `parse_expr` records, per var, whether the
whole expression rises, falls or does both with it; `Expr.range` then gives the *exact* minimum and
maximum over a box of var bounds by evaluating at two corners (a var that both raises and lowers the
value, which needs the var on both sides of a division, is enumerated over its range instead).

`Expr.eval(vars)` is a plain walk of a tuple tree, about a microsecond per node; the runtime
evaluates expressions when it compiles launch records, never per step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from kern_manifest.errors import MAX_NAME, ExprError, ManifestParse, short

__all__ = ["MAX_DEPTH", "OPERATORS", "Expr", "parse_expr"]

OPERATORS: Final = ("add", "mul", "ceil_div", "min", "max")
MAX_DEPTH: Final = 64
_MAX_CONST: Final = (1 << 63) - 1
_MAX_ENUMERATION: Final = 1 << 16
_ADD, _MUL, _CEIL_DIV, _MIN, _MAX = range(5)

# NOTE: direction bits: the expression rises with the var (_UP), falls (_DOWN), or both (_UP | _DOWN).
_UP: Final = 1
_DOWN: Final = 2

Node: TypeAlias = "int | str | tuple[int, Node, Node]"


def _eval(node: Node, env: Mapping[str, int]) -> int:
    if type(node) is int:
        return node
    if type(node) is str:
        return env[node]
    op, a, b = node  # type: ignore[misc]
    x = _eval(a, env)
    y = _eval(b, env)
    if op == _ADD:
        return x + y
    if op == _MUL:
        return x * y
    if op == _CEIL_DIV:
        return -(-x // y)
    if op == _MIN:
        return x if x < y else y
    return x if x > y else y


def _to_json(node: Node) -> object:
    if isinstance(node, int | str):
        return node
    op, a, b = node
    return {OPERATORS[op]: [_to_json(a), _to_json(b)]}


@dataclass(frozen=True, slots=True)
class Expr:
    """A parsed expression. Build with `parse_expr` (or `Expr.of` for a constant or a var).

    Attributes:
        node: compact tree: an int, a var name, or `(opcode, left, right)`.
        vars: the var names the expression reads.
        const: the value when the expression reads no var, else None.
        divisor: every value is a multiple of this (0: the value is always 0).
    """

    node: Node
    vars: frozenset[str] = field(compare=False)
    const: int | None = field(compare=False)
    divisor: int = field(compare=False)
    _dirs: tuple[tuple[str, int], ...] = field(compare=False, repr=False)
    _divisors: tuple[Expr, ...] = field(compare=False, repr=False)

    @staticmethod
    def of(value: int | str) -> Expr:
        """An expression for one constant or one var name."""
        return parse_expr(value)

    def eval(self, env: Mapping[str, int]) -> int:
        """Evaluates at the given var values.

        Raises:
            ExprError: a var the expression reads is missing, or a divisor is 0.
        """
        if self.const is not None:
            return self.const
        try:
            return _eval(self.node, env)
        except KeyError as exc:
            raise ExprError(
                "",
                f"unknown var {short(str(exc.args[0]))!r}",
                "pass a value for every var the expression reads",
            ) from None
        except ZeroDivisionError:
            raise ExprError("", "division by zero", "ceil_div divisors must stay >= 1") from None

    def range(self, bounds: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        """The exact (min, max) over every var in its inclusive (lo, hi) bounds.

        Raises:
            ExprError: a var has no bounds or bad bounds, a divisor can be 0, or a var on both
                sides of a division spans more than 65536 values.
        """
        if self.const is not None:
            return (self.const, self.const)
        for name in self.vars:
            span = bounds.get(name)
            if span is None:
                raise ExprError("", f"no bounds for var {short(name)!r}", "declare the var under /vars")
            if not 0 <= span[0] <= span[1]:
                raise ExprError("", f"bad bounds {span} for var {short(name)!r}", "need 0 <= lo <= hi")
        for div in self._divisors:
            if div.range(bounds)[0] < 1:
                raise ExprError(
                    "",
                    f"divisor {short(str(div.to_json()))} can be 0",
                    "keep ceil_div divisors >= 1 at the var bounds",
                )
        return self._corners(bounds)

    def _corners(self, bounds: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        low: dict[str, int] = {}
        high: dict[str, int] = {}
        mixed: list[str] = []
        for name, d in self._dirs:
            lo, hi = bounds[name]
            if d == _UP | _DOWN:
                mixed.append(name)
            elif d == _DOWN:
                low[name], high[name] = hi, lo
            else:
                low[name], high[name] = lo, hi
        if not mixed:
            return (_eval(self.node, low), _eval(self.node, high))
        return self._enumerate(mixed, bounds, low, high)

    def _enumerate(
        self,
        mixed: list[str],
        bounds: Mapping[str, tuple[int, int]],
        low: dict[str, int],
        high: dict[str, int],
    ) -> tuple[int, int]:
        spans = [range(bounds[n][0], bounds[n][1] + 1) for n in mixed]
        if math.prod(len(s) for s in spans) > _MAX_ENUMERATION:
            raise ExprError(
                "",
                f"var(s) {', '.join(map(short, mixed))} appear on both sides of a ceil_div over a wide range",
                "rewrite so each var only raises or only lowers the value",
            )
        lows: list[int] = []
        highs: list[int] = []
        for values in itertools.product(*spans):
            low.update(zip(mixed, values, strict=True))
            high.update(zip(mixed, values, strict=True))
            lows.append(_eval(self.node, low))
            highs.append(_eval(self.node, high))
        return (min(lows), max(highs))

    def to_json(self) -> object:
        """The JSON form this expression was parsed from (round-trips through `parse_expr`)."""
        return _to_json(self.node)


def _flip(d: int) -> int:
    return ((d & _UP) << 1) | ((d & _DOWN) >> 1)


def _merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for name, d in b.items():
        out[name] = out.get(name, 0) | d
    return out


class _Parser:
    def __init__(self) -> None:
        self.divisors: list[Expr] = []

    def node(self, raw: object, path: str, depth: int) -> tuple[Node, dict[str, int], int]:
        """Returns (node, var directions, divisor) for one JSON value."""
        if depth > MAX_DEPTH:
            raise ManifestParse(path, f"expression nested deeper than {MAX_DEPTH}", "flatten it")
        if isinstance(raw, bool):
            raise ManifestParse(path, "a boolean is not an expression", _FORMS)
        if isinstance(raw, int):
            if not 0 <= raw <= _MAX_CONST:
                raise ManifestParse(
                    path,
                    f"constant {raw} outside 0..2^63-1",
                    "expressions are non-negative; use an i32/i64 literal arg",
                )
            return raw, {}, raw
        if isinstance(raw, str):
            if not raw:
                raise ManifestParse(path, "empty var name", "name a var declared under /vars")
            if len(raw) > MAX_NAME:
                raise ManifestParse(path, f"var name longer than {MAX_NAME} characters", "shorten it")
            return raw, {raw: _UP}, 1
        if isinstance(raw, dict):
            return self.operator(raw, path, depth)  # type: ignore[arg-type]
        raise ManifestParse(path, f"a {type(raw).__name__} is not an expression", _FORMS)

    def operator(
        self, raw: dict[str, object], path: str, depth: int
    ) -> tuple[Node, dict[str, int], int]:
        if len(raw) != 1 or next(iter(raw)) not in OPERATORS:
            keys = ", ".join(repr(short(k)) for k in itertools.islice(raw, 4)) or "no key"
            if len(raw) > 4:
                keys += f" and {len(raw) - 4} more keys"
            raise ManifestParse(
                path, f"expression object with {keys}", f"use exactly one of {', '.join(OPERATORS)}"
            )
        name, operands = next(iter(raw.items()))
        where = f"{path}/{name}"
        if not isinstance(operands, list) or len(operands) != 2:  # type: ignore[arg-type]
            raise ManifestParse(
                where, f"{name} takes a list of two operands", f'write {{"{name}": [a, b]}}'
            )
        a, da, ga = self.node(operands[0], f"{where}/0", depth + 1)  # type: ignore[index]
        b, db, gb = self.node(operands[1], f"{where}/1", depth + 1)  # type: ignore[index]
        op = OPERATORS.index(name)
        if op == _CEIL_DIV:
            return self.ceil_div(a, da, b, db, where)
        dirs = _merge(da, db)
        divisor = ga * gb if op == _MUL else math.gcd(ga, gb)
        return (op, a, b), dirs, divisor

    def ceil_div(
        self, a: Node, da: dict[str, int], b: Node, db: dict[str, int], where: str
    ) -> tuple[Node, dict[str, int], int]:
        if not db:
            if _eval(b, {}) == 0:
                raise ManifestParse(f"{where}/1", "ceil_div by 0", "use a divisor >= 1")
        else:
            self.divisors.append(_build(b, db, 1, []))
        dirs = _merge(da, {n: _flip(d) for n, d in db.items()})
        return (_CEIL_DIV, a, b), dirs, 1


_FORMS = 'use an integer, a var name, or {"add"|"mul"|"ceil_div"|"min"|"max": [a, b]}'


def _build(node: Node, dirs: dict[str, int], divisor: int, divisors: list[Expr]) -> Expr:
    const = _eval(node, {}) if not dirs else None
    return Expr(
        node=node,
        vars=frozenset(dirs),
        const=const,
        divisor=const if const is not None else divisor,
        _dirs=tuple(sorted(dirs.items())),
        _divisors=tuple(divisors),
    )


def parse_expr(raw: object) -> Expr:
    """Parses one expression from its JSON value.

    Raises:
        ManifestParse: `raw` is not an expression; the pointer is relative to `raw`.
    """
    if isinstance(raw, Expr):
        return raw
    if type(raw) is int or type(raw) is str:
        cached = _LEAVES.get(raw)
        if cached is not None:
            return cached
    parser = _Parser()
    node, dirs, divisor = parser.node(raw, "", 0)
    expr = _build(node, dirs, divisor, parser.divisors)
    if isinstance(node, int | str) and len(_LEAVES) < _MAX_CACHED_LEAVES:
        # NOTE: Expr is immutable, so one object per constant or var name can be shared.
        _LEAVES[node] = expr
    return expr


_MAX_CACHED_LEAVES: Final = 4096
_LEAVES: dict[int | str, Expr] = {}
