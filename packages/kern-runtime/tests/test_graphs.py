"""Var normalization for graph keys, and the graph cache's decisions."""

from __future__ import annotations

import pytest

from kern_runtime import ApiError, GraphCache, GraphCacheStats, normalize_vars

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


def _key(n: int) -> tuple[tuple[str, int], ...]:
    return (("tokens", n),)


def test_a_key_is_captured_on_its_second_use_and_hit_after() -> None:
    cache: GraphCache[str] = GraphCache(2)
    assert cache.lookup(_key(8)) is None and not cache.wants(_key(8))  # first sight: eager
    assert cache.lookup(_key(8)) is None and cache.wants(_key(8))  # second: capture
    assert cache.insert(_key(8), "g8") is None
    assert cache.lookup(_key(8)) == "g8"
    assert cache.stats() == GraphCacheStats(limit=2, cached=1, hits=1, eager=1, captures=1, evictions=0)


def test_the_least_recently_used_graph_leaves_first() -> None:
    cache: GraphCache[str] = GraphCache(2)
    for n in (8, 9):
        cache.wants(_key(n))
        cache.wants(_key(n))
        cache.insert(_key(n), f"g{n}")
    assert cache.lookup(_key(8)) == "g8"  # 9 is now the coldest
    cache.wants(_key(10))
    assert cache.wants(_key(10))
    assert cache.insert(_key(10), "g10") == "g9"
    assert cache.lookup(_key(9)) is None and cache.lookup(_key(8)) == "g8"
    assert not cache.wants(_key(9))  # a displaced key starts over: eager, then captured
    s = cache.stats()
    assert (s.cached, s.captures, s.evictions) == (2, 3, 1)
    assert sorted(cache.drain()) == ["g10", "g8"]
    assert cache.stats().cached == 0 and not cache.wants(_key(8))  # drained: nothing remembered


def test_keys_seen_once_are_remembered_up_to_four_times_the_limit() -> None:
    cache: GraphCache[str] = GraphCache(1)
    for n in range(1, 6):  # 5 first sights: the oldest (1) is forgotten
        assert not cache.wants(_key(n))
    assert not cache.wants(_key(1))
    assert cache.wants(_key(5))


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_a_cache_holds_at_least_one_graph(limit: object) -> None:
    with pytest.raises(ApiError, match="at least 1 graph"):
        GraphCache(limit)  # type: ignore[arg-type]


def test_a_key_cannot_be_cached_twice() -> None:
    cache: GraphCache[str] = GraphCache(2)
    cache.insert(_key(8), "a")
    with pytest.raises(ApiError, match="cached already"):
        cache.insert(_key(8), "b")
    assert cache.lookup(_key(8)) == "a"
