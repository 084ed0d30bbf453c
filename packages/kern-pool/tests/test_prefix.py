"""The prefix index against a brute-force model, plus exact scenarios."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kern_pool import ApiError, Evicted, Prefix, Tier, common_prefix

UNIT = 4


class Val:
    """A stored value that records its release."""

    __slots__ = ("length", "name", "released", "stateful")

    def __init__(self, length: int, stateful: bool, name: str) -> None:
        self.length = length
        self.stateful = stateful
        self.name = name
        self.released = False

    def release(self) -> None:
        assert not self.released, f"{self.name} released twice"
        self.released = True

    def __repr__(self) -> str:
        return self.name


@dataclass
class Entry:
    stateful: bool
    resident: Val | None
    parked: Val | None
    stamp: int = 0


def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class Model:
    """Plain dict-of-entries reference: linear scans for everything."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, ...], Entry] = {}
        self.tick = 0

    def stamp_path(self, key: tuple[int, ...]) -> None:
        for n in range(len(key), 0, -1):
            e = self.entries.get(key[:n])
            if e is not None:
                self.tick += 1
                e.stamp = self.tick

    def usable(self, key: tuple[int, ...], q: tuple[int, ...]) -> int:
        e = self.entries[key]
        if key == q[: len(key)]:
            return len(key)
        return 0 if e.stateful else _lcp(key, q) // UNIT * UNIT

    def best(self, prompt: tuple[int, ...]) -> tuple[int, int]:
        q = prompt[:-1]
        best = (0, -1)
        for key, e in self.entries.items():
            length = self.usable(key, q)
            if length:
                best = max(best, (length, 1 if e.resident is not None else 0))
        return best

    def coldest(self, resident: bool) -> tuple[int, ...] | None:
        def has(e: Entry) -> bool:
            return (e.resident if resident else e.parked) is not None

        leaves = [
            k
            for k, e in self.entries.items()
            if has(e) and not any(len(o) > len(k) and o[: len(k)] == k and has(f) for o, f in self.entries.items())
        ]
        return min(leaves, key=lambda k: self.entries[k].stamp, default=None)

    def drop(self, key: tuple[int, ...], resident: bool) -> None:
        e = self.entries[key]
        if resident:
            e.resident = None
        else:
            e.parked = None
        if e.resident is None and e.parked is None:
            del self.entries[key]


Shape = tuple[tuple[int, ...], bool, tuple[tuple[int, ...], ...], bool]


def _shape(ev: Evicted[Val, Val] | None) -> Shape | None:
    """An eviction without its values: (key, parked?, dropped keys, parked now?); checks the record."""
    if ev is None:
        return None
    assert ev.value.released and ev.stateful == ev.value.stateful and len(ev.dropped) == len(ev.dropped_values)
    assert all(v.released and v.length == len(k) for k, v in zip(ev.dropped, ev.dropped_values, strict=True))
    assert ev.tier is (Tier.PARKED if ev.parked is not None else None)
    assert ev.parked is None or (not ev.parked.released and ev.parked.length == len(ev.key))
    return ev.key, ev.parked is not None, ev.dropped, ev.parked_now


keys = st.lists(st.integers(0, 1), min_size=1, max_size=12).map(tuple)


class PrefixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.trees: list[Prefix[Val, Val]] = [Prefix(UNIT), Prefix(UNIT)]
        self.model = Model()
        self.values: list[Val] = []
        self.host_room = 0
        self.n = 0
        self.last_parked: list[Val | None] = [None, None]

    def new(self, length: int, stateful: bool) -> list[Val]:
        self.n += 1
        pair = [Val(length, stateful, f"v{self.n}{side}") for side in "ab"]
        self.values += pair
        return pair

    @rule(key=keys, stateful=st.booleans())
    def insert(self, key: tuple[int, ...], stateful: bool) -> None:
        self.insert_both(key, stateful)

    def insert_both(self, key: tuple[int, ...], stateful: bool) -> None:
        pair = self.new(len(key), stateful)
        old = self.model.entries.get(key)
        if old is not None and old.stateful != stateful:
            for tree, v in zip(self.trees, pair, strict=True):
                with pytest.raises(ApiError):
                    tree.insert(key, v)
                v.release()  # refused: still ours
            return
        kept = [tree.insert(key, v) for tree, v in zip(self.trees, pair, strict=True)]
        assert kept[0] == kept[1] == (old is None or old.resident is None)
        if not kept[0]:
            assert pair[0].released and pair[1].released
            self.model.stamp_path(key)
            return
        if old is None:
            old = self.model.entries[key] = Entry(stateful, None, None)
        old.resident = pair[0]
        self.model.stamp_path(key)
        shorter = self.model.entries.get(key[:-UNIT]) if len(key) > UNIT and not stateful else None
        if shorter is not None and not shorter.stateful and shorter.resident is not None and shorter.parked is None:
            assert shorter.resident.released
            self.model.drop(key[:-UNIT], True)

    @rule(prompt=st.lists(st.integers(0, 1), min_size=1, max_size=14).map(tuple))
    def lookup(self, prompt: tuple[int, ...]) -> None:
        self.lookup_both(prompt)

    def lookup_both(self, prompt: tuple[int, ...]) -> None:
        hits = [tree.lookup(prompt) for tree in self.trees]
        expect = self.model.best(prompt)
        if expect[0] == 0:
            assert hits == [None, None]
            return
        a, b = hits
        assert a is not None and b is not None
        assert (a.length, a.key, a.tier) == (b.length, b.key, b.tier)
        assert (a.length, 1 if a.tier is Tier.RESIDENT else 0) == expect
        entry = self.model.entries[a.key]
        assert self.model.usable(a.key, prompt[:-1]) == a.length
        assert (a.resident if a.tier is Tier.RESIDENT else a.parked) is (
            entry.resident if a.tier is Tier.RESIDENT else entry.parked
        )
        self.model.stamp_path(a.key)

    @rule(room=st.integers(0, 3), host=st.booleans(), boom=st.integers(0, 15))
    def evict(self, room: int, host: bool, boom: int) -> None:
        self.host_room = room
        coldest = self.model.coldest(True)
        leaving = [self.model.entries[coldest].resident if coldest else None]
        expect = self._expect_evict(host, boom == 0)
        outs: list[Any] = []
        for side, tree in enumerate(self.trees):
            try:
                outs.append(_shape(tree.evict(self._parker(side, boom == 0) if host else None)))
            except RuntimeError as exc:
                outs.append(str(exc))
        assert outs[0] == outs[1] == expect
        if isinstance(expect, tuple) and expect[1] and expect[3]:
            assert self.last_parked[0] is not None
            self.model.entries[expect[0]].parked = self.last_parked[0]
        if isinstance(expect, tuple):
            assert leaving[0] is not None and leaving[0].released
        self.last_parked = [None, None]

    def _parker(self, side: int, boom: bool) -> Any:
        def park(value: Val) -> Val | None:
            if boom:
                raise RuntimeError("copy failed")
            parked = sum(1 for e in self.trees[side].entries() if e[2])
            if parked >= self.host_room:
                return None
            parked = Val(value.length, value.stateful, value.name + "p")
            self.values.append(parked)
            self.last_parked[side] = parked
            return parked

        return park

    def _expect_evict(self, host: bool, boom: bool) -> Shape | str | None:
        m = self.model
        key = m.coldest(True)
        if key is None:
            return None
        e = m.entries[key]
        if e.parked is not None or not host:
            had = e.parked is not None
            m.drop(key, True)
            return (key, had, (), False)
        if boom:
            m.drop(key, True)
            return "copy failed"
        dropped: list[tuple[int, ...]] = []
        while sum(1 for f in m.entries.values() if f.parked is not None) >= self.host_room:
            victim = m.coldest(False)
            if victim is None:
                m.drop(key, True)
                return (key, False, tuple(dropped), False)
            dropped.append(victim)
            m.drop(victim, False)
        assert e.resident is not None
        e.parked = Val(len(key), e.stateful, "placeholder")  # the tree's parked value replaces it
        m.drop(key, True)
        return (key, True, tuple(dropped), True)

    @invariant()
    def agree(self) -> None:
        expect = sorted((k, e.resident is not None, e.parked is not None) for k, e in self.model.entries.items())
        for tree in self.trees:
            assert tree.entries() == expect
            assert tree.count(Tier.RESIDENT) == sum(1 for x in expect if x[1])
            assert tree.count(Tier.PARKED) == sum(1 for x in expect if x[2])
        for e in self.model.entries.values():
            assert e.resident is None or not e.resident.released

    def teardown(self) -> None:
        for tree in self.trees:
            tree.clear()
            assert tree.entries() == []
        assert all(v.released for v in self.values)


