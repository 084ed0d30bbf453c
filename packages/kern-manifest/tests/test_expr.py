"""kern_manifest.expr: parsing, evaluation, exact ranges, divisibility."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kern_manifest import OPERATORS, Expr, ExprError, ManifestParse, parse_expr

VARS = ("a", "b", "c")


def _exprs(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    leaves = st.one_of(st.integers(0, 40), st.sampled_from(VARS))

    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        binary = st.tuples(st.sampled_from(("add", "mul", "min", "max")), children, children)
        divide = st.tuples(st.just("ceil_div"), children, st.one_of(st.integers(1, 9), children))
        return st.one_of(binary, divide).map(lambda t: {t[0]: [t[1], t[2]]})

    return st.recursive(leaves, extend, max_leaves=max_leaves)


def _bounds() -> st.SearchStrategy[dict[str, tuple[int, int]]]:
    span = st.tuples(st.integers(1, 5), st.integers(0, 4)).map(lambda t: (t[0], t[0] + t[1]))
    return st.fixed_dictionaries({v: span for v in VARS})


def _points(bounds: dict[str, tuple[int, int]], names: frozenset[str]) -> list[dict[str, int]]:
    ordered = sorted(names)
    spans = [range(bounds[n][0], bounds[n][1] + 1) for n in ordered]
    return [dict(zip(ordered, values, strict=True)) for values in itertools.product(*spans)]


def _parse(raw: Any) -> Expr:
    """Parses a generated expression; constant zero divisors are rejected by design."""
    try:
        return parse_expr(raw)
    except ManifestParse:
        assume(False)
        raise


def _values(expr: Expr, bounds: dict[str, tuple[int, int]]) -> list[int] | None:
    try:
        return [expr.eval(p) for p in _points(bounds, expr.vars)]
    except ExprError:
        return None


@settings(max_examples=300, deadline=None)
@given(_exprs(), _bounds())
def test_range_is_exact_over_the_box(raw: Any, bounds: dict[str, tuple[int, int]]) -> None:
    expr = _parse(raw)
    values = _values(expr, bounds)
    try:
        lo, hi = expr.range(bounds)
    except ExprError:
        # NOTE: range refuses exactly when some divisor is 0 somewhere in the box.
        assert values is None
        return
    assert values is not None
    assert (lo, hi) == (min(values), max(values))


@settings(max_examples=200, deadline=None)
@given(_exprs(), _bounds())
def test_every_value_is_a_multiple_of_divisor(raw: Any, bounds: dict[str, tuple[int, int]]) -> None:
    expr = _parse(raw)
    values = _values(expr, bounds) or []
    for v in values:
        assert (v == 0) if expr.divisor == 0 else v % expr.divisor == 0


@settings(max_examples=200, deadline=None)
@given(_exprs())
def test_json_round_trip(raw: Any) -> None:
    expr = _parse(raw)
    assert expr.to_json() == raw
    assert parse_expr(expr.to_json()) == expr


@pytest.mark.parametrize(
    ("raw", "env", "value"),
    [
        (7, {}, 7),
        ("t", {"t": 5}, 5),
        ({"add": ["t", 3]}, {"t": 5}, 8),
        ({"mul": ["t", "t"]}, {"t": 5}, 25),
        ({"ceil_div": ["t", 4]}, {"t": 5}, 2),
        ({"ceil_div": ["t", 4]}, {"t": 8}, 2),
        ({"min": ["t", 3]}, {"t": 5}, 3),
        ({"max": ["t", 3]}, {"t": 5}, 5),
        ({"mul": [{"ceil_div": ["t", 16]}, {"add": ["s", 1]}]}, {"t": 17, "s": 2}, 6),
    ],
)
def test_eval(raw: Any, env: dict[str, int], value: int) -> None:
    assert parse_expr(raw).eval(env) == value


def test_constant_folds_and_vars_are_collected() -> None:
    assert parse_expr({"add": [2, {"mul": [3, 4]}]}).const == 14
    e = parse_expr({"max": ["t", {"ceil_div": ["s", "t"]}]})
    assert e.const is None and e.vars == frozenset({"s", "t"})
    assert Expr.of("t") == parse_expr("t") and Expr.of(3).const == 3


def test_range_with_var_on_both_sides_of_a_division_is_exact() -> None:
    e = parse_expr({"ceil_div": ["t", "t"]})
    assert e.range({"t": (1, 100)}) == (1, 1)
    f = parse_expr({"add": ["t", {"ceil_div": [100, "t"]}]})
    assert f.range({"t": (1, 100)}) == (20, 101)


@pytest.mark.parametrize(
    ("raw", "bounds", "message"),
    [
        ("t", {}, "no bounds for var 't'"),
        ("t", {"t": (3, 2)}, "bad bounds"),
        ({"ceil_div": [4, {"min": ["t", 0]}]}, {"t": (1, 4)}, "can be 0"),
        ({"ceil_div": ["t", "t"]}, {"t": (1, 1 << 20)}, "both sides"),
    ],
)
def test_range_errors(raw: Any, bounds: dict[str, tuple[int, int]], message: str) -> None:
    with pytest.raises(ExprError, match=message):
        parse_expr(raw).range(bounds)


def test_eval_errors() -> None:
    with pytest.raises(ExprError, match="unknown var 'u'"):
        parse_expr({"add": ["t", "u"]}).eval({"t": 1})
    with pytest.raises(ExprError, match="division by zero"):
        parse_expr({"ceil_div": [4, "t"]}).eval({"t": 0})


@pytest.mark.parametrize(
    ("raw", "pointer"),
    [
        (True, ""),
        (-1, ""),
        (1 << 63, ""),
        (1.5, ""),
        ("", ""),
        (None, ""),
        ([1, 2], ""),
        ({}, ""),
        ({"sub": [1, 2]}, ""),
        ({"add": [1, 2], "mul": [1, 2]}, ""),
        ({"add": [1]}, "/add"),
        ({"add": "t"}, "/add"),
        ({"add": [1, {"mul": ["t", -2]}]}, "/add/1/mul/1"),
        ({"ceil_div": ["t", 0]}, "/ceil_div/1"),
        ({"ceil_div": ["t", {"mul": [0, 5]}]}, "/ceil_div/1"),
    ],
)
def test_parse_errors_point_inside_the_expression(raw: Any, pointer: str) -> None:
    with pytest.raises(ManifestParse) as info:
        parse_expr(raw)
    assert info.value.pointer == pointer
    assert info.value.hint


def test_deep_nesting_is_a_parse_error_not_a_crash() -> None:
    raw: Any = "t"
    for _ in range(5000):
        raw = {"add": [raw, 1]}
    with pytest.raises(ManifestParse, match="nested deeper"):
        parse_expr(raw)


def test_operators_listed() -> None:
    assert OPERATORS == ("add", "mul", "ceil_div", "min", "max")
