"""The free set of one kind: lowest-numbered first across its 64-id blocks, exact counts, and the
ids a remap retires never handed out (against a sorted-set model)."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from kern_pool._kinds import Kind, Status


def _kind(limit: int) -> Kind:
    k = Kind(range(1), limit)
    for i in range(limit):
        k.arrive(i)
    return k


def test_whole_blocks_and_partial_blocks_come_out_lowest_first() -> None:
    k = _kind(200)
    assert k.take(130) == list(range(130))  # two whole blocks, then 2 ids of the third
    k.give([5, 64, 127, 3])
    assert k.take(3) == [3, 5, 64]
    assert k.take(2) == [127, 130]
    assert (k.free, k.held) == (200 - 131, 131)
    assert all(k.state[i] == Status.HELD for i in range(131))


def test_retired_ids_are_not_taken_and_return_when_they_arrive() -> None:
    k = _kind(70)
    k.retire(0)
    k.retire(65)
    assert k.free == 68 and k.state[0] == Status.LEAVING
    assert k.take(66) == [i for i in range(68) if i not in (0, 65)]
    k.arrive(0)
    assert k.take(1) == [0]


@given(st.integers(1, 300), st.lists(st.tuples(st.sampled_from("tgr"), st.integers(0, 10**6)), max_size=60))
def test_matches_a_sorted_set(limit: int, ops: list[tuple[str, int]]) -> None:
    k = _kind(limit)
    free, held = set(range(limit)), set[int]()
    for op, x in ops:
        if op == "t" and free:
            n = 1 + x % len(free)
            want = sorted(free)[:n]
            assert k.take(n) == want
            free -= set(want)
            held |= set(want)
        elif op == "g" and held:
            back = sorted(held)[x % len(held) :: 3]
            k.give(back)
            held -= set(back)
            free |= set(back)
        elif op == "r" and free:
            i = sorted(free)[x % len(free)]
            k.retire(i)
            free.discard(i)
        assert (k.free, k.held) == (len(free), len(held))
    assert sorted(i for i in range(limit) if k.state[i] == Status.FREE) == sorted(free)