TestPrefixModel = PrefixMachine.TestCase
TestPrefixModel.settings = settings(
    max_examples=70, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

BIG = 2**64
"""The first id past unsigned 64 bits: edges holding it are matched as tuples, the rest by their ids."""
wide_ids = st.sampled_from([0, 1, BIG, BIG + 1])
wide_keys = st.lists(wide_ids, min_size=1, max_size=12).map(tuple)


class WidePrefixMachine(PrefixMachine):
    """The same model over ids past 64 bits beside small ones (in keys, prompts or both), each
    prompt also passed as a list of new int objects (equal ids, never the same objects)."""

    @rule(key=wide_keys, stateful=st.booleans())
    def insert(self, key: tuple[int, ...], stateful: bool) -> None:
        self.insert_both(key, stateful)

    @rule(prompt=st.lists(wide_ids, min_size=1, max_size=14).map(tuple))
    def lookup(self, prompt: tuple[int, ...]) -> None:
        self.lookup_both(prompt)
        hits = [tree.lookup([int(str(t)) for t in prompt]) for tree in self.trees]
        got = [(h.length, 1 if h.tier is Tier.RESIDENT else 0, h.key) if h else None for h in hits]
        assert got[0] == got[1] and (got[0][:2] if got[0] else (0, -1)) == self.model.best(prompt)
        if got[0] is not None:
            self.model.stamp_path(got[0][2])


TestWidePrefixModel = WidePrefixMachine.TestCase
TestWidePrefixModel.settings = settings(
    max_examples=50, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# ---- scenarios ---------------------------------------------------------------------------


@given(st.lists(st.integers(0, 1), max_size=300), st.lists(st.integers(0, 1), max_size=300),
       st.sampled_from(["list", "tuple", "ids"]))
@settings(max_examples=400, deadline=None)
def test_common_prefix_is_where_two_sequences_part(a: list[int], b: list[int], kind: str) -> None:
    n = _lcp(tuple(a), tuple(b))
    same = [*a[:150], *b[150:]] if len(a) >= 150 else b  # long common prefixes too
    wrap: Any = {"list": list, "tuple": tuple, "ids": lambda x: array("Q", x)}[kind]
    assert common_prefix(wrap(a), wrap(b)) == n
    assert common_prefix(wrap(a), wrap(same)) == _lcp(tuple(a), tuple(same))


def test_common_prefix_where_windows_end() -> None:
    key = list(range(20_000))
    for cut in (0, 1, 31, 32, 33, 95, 96, 97, 4_000, 19_999):
        other = [*key[:cut], -1, *key[cut + 1 :]]
        assert common_prefix(key, other) == cut and common_prefix(tuple(other), tuple(key)) == cut
    assert common_prefix(key, key[:12_345]) == 12_345 and common_prefix(key, list(key)) == 20_000
    assert common_prefix([], key) == 0 and common_prefix((), ()) == 0


def _tree() -> Prefix[Val, Val]:
    return Prefix(2)


def test_never_the_last_token_and_partial_pages() -> None:
    tree = _tree()
    v = Val(4, False, "a")
    tree.insert((1, 2, 3, 4), v)
    hit = tree.lookup((1, 2, 3, 4))
    assert hit is not None and (hit.length, hit.key, hit.resident) == (2, (1, 2, 3, 4), v)
    hit = tree.lookup((1, 2, 3, 4, 5))
    assert hit is not None and hit.length == 4
    assert tree.lookup((1,)) is None
    assert tree.lookup((1, 9, 9)) is None  # one shared token is not a whole page


def test_a_long_edge_matches_up_to_where_the_prompt_leaves_it() -> None:
    tree: Prefix[Val, Val] = Prefix(16)
    key = tuple(range(1000, 15_000))
    v = Val(len(key), False, "k")
    tree.insert(key, v)
    for cut in (0, 1, 15, 16, 17, 8_000, 13_999):
        hit = tree.lookup([*key[:cut], 7, *key[cut + 1 :], 5])  # leaves the key at `cut`
        assert (hit.length if hit else 0) == cut // 16 * 16
    hit = tree.lookup(key[:100])  # ends inside page 6: the whole pages before token 99
    assert hit is not None and (hit.length, hit.key) == (96, key)
    hit = tree.lookup([int(str(t)) for t in (*key, 5)])  # new int objects, equal ids
    assert hit is not None and (hit.length, hit.resident) == (14_000, v)
    hit = tree.lookup(list(key))  # never the last token: 13,999 shared, 874 whole pages
    assert hit is not None and hit.length == 13_984


def test_ids_past_64_bits_are_ids_like_any_other() -> None:
    tree = _tree()
    a, b, c = Val(4, False, "a"), Val(4, False, "b"), Val(3, True, "c")
    tree.insert((1, BIG, 3, 4), a)
    tree.insert((1, BIG, 5, 6), b)  # splits the edge that holds BIG
    tree.insert((1, 2, 3), c)
    assert tree.entries() == [((1, 2, 3), True, False), ((1, BIG, 3, 4), True, False), ((1, BIG, 5, 6), True, False)]
    hit = tree.lookup((1, BIG, 3, 4, 9))
    assert hit is not None and (hit.length, hit.resident) == (4, a)
    hit = tree.lookup((1, BIG, 5, 9))
    assert hit is not None and hit.length == 2
    hit = tree.lookup((1, 2, 3, BIG + 5))
    assert hit is not None and (hit.length, hit.resident) == (3, c)
    assert tree.lookup((1, BIG + 1, 3, 4, 9)) is None
    tree.clear()
    assert tree.entries() == [] and a.released and b.released and c.released


def test_stateful_only_at_exact_length() -> None:
    tree = _tree()
    tree.insert((1, 2, 3), Val(3, True, "s"))
    hit = tree.lookup((1, 2, 3, 9))
    assert hit is not None and hit.length == 3
    assert tree.lookup((1, 2, 9, 9)) is None
    assert tree.lookup((1, 2, 3)) is None


def test_longest_wins_then_resident_beats_parked() -> None:
    tree = _tree()
    short, long = Val(2, False, "short"), Val(6, False, "long")
    tree.insert((1, 2), short)
    tree.insert((1, 2, 3, 4, 5, 6), long)
    assert _shape(tree.evict(lambda v: Val(v.length, v.stateful, "parked-long"))) == ((1, 2, 3, 4, 5, 6), True, (), True)
    hit = tree.lookup((1, 2, 3, 4, 5, 6, 7))
    assert hit is not None and (hit.length, hit.tier) == (6, Tier.PARKED)  # longer parked beats resident
    hit = tree.lookup((1, 2, 3, 9))
    assert hit is not None and (hit.length, hit.tier, hit.resident) == (2, Tier.RESIDENT, short)


def test_evict_takes_least_recent_leaf_first() -> None:
    tree = _tree()
    vals = {k: Val(len(k), True, str(k)) for k in [(1, 1), (1, 1, 2, 2), (3, 3), (3, 3, 4)]}
    for k, v in vals.items():
        tree.insert(k, v)
    tree.lookup((1, 1, 2, 2, 0))  # the (1, 1) chain is hit: (3, 3, 4) is now the coldest leaf
    order = [tree.evict(None) for _ in range(5)]
    assert [e.key if e else None for e in order] == [(3, 3, 4), (3, 3), (1, 1, 2, 2), (1, 1), None]
    assert all(v.released for v in vals.values())


def test_host_full_drops_the_coldest_parked_then_parks() -> None:
    tree = _tree()

    def park(v: Val) -> Val | None:  # a host with room for one parked entry
        return Val(v.length, v.stateful, v.name + "p") if tree.count(Tier.PARKED) < 1 else None

    a, b = Val(2, True, "a"), Val(2, True, "b")
    tree.insert((1, 1), a)
    tree.insert((2, 2), b)
    assert _shape(tree.evict(park)) == ((1, 1), True, (), True)
    assert a.released
    assert _shape(tree.evict(park)) == ((2, 2), True, ((1, 1),), True)
    assert tree.entries() == [((2, 2), False, True)]
    assert tree.evict(park) is None


def test_park_error_drops_the_entry_and_propagates() -> None:
    tree = _tree()
    v = Val(2, True, "v")
    tree.insert((5, 5), v)

    def broken(_: Val) -> Val | None:
        raise RuntimeError("device lost")

    with pytest.raises(RuntimeError, match="device lost"):
        tree.evict(broken)
    assert v.released and tree.entries() == []


def test_insert_duplicate_restamps_and_releases_the_new_value() -> None:
    tree = _tree()
    first, second = Val(2, False, "1"), Val(2, False, "2")
    assert tree.insert((1, 2), first)
    assert not tree.insert((1, 2), second)
    assert second.released and not first.released
    with pytest.raises(ApiError):
        tree.insert((1, 2), Val(2, True, "stateful twin"))
    with pytest.raises(ApiError):
        tree.insert((1, 2, 3), Val(2, False, "wrong length"))
    with pytest.raises(ApiError):
        tree.insert((), Val(0, False, "empty"))
    assert tree.entries() == [((1, 2), True, False)]


def test_a_stateless_entry_one_page_longer_replaces_the_shorter() -> None:
    tree = _tree()
    short, long = Val(2, False, "s"), Val(4, False, "l")
    tree.insert((1, 2), short)
    tree.insert((1, 2, 3, 4), long)
    assert short.released
    assert tree.entries() == [((1, 2, 3, 4), True, False)]


def test_parked_entry_becomes_resident_again() -> None:
    tree = _tree()
    tree.insert((1, 2), Val(2, True, "a"))
    tree.evict(lambda v: Val(v.length, v.stateful, "p"))
    assert tree.entries() == [((1, 2), False, True)]
    assert tree.insert((1, 2), Val(2, True, "again"))
    assert tree.entries() == [((1, 2), True, True)]
    assert _shape(tree.evict(lambda v: Val(v.length, v.stateful, "never"))) == ((1, 2), True, (), False)
    assert tree.entries() == [((1, 2), False, True)]


@pytest.mark.parametrize("unit", [0, -4, "x", 4.0, True, None])
def test_unit_must_be_a_positive_int(unit: object) -> None:
    with pytest.raises(ApiError, match=r"^Prefix unit must be a positive int"):
        Prefix(unit)  # type: ignore[arg-type]


def test_many_hits_keep_eviction_exact() -> None:
    tree = _tree()
    a, b = Val(2, True, "a"), Val(2, True, "b")
    tree.insert((1, 1), a)
    tree.insert((2, 2), b)
    for _ in range(300):  # stale heap items pile up and get compacted
        assert tree.lookup((1, 1, 0)) is not None
    assert _shape(tree.evict(None)) == ((2, 2), False, (), False)
    assert _shape(tree.evict(None)) == ((1, 1), False, (), False)
    assert a.released and b.released


# ---- misuse: ApiError, nothing changes ----------------------------------------------------


def _filled() -> tuple[Prefix[Val, Val], list[Val]]:
    tree = _tree()
    vals = [Val(2, False, "a"), Val(4, False, "b"), Val(3, True, "c")]
    tree.insert((1, 2), vals[0])
    tree.insert((3, 4, 5, 6), vals[1])
    tree.insert((1, 2, 7), vals[2])
    return tree, vals


def _state(tree: Prefix[Val, Val]) -> object:
    return tree.entries(), tree.count(Tier.RESIDENT), tree.count(Tier.PARKED)


def test_reinserting_the_held_value_under_its_key_is_a_no_op() -> None:
    tree, vals = _filled()
    before = _state(tree)
    assert tree.insert((1, 2), vals[0]) is False
    assert not vals[0].released and _state(tree) == before
    hit = tree.lookup((1, 2, 9))
    assert hit is not None and hit.resident is vals[0]
    # the re-stamp counts as a hit: (1, 2) is no longer the coldest leaf
    assert _shape(tree.evict(None)) == ((3, 4, 5, 6), False, (), False)


def test_a_held_value_under_another_key_or_tier_is_refused() -> None:
    tree, vals = _filled()
    tree.evict(lambda v: Val(v.length, v.stateful, v.name + "p"))  # (3, 4, 5, 6) is the coldest leaf
    before = _state(tree)
    with pytest.raises(ApiError, match="already held by the index"):
        tree.insert((1, 3), vals[0])  # same length, other key
    parked = tree.lookup((3, 4, 5, 6, 9))
    assert parked is not None and parked.parked is not None
    with pytest.raises(ApiError, match="already held by the index"):
        tree.insert((3, 4, 5, 6), parked.parked)  # the parked value offered as resident
    assert _state(tree) == before and not vals[0].released and not parked.parked.released


@pytest.mark.parametrize(
    ("key", "value", "line"),
    [
        ("ab", Val(2, False, "v"), "^key must be a sequence of token ids"),
        (b"ab", Val(2, False, "v"), "^key must be a sequence of token ids"),
        (5, Val(1, False, "v"), "^key must be a sequence of token ids"),
        ((1, "2"), Val(2, False, "v"), r"^key must hold token ids \(ints >= 0\), got '2' at index 1"),
        ((1, True), Val(2, False, "v"), "^key must hold token ids .* got True at index 1"),
        ((1, 2.0), Val(2, False, "v"), "^key must hold token ids .* got 2.0 at index 1"),
        ((1, -2), Val(2, False, "v"), "^key must hold token ids .* got -2 at index 1"),
        ((1, 2), "ab", "^value must have an int length, a bool stateful and release"),
        ((1, 2), None, "^value must have an int length"),
        ((1, 2), Val(True, False, "v"), "^value must have an int length"),  # type: ignore[arg-type]
        ((1, 2), Val(2, 1, "v"), "^value must have an int length"),  # type: ignore[arg-type]
        ((1, 2), Val(3, False, "v"), "^key of 2 tokens must be non-empty and equal the value's length 3"),
        ((), Val(0, False, "v"), "^key of 0 tokens"),
        ((1, 2, 7), Val(3, False, "v"), "^an entry with these tokens exists with a different statefulness"),
    ],
)
def test_bad_inserts_raise_and_change_nothing(key: object, value: object, line: str) -> None:
    tree, vals = _filled()
    before = _state(tree)
    with pytest.raises(ApiError, match=line):
        tree.insert(key, value)  # type: ignore[arg-type]
    assert _state(tree) == before and not any(v.released for v in vals)
    assert not isinstance(value, Val) or not value.released


def test_a_released_value_is_refused() -> None:
    class Live(Val):
        __slots__ = ()

        @property
        def live(self) -> bool:
            return not self.released

    tree, _ = _filled()
    before = _state(tree)
    dead = Live(2, False, "dead")
    dead.release()
    with pytest.raises(ApiError, match=r"^value was released"):
        tree.insert((8, 8), dead)
    assert _state(tree) == before


@pytest.mark.parametrize(
    "prompt", ["ab", 7, (1, "x"), [1, -1], (True, 2), [3, -(2**70)], (1, 2.0), [np.int64(1), 2], [2**64, -1]]
)
def test_bad_prompts_raise_and_change_nothing(prompt: object) -> None:
    tree, _ = _filled()
    before = _state(tree)
    with pytest.raises(ApiError, match=r"^prompt must"):
        tree.lookup(prompt)  # type: ignore[arg-type]
    assert _state(tree) == before
    assert _shape(tree.evict(None)) == ((3, 4, 5, 6), False, (), False)


def test_bad_evict_and_count_arguments_raise() -> None:
    tree, vals = _filled()
    before = _state(tree)
    with pytest.raises(ApiError, match=r"^park must be a callable or None, got str"):
        tree.evict("host")  # type: ignore[arg-type]
    with pytest.raises(ApiError, match=r"^tier must be a Tier"):
        tree.count("resident")  # type: ignore[arg-type]
    assert _state(tree) == before and not any(v.released for v in vals)


@pytest.mark.parametrize(
    ("result", "line"),
    [
        (lambda v: (Val(v.length, v.stateful, "p"), ()), "^park's result must have an int length"),
        (lambda v: Val(v.length + 1, v.stateful, "p"), "^park returned a value of 5 tokens"),
        (lambda v: Val(v.length, not v.stateful, "p"), r"^park returned a value of 4 tokens \(stateful True\)"),
        (lambda v: v, "^park returned a value the index already holds"),
    ],
)
def test_a_park_result_the_index_cannot_keep_drops_the_entry(result: Any, line: str) -> None:
    tree, vals = _filled()  # (3, 4, 5, 6) is the coldest resident leaf
    with pytest.raises(ApiError, match=line):
        tree.evict(result)
    assert vals[1].released
    assert tree.entries() == [((1, 2), True, False), ((1, 2, 7), True, False)]


def test_evicted_records_what_left_and_where_it_went() -> None:
    tree = _tree()
    a, b = Val(2, True, "a"), Val(2, False, "b")
    tree.insert((1, 1), a)
    tree.insert((2, 2), b)
    host: list[Val] = []

    def park(v: Val) -> Val | None:  # room for one
        if host:
            return None
        host.append(Val(v.length, v.stateful, v.name + "p"))
        return host[-1]

    first = tree.evict(park)
    assert first is not None
    assert (first.key, first.value, first.parked, first.parked_now, first.stateful, first.tier) == (
        (1, 1), a, host[0], True, True, Tier.PARKED
    )
    host.clear()
    second = tree.evict(lambda v: None)  # host full: the parked (1, 1) goes, then the entry itself
    assert second is not None
    assert (second.key, second.value, second.parked, second.parked_now, second.tier) == ((2, 2), b, None, False, None)
    assert second.dropped == ((1, 1),) and second.dropped_values[0].name == "ap"
    assert second.dropped_values[0].released and not second.stateful
    assert tree.entries() == []
