"""The host tier: placement, chain reuse, HostFull, wake, and a round-trip property test."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kern_pool import (
    ApiError,
    Checkpoint,
    ConfigError,
    Copies,
    Denied,
    Host,
    HostFull,
    HostUnit,
    Lease,
    PagedState,
    PageId,
    Parked,
    Pool,
    PoolConfig,
    SeqState,
    SlotId,
)

HYBRID = PoolConfig((PagedState("kv", 1),), (SeqState("ssm", 4),), unit=4, row_pages=6, chunk=4, chunks=40, first_slots=6)
PAGED = PoolConfig((PagedState("kv", 1),), (), unit=4, row_pages=6, chunk=4, chunks=40)


def _state(host: Host) -> tuple[Any, ...]:
    return host.runs(), host.used, host.pool.snapshot()


def test_pages_from_the_low_end_slots_from_the_high_end() -> None:
    pool, _ = Pool.create(HYBRID)
    host = Host(pool, 20, page_units=2, slot_units=3)
    lease = pool.lease(12)
    cp, _ = pool.checkpoint(lease, 10)  # chain pages 0, 1; tail page (copy of page 2); slot
    assert (cp.pages, cp.state_slot) == ((0, 1, 3), 1)
    parked, copies = host.park(cp)
    assert copies == Copies(
        ((PageId(0), HostUnit(0)), (PageId(1), HostUnit(2)), (PageId(3), HostUnit(4))), (SlotId(1), HostUnit(17))
    )
    assert (parked.units, parked.slot_unit, host.used, host.runs()) == ((0, 2, 4), 17, 9, ((6, 17),))


def test_a_later_turn_of_the_chain_parks_only_new_pages() -> None:
    pool, _ = Pool.create(PAGED)
    host = Host(pool, 64, page_units=1, slot_units=1)
    lease = pool.lease(20)
    first = pool.retire(pool.fork(lease, 8, 8)[0], 8)  # seals pages 0, 1 of `lease`
    p1, c1 = host.park(first)
    assert c1.pages == ((0, 0), (1, 1))
    second, _ = pool.checkpoint(lease, 16)  # pages 0..3, sharing nodes 0, 1 with `first`
    p2, c2 = host.park(second)
    assert c2.pages == ((2, 2), (3, 3))  # the twins of pages 0, 1 are reused
    assert (p2.units, host.used) == ((0, 1, 2, 3), 4)
    p1.release()
    assert host.used == 4  # still held through p2's chain
    p2.release()
    assert (host.used, host.runs()) == (0, ((0, 64),))


def test_host_full_keeps_nothing() -> None:
    pool, _ = Pool.create(HYBRID)
    host = Host(pool, 6, page_units=2, slot_units=3)
    lease = pool.lease(12)
    cp, _ = pool.checkpoint(lease, 8)  # two pages + slot = 7 units
    before = _state(host)
    with pytest.raises(HostFull) as full:
        host.park(cp)
    assert (full.value.units, full.value.free) == (7, 6)
    assert _state(host) == before


def test_wake_twins_the_new_pages_so_parking_again_copies_nothing() -> None:
    pool, _ = Pool.create(PAGED)
    host = Host(pool, 64, page_units=1, slot_units=1)
    lease = pool.lease(12)
    cp = pool.retire(lease, 10)  # pages 0, 1 in the chain, page 2 the tail
    parked, _ = host.park(cp)
    cp.release()
    woken, copies = host.wake(parked, 10)
    assert (woken.pages, copies) == ((0, 1, 2), Copies(((HostUnit(0), PageId(0)), (HostUnit(1), PageId(1)), (HostUnit(2), PageId(2))), None))
    again, copies = host.park(woken)
    assert copies.pages == ((2, 3),)  # only the private partial page is copied
    partial, copies = host.wake(parked, 4)  # a stateless copy wakes at whole pages below its length
    assert (partial.length, len(copies.pages)) == (4, 1)
    for h in (woken, again, partial, parked):
        h.release()
    assert (host.used, pool.pages_used) == (0, 0)


def test_bad_calls_leave_host_and_pool_unchanged() -> None:
    pool, _ = Pool.create(HYBRID)
    other, _ = Pool.create(HYBRID)
    host = Host(pool, 64, page_units=1, slot_units=1)
    other_host = Host(other, 64, page_units=1, slot_units=1)
    cp, _ = pool.checkpoint(pool.lease(8), 6)
    parked, _ = host.park(cp)
    dead, _ = host.park(cp)
    dead.release()
    stranger = other.retire(other.lease(4), 4)
    for call in (
        lambda: host.wake(parked, 7),
        lambda: host.wake(parked, 4),  # stateful: only at its length
        lambda: host.wake(parked, 0),
        lambda: host.wake(dead, 6),
        lambda: dead.release(),
        lambda: host.park(stranger),
        lambda: other_host.wake(parked, 6),
        lambda: Parked(object(), host, None),  # pyright: ignore[reportArgumentType]
    ):
        before = _state(host), _state(other_host)
        with pytest.raises(ApiError):
            call()
        assert (_state(host), _state(other_host)) == before
    with pytest.raises(ConfigError):
        Host(pool, 4, page_units=0, slot_units=1)


# ---- round trip property -------------------------------------------------------------------


@dataclass
class Kept:
    handle: Checkpoint | Parked
    kv: dict[int, int] = field(default_factory=dict[int, int])
    slot: int | None = None


class HostMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool, _ = Pool.create(HYBRID)
        self.host = Host(self.pool, 24, page_units=2, slot_units=3)
        self.unit = HYBRID.unit
        self.mem: dict[tuple[int, int], int] = {}
        self.hmem: dict[tuple[int, int], int] = {}
        self.smem: dict[int, int] = {}
        self.hsmem: dict[int, int] = {}
        self.leases: list[tuple[Lease, dict[int, int], int]] = []
        self.cps: list[Kept] = []
        self.parked: list[Kept] = []
        self.stamp = 0

    def _settle(self, op: Any) -> Any:
        try:
            return op()
        except Denied:
            if self.pool.pending is None:
                return None
            self.pool.complete(self.pool.pending)
            try:
                return op()
            except Denied:
                return None

    @rule(tokens=st.integers(1, 24), fill=st.integers(0, 24))
    def write(self, tokens: int, fill: int) -> None:
        lease = self._settle(lambda: self.pool.lease(tokens))
        if lease is None:
            return
        kv: dict[int, int] = {}
        for pos, index in enumerate(lease.kv_indices(0, min(tokens, fill) or 1)):
            self.stamp += 1
            kv[pos] = self.mem[divmod(index, self.unit)] = self.stamp
        self.stamp += 1
        self.smem[lease.state_slot] = self.stamp
        self.leases.append((lease, kv, self.stamp))

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 99), pick=st.integers(0, 99), retire=st.booleans())
    def keep(self, i: int, pick: int, retire: bool) -> None:
        lease, kv, slot = self.leases[i % len(self.leases)]
        length = 1 + pick % lease.tokens
        if retire:
            self.leases.remove((lease, kv, slot))
            self.cps.append(Kept(self.pool.retire(lease, length), {p: s for p, s in kv.items() if p < length}, slot))
            return
        got = self._settle(lambda: self.pool.checkpoint(lease, length))
        if got is not None:
            self.run(got[1], self.mem, self.mem, self.smem, self.smem)
            self.cps.append(Kept(got[0], {p: s for p, s in kv.items() if p < length}, slot))

    def run(self, copies: Copies[Any, Any], src: dict[Any, int], dst: dict[Any, int], ssrc: dict[int, int], sdst: dict[int, int]) -> None:
        for a, b in copies.pages:
            for off in range(self.unit):
                if (a, off) in src:
                    dst[b, off] = src[a, off]
                else:
                    dst.pop((b, off), None)
        if copies.slot is not None:
            sdst[copies.slot[1]] = ssrc[copies.slot[0]]

    @precondition(lambda self: self.cps)
    @rule(i=st.integers(0, 99))
    def park(self, i: int) -> None:
        kept = self.cps[i % len(self.cps)]
        assert isinstance(kept.handle, Checkpoint)
        before = _state(self.host)
        try:
            parked, copies = self.host.park(kept.handle)
        except HostFull:
            assert _state(self.host) == before
            return
        self.run(copies, self.mem, self.hmem, self.smem, self.hsmem)
        self.parked.append(Kept(parked, dict(kept.kv), kept.slot))

    @precondition(lambda self: self.parked)
    @rule(i=st.integers(0, 99))
    def wake(self, i: int) -> None:
        kept = self.parked[i % len(self.parked)]
        assert isinstance(kept.handle, Parked)
        handle = kept.handle
        got = self._settle(lambda: self.host.wake(handle, handle.length))
        if got is not None:
            self.run(got[1], self.hmem, self.mem, self.hsmem, self.smem)
            self.cps.append(Kept(got[0], dict(kept.kv), kept.slot))

    @precondition(lambda self: self.leases or self.cps or self.parked)
    @rule(i=st.integers(0, 99))
    def release(self, i: int) -> None:
        groups = [g for g in (self.cps, self.parked) if g]
        if self.leases and (i % 3 == 0 or not groups):
            self.leases.pop(i % len(self.leases))[0].release()
            return
        group = groups[i % len(groups)]
        group.pop(i % len(group)).handle.release()

    @invariant()
    def contents(self) -> None:
        for kept in self.cps:
            assert isinstance(kept.handle, Checkpoint)
            pages = kept.handle.pages
            for pos, stamp in kept.kv.items():
                assert self.mem.get((pages[pos // self.unit], pos % self.unit)) == stamp
            slot = kept.handle.state_slot
            assert slot is not None and self.smem[slot] == kept.slot
        for kept in self.parked:
            assert isinstance(kept.handle, Parked)
            units = kept.handle.units
            for pos, stamp in kept.kv.items():
                assert self.hmem.get((units[pos // self.unit], pos % self.unit)) == stamp
            slot_unit = kept.handle.slot_unit
            assert slot_unit is not None and self.hsmem[slot_unit] == kept.slot

    @invariant()
    def partition(self) -> None:
        pages: set[int] = set()
        slots: list[int] = []
        for kept in self.parked:
            assert isinstance(kept.handle, Parked)
            pages |= set(kept.handle.units)
            if kept.handle.slot_unit is not None:
                slots.append(kept.handle.slot_unit)
        assert len(slots) == len(set(slots))
        assert self.host.used == 2 * len(pages) + 3 * len(slots)
        covered = sorted([(p, p + 2) for p in pages] + [(s, s + 3) for s in slots] + list(self.host.runs()))
        at = 0
        for start, stop in covered:
            assert start == at, "host units overlap or leak"
            at = stop
        assert at == self.host.units

    def teardown(self) -> None:
        for lease, _, _ in self.leases:
            lease.release()
        for kept in self.cps + self.parked:
            kept.handle.release()
        assert (self.host.used, self.host.runs(), self.pool.pages_used, self.pool.slots_used) == (0, ((0, 24),), 0, 0)


TestHostModel = HostMachine.TestCase
TestHostModel.settings = settings(
    max_examples=60, stateful_step_count=55, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
