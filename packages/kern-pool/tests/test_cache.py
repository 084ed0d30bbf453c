"""The KV-cache manager (kern_pool.cache): the pure reuse decisions, and KVCache over a bare pool
(PoolDevice) in exact orders: what a turn reuses, the lease it gets, the room it makes by parking
or dropping the coldest entry, the woken prefix kept, the counters. The random orders are
test_engine_patterns.py's machine."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kern_pool import (
    CacheFull,
    ExceedsPool,
    Host,
    KVCache,
    PagedState,
    Pool,
    PoolConfig,
    PoolDevice,
    Reuse,
    Source,
    Tier,
    lease_tokens,
    pick_reuse,
    shared_prefix,
)


def test_pick_reuse_prefers_the_longest_then_resident_then_live_then_parked() -> None:
    assert pick_reuse(None, []) == Reuse(Source.FRESH, 0)
    assert pick_reuse((32, Tier.RESIDENT), [(4, 20)]) == Reuse(Source.RESIDENT, 32)
    assert pick_reuse((32, Tier.RESIDENT), [(4, 40)]) == Reuse(Source.FORK, 40, 4)
    assert pick_reuse((32, Tier.RESIDENT), [(4, 32)]) == Reuse(Source.RESIDENT, 32)
    assert pick_reuse((32, Tier.PARKED), [(4, 32), (5, 32)]) == Reuse(Source.FORK, 32, 4)
    assert pick_reuse((33, Tier.PARKED), [(4, 32)]) == Reuse(Source.PARKED, 33)
    assert pick_reuse(None, [(4, 0)]) == Reuse(Source.FRESH, 0)
    assert pick_reuse((40, Tier.RESIDENT), [], own=(7, 40)) == Reuse(Source.CONTINUE, 40, 7)
    assert pick_reuse((41, Tier.RESIDENT), [], own=(7, 40)) == Reuse(Source.RESIDENT, 41)


def test_shared_prefix_never_covers_the_last_prompt_token() -> None:
    assert shared_prefix([1, 2, 3], [1, 2, 3], False) == 2
    assert shared_prefix([1, 2, 3], [1, 2, 3, 4], False) == 3
    assert shared_prefix([1, 2, 3], [1, 9, 3, 4], False) == 1
    assert shared_prefix([1, 2, 3], [1, 2, 5, 4], True) == 0  # a stateful sequence only whole
    assert shared_prefix([1, 2, 3], [1, 2, 3, 4], True) == 3
    assert shared_prefix(list(range(1000)), [*range(777), -1, 5], False) == 777
    assert shared_prefix([1, 2], [], False) == 0 and shared_prefix([1, 2], [1], False) == 0
    assert shared_prefix([], [1, 2], True) == 0 and shared_prefix([], [], False) == 0


@given(st.lists(st.integers(0, 2), max_size=80), st.lists(st.integers(0, 2), max_size=80), st.booleans())
@settings(max_examples=300, deadline=None)
def test_shared_prefix_is_the_common_prefix_with_the_prompt_but_its_last_token(
        kept: list[int], prompt: list[int], stateful: bool) -> None:
    n = 0
    while n < min(len(kept), len(prompt) - 1) and kept[n] == prompt[n]:
        n += 1
    assert shared_prefix(kept, prompt, stateful) == (0 if stateful and n != len(kept) else n)


def test_lease_tokens_hold_the_prompt_and_the_steps_after_it() -> None:
    assert lease_tokens(37, 9) == 45 and lease_tokens(37, 1) == 37 and lease_tokens(1, 1) == 1



def _cache(host_units: int = 0, chunks: int = 4) -> tuple[KVCache, Pool]:
    """16-token pages, 4 pages a chunk, `chunks` chunks (16 pages), a host tier of `host_units`."""
    pool, _ = Pool.create(PoolConfig((PagedState("kv", 1),), (), unit=16, row_pages=64, chunk=64, chunks=chunks))
    host = Host(pool, host_units, 1, 1) if host_units else None
    return KVCache(PoolDevice(pool, host), park=host is not None), pool


def _turn(cache: KVCache, prompt: list[int], need: int) -> tuple[Reuse, object]:
    d, hit = cache.decide(prompt, ())
    return d, cache.acquire(d, hit, need)


def test_a_retired_turn_is_reused_resident_at_its_length() -> None:
    cache, pool = _cache()
    d, lease = _turn(cache, list(range(40)), 48)
    assert d == Reuse(Source.FRESH, 0)
    cache.retire(lease, list(range(40)))  # type: ignore[arg-type]
    assert cache.prefix.entries() == [(tuple(range(40)), True, False)]
    d, again = _turn(cache, [*range(40), 99, 98], 60)
    assert d == Reuse(Source.RESIDENT, 40) and again.prefix == 40  # type: ignore[attr-defined]
    assert cache.cached([*range(40), 7], ()) == 40 and cache.cached([*range(10), 7], [list(range(12))]) == 10
    again.release()  # type: ignore[attr-defined]
    cache.clear()
    assert pool.pages_used == 0


def test_a_busy_pool_parks_the_coldest_entry_then_wakes_it_into_the_lease_and_keeps_it_resident() -> None:
    cache, pool = _cache(host_units=8)
    for first in (0, 100):
        _, lease = _turn(cache, list(range(first, first + 64)), 64)
        cache.retire(lease, list(range(first, first + 64)))  # type: ignore[arg-type]
    cache.prefix.lookup([*range(100, 164), 1])  # NOTE: the second entry is the warmer one
    _, big = _turn(cache, list(range(500, 564)), 12 * 16)  # 12 of the 16 pages: one entry must go
    assert cache.counters.parks == 1 and cache.counters.evictions == 1
    assert cache.prefix.entries() == [(tuple(range(64)), False, True), (tuple(range(100, 164)), True, False)]
    big.release()  # type: ignore[attr-defined]
    d, woken = _turn(cache, [*range(64), 5], 80)
    assert d == Reuse(Source.PARKED, 64) and cache.counters.wakes == 1 and woken.prefix == 64  # type: ignore[attr-defined]
    kept = cache.keep_woken(woken, list(range(64)))  # type: ignore[arg-type]
    assert kept is not None and kept.live
    assert (tuple(range(64)), True, True) in cache.prefix.entries()
    woken.release()  # type: ignore[attr-defined]
    cache.clear()
    assert (pool.pages_used, pool.slots_used) == (0, 0)


def test_without_a_host_the_coldest_entry_is_dropped_and_nothing_left_is_cache_full() -> None:
    cache, pool = _cache(chunks=2)
    _, lease = _turn(cache, list(range(64)), 64)
    cache.retire(lease, list(range(64)))  # type: ignore[arg-type]
    _, held = _turn(cache, list(range(100, 164)), 128)  # every page: the entry is dropped
    assert cache.counters.dropped == 1 and cache.prefix.entries() == []
    with pytest.raises(CacheFull, match=r"^busy: 1 page\(s\) and 0 slot\(s\) not free"):
        cache.room(lambda: pool.lease(16))
    assert cache.keep_woken(held, list(range(100, 120))) is None  # type: ignore[arg-type]
    with pytest.raises(ExceedsPool):
        cache.room(lambda: pool.lease(16 * 64))
    held.release()  # type: ignore[attr-defined]
    assert pool.pages_used == 0


def test_retiring_an_empty_key_releases_the_lease() -> None:
    cache, pool = _cache()
    _, lease = _turn(cache, [1, 2, 3], 16)
    cache.retire(lease, [])  # type: ignore[arg-type]
    assert pool.pages_used == 0 and cache.prefix.entries() == []
