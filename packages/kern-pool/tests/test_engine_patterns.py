"""The engine's call patterns on kern_pool: the KV-cache manager (KVCache over Pool + Host) in
random orders.

A machine leases, checkpoints, retires, forks and continues turns from index hits (the manager's
decision and lease: restore of a resident hit, a parked one woken into the lease then kept, all
under the manager's room and eviction; or, by hand, a parked hit woken as a checkpoint), inserts the
results (values re-inserted, the same value offered under a second key), evicts with and without
a host, and releases. A trivial model (a dict of entries) predicts every index answer; after
every step the pages and slots the pool counts equal what the live handles name, every value the
index holds is live, and the host's used units equal the parked values' units. Teardown releases
everything: nothing is left.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kern_pool import (
    ApiError,
    CacheFull,
    Checkpoint,
    Evicted,
    Host,
    HostFull,
    KVCache,
    Lease,
    PagedState,
    Parked,
    Pool,
    PoolConfig,
    PoolDevice,
    Prefix,
    SeqState,
    Source,
    Tier,
)

Key = tuple[int, ...]


@dataclass
class Entry:
    stateful: bool
    resident: Checkpoint | None = None
    parked: Parked | None = None


@dataclass
class Model:
    """The index as a dict: what it holds, by key."""

    unit: int
    entries: dict[Key, Entry] = field(default_factory=lambda: {})

    def usable(self, key: Key, q: Key) -> int:
        if key == q[: len(key)]:
            return len(key)
        if self.entries[key].stateful:
            return 0
        n = 0
        while n < min(len(key), len(q)) and key[n] == q[n]:
            n += 1
        return n // self.unit * self.unit

    def best(self, prompt: Key) -> tuple[int, int]:
        best = (0, -1)
        for key, e in self.entries.items():
            length = self.usable(key, prompt[:-1])
            if length:
                best = max(best, (length, 1 if e.resident is not None else 0))
        return best

    def prune(self, key: Key) -> None:
        e = self.entries[key]
        if e.resident is None and e.parked is None:
            del self.entries[key]


@dataclass
class Live:
    lease: Lease
    tokens: list[int]


class EngineMachine(RuleBasedStateMachine):
    config: ClassVar[PoolConfig]
    host_units: ClassVar[int]
    seen: ClassVar[Counter[str]] = Counter()
    """Steps and events over every run of this machine (the docs quote them)."""

    def __init__(self) -> None:
        super().__init__()
        self.pool, _ = Pool.create(self.config)
        self.unit = self.config.unit
        self.max_len = min(self.config.row_pages * self.unit, max(4 * self.unit + 3, 24))
        self.host = Host(self.pool, self.host_units, page_units=2, slot_units=3)
        self.device = PoolDevice(self.pool, self.host)
        self.cache = KVCache(self.device, park=self.host_units > 0, on_evict=self._evicted)
        self.index: Prefix[Checkpoint, Parked] = self.cache.prefix
        self.model = Model(self.unit)
        self.live: list[Live] = []

    # ---- helpers -------------------------------------------------------------------------

    def _park(self, cp: Checkpoint) -> Parked | None:
        try:
            parked, _ = self.host.park(cp)
        except HostFull:
            return None
        return parked

    def _evicted(self, ev: Evicted[Checkpoint, Parked]) -> None:
        e = self.model.entries[ev.key]
        assert ev.value is e.resident and not ev.value.live
        assert ev.stateful == e.stateful
        self.seen["parked" if ev.parked_now else "dropped" if ev.parked is None else "let go"] += 1
        self.seen["host full drops"] += len(ev.dropped)
        if ev.parked_now:
            assert e.parked is None and ev.parked is not None and ev.parked.live
            e.parked = ev.parked
        else:
            assert ev.parked is e.parked
        e.resident = None
        for key, value in zip(ev.dropped, ev.dropped_values, strict=True):
            d = self.model.entries[key]
            assert d.parked is value and not value.live
            d.parked = None
            self.model.prune(key)
        self.model.prune(ev.key)

    def _grant(self, op: object) -> object:
        """Run `op` through the manager's room (remaps landed, evictions until granted: each
        checked against the model by `_evicted`); None when nothing is left to evict."""
        assert callable(op)
        try:
            return self.cache.room(op)
        except CacheFull:
            self.seen["cache full"] += 1
            return None

    def _insert(self, key: Key, cp: Checkpoint) -> None:
        old = self.model.entries.get(key)
        kept = self.index.insert(key, cp)
        self._model_insert(key, cp, kept, old)

    def _model_insert(self, key: Key, cp: Checkpoint, kept: bool, old: Entry | None) -> None:
        m = self.model
        assert kept == (old is None or old.resident is None)
        self.seen["kept" if kept else "redundant"] += 1
        if not kept:
            assert not cp.live  # the index released the redundant value
            return
        if old is None:
            old = m.entries[key] = Entry(cp.stateful)
        old.resident = cp
        shorter = m.entries.get(key[: -self.unit]) if len(key) > self.unit and not cp.stateful else None
        if shorter is not None and not shorter.stateful and shorter.resident is not None and shorter.parked is None:
            assert not shorter.resident.live
            del m.entries[key[: -self.unit]]

    def _start(self, tokens: list[int], prefix: int, lease: Lease) -> None:
        if prefix < len(tokens):
            lease.kv_indices(max(prefix, lease.sealed * self.unit), len(tokens))
        self.live.append(Live(lease, tokens))

    # ---- rules ---------------------------------------------------------------------------

    @rule(tokens=st.lists(st.integers(0, 1), min_size=1, max_size=40))
    def lease(self, tokens: list[int]) -> None:
        tokens = tokens[: self.max_len]
        lease = self._grant(lambda: self.device.lease(len(tokens)))
        if isinstance(lease, Lease):
            self._start(tokens, 0, lease)

    @rule(prompt=st.lists(st.integers(0, 1), min_size=2, max_size=40), answer=st.integers(0, 9),
          straight=st.booleans())
    def turn(self, prompt: list[int], answer: int, straight: bool) -> None:
        """Continue from the longest cached prefix: restore a resident hit, wake a parked one
        (`straight`: into the turn's lease, then a checkpoint of it inserted again, as the engine
        does; else as a checkpoint inserted again, then restored)."""
        prompt = prompt[: self.max_len - 1]
        full = prompt + [1] * min(answer, self.max_len - len(prompt))
        expect = self.model.best(tuple(prompt))
        decision, hit = self.cache.decide(prompt, ())
        if hit is None:
            assert expect[0] == 0
            return self.lease(full)
        assert (hit.length, 1 if hit.tier is Tier.RESIDENT else 0) == expect
        entry = self.model.entries[hit.key]
        assert self.model.usable(hit.key, tuple(prompt[:-1])) == hit.length
        assert hit.resident is entry.resident if hit.tier is Tier.RESIDENT else hit.parked is entry.parked
        self.seen[f"{hit.tier.value} hit"] += 1
        if hit.parked is not None and not straight:
            return self._wake_then_restore(prompt, full, hit.length, hit.parked)
        assert decision.length == hit.length
        assert decision.source is (Source.RESIDENT if hit.tier is Tier.RESIDENT else Source.PARKED)
        try:
            lease = self.cache.acquire(decision, hit, len(full))
        except CacheFull:
            self.seen["cache full"] += 1
            return None
        assert lease.prefix == decision.length
        self._start(full, decision.length, lease)
        if decision.source is Source.PARKED:
            key = tuple(prompt[: decision.length])
            cp = self.cache.keep_woken(lease, key)
            if cp is not None:  # NOTE: the model as the room's evictions left it, before the insert
                self._model_insert(key, cp, cp.live, self.model.entries.get(key))
        return None

    def _wake_then_restore(self, prompt: list[int], full: list[int], length: int, parked: Parked) -> None:
        """A parked hit woken as a checkpoint, inserted again, then restored (by hand)."""
        held = parked.clone()
        woken = self._grant(lambda: self.host.wake(held, length))
        held.release()
        if woken is None:
            return
        assert isinstance(woken, tuple)
        cp = woken[0].clone()  # pyright: ignore[reportUnknownMemberType]
        self._insert(tuple(prompt[:length]), woken[0])  # pyright: ignore[reportUnknownArgumentType]
        lease = self._grant(lambda: self.device.restore(cp, length, len(full)))
        cp.release()
        if isinstance(lease, Lease):
            assert lease.prefix == length
            self._start(full, length, lease)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), cut=st.integers(0, 99))
    def checkpoint(self, i: int, cut: int) -> None:
        live = self.live[i % len(self.live)]
        n = len(live.tokens) if self.pool.has_slots else 1 + cut % len(live.tokens)
        got = self._grant(lambda: self.device.checkpoint(live.lease, n))
        if isinstance(got, Checkpoint):
            self._insert(tuple(live.tokens[:n]), got)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), cut=st.integers(0, 99))
    def retire(self, i: int, cut: int) -> None:
        live = self.live.pop(i % len(self.live))
        n = len(live.tokens) if self.pool.has_slots else 1 + cut % len(live.tokens)
        self._insert(tuple(live.tokens[:n]), self.pool.retire(live.lease, n))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), cut=st.integers(0, 99), more=st.lists(st.integers(0, 1), max_size=8))
    def fork(self, i: int, cut: int, more: list[int]) -> None:
        live = self.live[i % len(self.live)]
        n = len(live.tokens) if self.pool.has_slots else 1 + cut % len(live.tokens)
        tokens = (live.tokens[:n] + more)[: self.max_len]
        got = self._grant(lambda: self.device.fork(live.lease, n, max(len(tokens), n)))
        if isinstance(got, Lease):
            self._start(tokens, n, got)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def release(self, i: int) -> None:
        self.live.pop(i % len(self.live)).lease.release()

    @rule(host=st.booleans())
    def evict(self, host: bool) -> None:
        ev = self.index.evict(self._park if host and self.host_units else None)
        if ev is None:
            assert all(e.resident is None for e in self.model.entries.values())
        else:
            self._evicted(ev)

    @precondition(lambda self: any(e.resident is not None for e in self.model.entries.values()))
    @rule(i=st.integers(0, 99), other=st.booleans())
    def reinsert(self, i: int, other: bool) -> None:
        """The value the index holds, again: under its key a no-op, under another key refused."""
        keys = sorted(k for k, e in self.model.entries.items() if e.resident is not None)
        key = keys[i % len(keys)]
        value = self.model.entries[key].resident
        assert value is not None
        before = self.index.entries(), self.pool.pages_used, self.pool.slots_used
        if other:
            twin = (*key[:-1], 1 - key[-1])
            with pytest.raises(ApiError, match="already held by the index"):
                self.index.insert(twin, value)
        else:
            assert self.index.insert(key, value) is False
        assert (self.index.entries(), self.pool.pages_used, self.pool.slots_used) == before
        assert value.live

    # ---- invariants ----------------------------------------------------------------------

    @invariant()
    def holdings(self) -> None:
        self.seen["steps"] += 1
        m = self.model
        assert self.index.entries() == sorted(
            (k, e.resident is not None, e.parked is not None) for k, e in m.entries.items()
        )
        held = [e.resident for e in m.entries.values() if e.resident is not None]
        assert all(cp.live for cp in held)
        pages = {p for live in self.live for p in live.lease.pages} | {p for cp in held for p in cp.pages}
        slots = [s for s in [live.lease.state_slot for live in self.live] + [cp.state_slot for cp in held] if s is not None]
        assert len(set(slots)) == len(slots), "a slot has one holder"
        assert (self.pool.pages_used, self.pool.slots_used) == (len(pages), len(slots))
        parked = [e.parked for e in m.entries.values() if e.parked is not None]
        assert all(p.live for p in parked)
        units = {u for p in parked for u in p.units}
        slot_units = [p.slot_unit for p in parked if p.slot_unit is not None]
        assert self.host.used == 2 * len(units) + 3 * len(slot_units)

    def teardown(self) -> None:
        for live in self.live:
            live.lease.release()
        self.index.clear()
        assert self.index.entries() == []
        assert (self.pool.pages_used, self.pool.slots_used, self.host.used) == (0, 0, 0)
        assert self.pool.snapshot().nodes == 0


SETTINGS = settings(
    max_examples=80, stateful_step_count=70, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class Unit16(EngineMachine):
    """Paged only, 16-token pages, a small pool (pressure) and a small host."""

    config = PoolConfig((PagedState("kv", 1),), (), unit=16, row_pages=6, chunk=16, chunks=12)
    host_units = 12


class Unit17(EngineMachine):
    """Hybrid (a per-seq state: stateful entries), 17-token pages, a larger pool, remaps."""

    config = PoolConfig(
        (PagedState("kv", 1),), (SeqState("ssm", 10),), unit=17, row_pages=5, chunk=17, chunks=30, first_slots=3
    )
    host_units = 40


class TwoPaged(EngineMachine):
    """Two paged states and a per-seq state (stateful entries), 8-token pages, remaps."""

    config = PoolConfig(
        (PagedState("kv", 1), PagedState("kv2", 2)), (SeqState("ssm", 24),), unit=8, row_pages=6, chunk=48,
        chunks=24, first_slots=3,
    )
    host_units = 40


class Unit1(EngineMachine):
    """Paged only, 1-token pages (every token a page), no host tier: evictions drop."""

    config = PoolConfig((PagedState("kv", 2),), (), unit=1, row_pages=40, chunk=4, chunks=24)
    host_units = 0


TestUnit16 = Unit16.TestCase
TestUnit16.settings = SETTINGS
TestUnit17 = Unit17.TestCase
TestUnit17.settings = SETTINGS
TestUnit1 = Unit1.TestCase
TestUnit1.settings = SETTINGS
TestTwoPaged = TwoPaged.TestCase
TestTwoPaged.settings = SETTINGS


def test_inserting_the_held_checkpoint_again_keeps_its_pages() -> None:
    """The double insert: the index keeps what it lists, and the next hit is a live checkpoint."""
    pool, _ = Pool.create(Unit16.config)
    index: Prefix[Checkpoint, Parked] = Prefix(16)
    lease = pool.lease(40)
    cp = pool.retire(lease, 40)
    key = tuple(range(40))
    assert index.insert(key, cp) and pool.pages_used == 3
    assert index.insert(key, cp) is False
    assert pool.pages_used == 3 and cp.live
    hit = index.lookup((*key, 7))
    assert hit is not None and hit.resident is cp and cp.live
    with pytest.raises(ApiError, match="already held"):
        index.insert(tuple(range(1, 41)), cp)
    assert pool.pages_used == 3
    index.clear()
    assert (pool.pages_used, cp.live) == (0, False)
