from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kern_mining.fit import Fit, fit_samples

TS = (1, 7, 34, 85, 175, 256, 512)


def samples(f: Fit, ts: tuple[int, ...] = TS) -> list[tuple[int | None, int]]:
    return [(t, f.evaluate(t)) for t in ts]


@pytest.mark.parametrize(
    "fit",
    [
        Fit("const", c=5),
        Fit("tokens"),
        Fit("mul", a=32),
        Fit("affine", a=1, b=7),
        Fit("affine", a=3, b=-1),
        Fit("ceil_div", c=64),
        Fit("mul_ceil_div", a=2, c=16),
        Fit("ceil_div_mul", a=3, c=4),
    ],
)
def test_each_form_is_recovered_exactly(fit: Fit) -> None:
    assert fit_samples(samples(fit)) == fit


def test_two_distinct_token_counts_fix_a_constant_but_nothing_else() -> None:
    assert fit_samples([(1, 9), (7, 9)]) == Fit("const", c=9)
    assert fit_samples([(1, 1), (7, 7)]).form == "underdetermined"
    assert fit_samples([(1, 9), (1, 9)]).form == "underdetermined"


def test_a_value_that_is_not_a_function_of_tokens_is_unfit() -> None:
    assert fit_samples([(1, 3), (1, 4), (7, 5)]).form == "unfit"


def test_a_function_outside_the_forms_is_unfit() -> None:
    assert fit_samples([(t, t * t) for t in TS]).form == "unfit"


def test_forwards_of_unknown_token_count_do_not_block_a_fit() -> None:
    data = [*samples(Fit("mul", a=8)), (None, 12345)]
    assert fit_samples(data) == Fit("mul", a=8)
    assert fit_samples([(1, 3), (2, 3), (None, 4)]).form == "underdetermined"


def test_without_tokens_only_a_constant_is_decided() -> None:
    assert fit_samples([(None, 4), (None, 4)]) == Fit("const", c=4)
    assert fit_samples([(None, 4), (None, 5)]).form == "underdetermined"
    assert fit_samples([]).form == "underdetermined"


def test_the_smallest_divisor_wins_when_larger_ones_also_fit() -> None:
    # ceil(767*t/1024) agrees with ceil(3*t/4) on these samples; the simpler form is taken.
    assert fit_samples(samples(Fit("ceil_div_mul", a=3, c=4))) == Fit("ceil_div_mul", a=3, c=4)
    assert fit_samples([(8, 3), (16, 6), (24, 9)]) == Fit("mul_ceil_div", a=3, c=8)


def test_render_and_json() -> None:
    assert Fit("ceil_div_mul", a=3, c=4).render() == "ceil(3*t/4)"
    assert Fit("affine", a=2, b=-3).render() == "2*t-3"
    assert Fit("mul", a=8).to_json() == {"form": "mul", "a": 8, "b": None, "c": None}
    with pytest.raises(ValueError):
        Fit("unfit").evaluate(3)


forms = st.one_of(
    st.integers(1, 4096).map(lambda c: Fit("const", c=c)),
    st.just(Fit("tokens")),
    st.integers(2, 64).map(lambda a: Fit("mul", a=a)),
    st.tuples(st.integers(1, 8), st.integers(1, 100)).map(
        lambda ab: Fit("affine", a=ab[0], b=ab[1])
    ),
    st.integers(1, 8).map(lambda k: Fit("ceil_div", c=2**k)),
    st.tuples(st.integers(2, 8), st.integers(1, 8)).map(
        lambda ac: Fit("mul_ceil_div", a=ac[0], c=2 ** ac[1])
    ),
)


@given(forms, st.sets(st.integers(1, 4096), min_size=3, max_size=12))
def test_a_decided_fit_reproduces_every_sample(fit: Fit, ts: set[int]) -> None:
    data = [(t, fit.evaluate(t)) for t in sorted(ts)]
    got = fit_samples(data)
    assert got.form != "unfit"
    if got.decided:
        assert all(got.evaluate(t) == y for t, y in data)


@given(st.integers(1, 8), st.sets(st.integers(1, 4096), min_size=3, max_size=12))
def test_ceil_div_is_found_when_the_samples_reach_past_the_divisor(k: int, ts: set[int]) -> None:
    c = 2**k
    data = [(t, math.ceil(t / c)) for t in sorted(ts)]
    if len({y for _, y in data}) > 1 and not all(t == y for t, y in data):
        assert fit_samples(data).decided
