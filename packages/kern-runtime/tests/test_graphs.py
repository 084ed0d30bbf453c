"""Var normalization for graph keys."""

from __future__ import annotations

import pytest

from kern_runtime import ApiError, normalize_vars

BOUNDS = {"tokens": 4096, "seqs": 8, "span": 16}


def test_unread_vars_drop_out_of_the_key() -> None:
    reads = frozenset({"tokens"})
    a = normalize_vars("decode", BOUNDS, reads, {"tokens": 1})
    b = normalize_vars("decode", BOUNDS, reads, {"tokens": 1, "seqs": 7, "span": 3})
    assert a == b == (("tokens", 1),)


def test_key_is_sorted_by_name() -> None:
    key = normalize_vars("p", BOUNDS, frozenset({"tokens", "seqs"}), {"tokens": 5, "seqs": 2})
    assert key == (("seqs", 2), ("tokens", 5))


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({}, "reads var 'tokens'"),
        ({"tokens": 0}, "outside 1..4096"),
        ({"tokens": 4097}, "outside 1..4096"),
        ({"tokens": True}, "outside"),
        ({"tokens": 2.0}, "outside"),
        ({"tokens": 1, "tokenz": 1}, "unknown var 'tokenz'"),
    ],
)
def test_bad_vars_are_api_errors(given: dict[str, int], match: str) -> None:
    with pytest.raises(ApiError, match=match):
        normalize_vars("decode", BOUNDS, frozenset({"tokens"}), given)
