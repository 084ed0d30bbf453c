"""The host tier: placement, chain reuse, HostFull, wake, and a round-trip property test."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
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
    Room,
    Run,
    SeqState,
    SlotId,
    fold,
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
    assert copies == Copies((), None)  # woken at the parked length: it parks as `parked` itself
    assert (again.units, host.used) == (parked.units, 3)
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


def test_fold_joins_pairs_that_advance_together() -> None:
    assert fold([], 1, 2) == ()
    assert fold([(0, 0), (1, 2), (2, 4), (5, 6), (6, 8), (8, 10)], 1, 2) == (
        Run(0, 0, 3), Run(5, 6, 2), Run(8, 10, 1)
    )
    assert fold([(4, 7), (5, 8), (3, 9)], 1, 1) == (Run(4, 7, 2), Run(3, 9, 1))


def test_a_room_reserves_then_parks_and_hands_its_checkpoint_over() -> None:
    pool, _ = Pool.create(HYBRID)
    host = Host(pool, 20, page_units=2, slot_units=3)
    lease = pool.lease(12)
    cp, _ = pool.checkpoint(lease, 10)  # chain pages 0, 1; tail page 3; slot 1
    room = host.room(cp)
    assert isinstance(room, Room) and room.checkpoint is cp
    assert (room.units, host.used, host.runs()) == (9, 9, ((6, 17),))
    parked, copies = host.park(room)
    assert copies == Copies(
        ((PageId(0), HostUnit(0)), (PageId(1), HostUnit(2)), (PageId(3), HostUnit(4))), (SlotId(1), HostUnit(17))
    )
    assert not room.live and cp.live and host.used == 9
    with pytest.raises(ApiError, match="Room was parked"):
        host.park(room)
    for h in (cp, parked, lease):
        h.release()
    assert (host.used, pool.pages_used, pool.slots_used) == (0, 0, 0)


def test_a_full_room_hands_the_checkpoint_back_and_cancel_returns_the_units() -> None:
    pool, _ = Pool.create(HYBRID)
    host = Host(pool, 8, page_units=2, slot_units=3)
    cp, _ = pool.checkpoint(pool.lease(12), 8)  # two pages + slot = 7 units
    big, _ = pool.checkpoint(pool.lease(12), 12)  # three pages + slot = 9 units
    before = _state(host)
    assert host.room(big) is big and _state(host) == before
    room = host.room(cp)
    assert isinstance(room, Room) and host.used == 7
    assert host.room(cp.clone()) is not None and host.free == 1
    assert room.cancel() is cp and cp.live and _state(host) == before
    other = host.room(cp)
    assert isinstance(other, Room)
    other.release()
    assert not cp.live and _state(host) == before


def test_a_room_keeps_the_host_chain_it_shares_alive() -> None:
    pool, _ = Pool.create(PAGED)
    host = Host(pool, 64, page_units=1, slot_units=1)
    lease = pool.lease(20)
    first, _ = pool.checkpoint(lease, 8)
    p1, _ = host.park(first)
    second, _ = pool.checkpoint(lease, 16)
    room = host.room(second)
    assert isinstance(room, Room) and room.units == 2
    p1.release()  # the room still holds units 0, 1 of the chain it shares
    assert host.used == 4
    p2, copies = host.park(room)
    assert copies.pages == ((2, 2), (3, 3)) and p2.units == (0, 1, 2, 3)
    for h in (p2, first, second, lease):
        h.release()
    assert (host.used, pool.pages_used) == (0, 0)


def test_restore_leases_from_the_host_and_a_longer_park_copies_only_what_is_new() -> None:
    pool, _ = Pool.create(HYBRID)
    host = Host(pool, 40, page_units=1, slot_units=3)
    cp = pool.retire(pool.lease(12), 10)  # pages 0, 1 in the chain, page 2 the tail, slot 0
    parked, _ = host.park(cp)  # units 0, 1, 2; slot units 37..39
    cp.release()
    lease, copies = host.restore(parked, 10, 24)
    assert (lease.prefix, lease.sealed, lease.tokens, lease.pages) == (10, 2, 24, (0, 1, 2, 3, 4, 5))
    assert lease.own_pages == (2, 3, 4, 5)
    assert copies == Copies(
        ((HostUnit(0), PageId(0)), (HostUnit(1), PageId(1)), (HostUnit(2), PageId(2))), (HostUnit(37), lease.state_slot)
    )
    assert lease.kv_indices(10, 12) == [10, 11]
    longer, _ = pool.checkpoint(lease, 20)  # chain 0..4 now; pages 0, 1 twinned already
    again, copies = host.park(longer)
    assert copies.pages == ((2, 3), (3, 4), (4, 5)) and copies.slot is not None
    assert again.units[:2] == parked.units[:2]
    with pytest.raises(ApiError, match="tokens 9 must"):
        host.restore(parked, 10, 9)
    with pytest.raises(ApiError, match="length 11"):
        host.restore(parked, 11, 24)
    for h in (lease, longer, again, parked):
        h.release()
    assert (host.used, pool.pages_used, pool.slots_used) == (0, 0, 0)


def test_host_checks_name_the_argument() -> None:
    pool, _ = Pool.create(PAGED)
    host = Host(pool, 8, page_units=1, slot_units=1)
    for call, text in (
        (lambda: Host("x", 4, 1, 1), "pool must be a kern_pool.Pool"),  # pyright: ignore[reportArgumentType]
        (lambda: host.park("x"), "checkpoint must be a kern_pool.Checkpoint"),  # pyright: ignore[reportArgumentType]
        (lambda: host.room(3), "checkpoint must be"),  # pyright: ignore[reportArgumentType]
        (lambda: host.wake("x", 4), "parked must be a kern_pool.Parked"),  # pyright: ignore[reportArgumentType]
        (lambda: host.restore(None, 4, 4), "parked must be"),  # pyright: ignore[reportArgumentType]
        (lambda: Room(object(), host, None, [], [], None, None), "factory-only"),  # pyright: ignore[reportArgumentType]
    ):
        with pytest.raises(ApiError, match=text):
            call()
    for kwargs, text in (({"units": -1}, "units must"), ({"page_units": 0}, "page_units must"), ({"slot_units": 1.5}, "slot_units must")):
        args: dict[str, Any] = {"units": 4, "page_units": 1, "slot_units": 1, **kwargs}
        with pytest.raises(ConfigError, match=text):
            Host(pool, **args)


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
    @rule(i=st.integers(0, 99), two_step=st.booleans())
    def park(self, i: int, two_step: bool) -> None:
        kept = self.cps[i % len(self.cps)]
        assert isinstance(kept.handle, Checkpoint)
        before = _state(self.host)
        if two_step:
            room = self.host.room(kept.handle.clone())
            if isinstance(room, Checkpoint):
                room.release()
                assert _state(self.host) == before
                return
            cp = room.checkpoint
            parked, copies = self.host.park(room)
            cp.release()
        else:
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

    @precondition(lambda self: self.parked)
    @rule(i=st.integers(0, 99), extra=st.integers(0, 8))
    def restore(self, i: int, extra: int) -> None:
        kept = self.parked[i % len(self.parked)]
        assert isinstance(kept.handle, Parked)
        handle = kept.handle
        got = self._settle(lambda: self.host.restore(handle, handle.length, handle.length + extra))
        if got is not None:
            lease, copies = got
            assert lease.prefix == handle.length and lease.sealed == handle.length // self.unit
            assert lease.own_pages == lease.pages[lease.sealed :]
            self.run(copies, self.hmem, self.mem, self.hsmem, self.smem)
            assert lease.state_slot is not None
            self.leases.append((lease, dict(kept.kv), self.smem[lease.state_slot]))

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
        slots: set[int] = set()  # NOTE: a woken checkpoint parked again shares its copy's slot unit
        for kept in self.parked:
            assert isinstance(kept.handle, Parked)
            pages |= set(kept.handle.units)
            if kept.handle.slot_unit is not None:
                slots.add(kept.handle.slot_unit)
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



def _sequential_alloc_pages(host: Host, pages: int) -> list[HostUnit] | None:
    """The reference: one first-fit `_alloc` per page, undone when one does not fit."""
    got: list[HostUnit] = []
    for _ in range(pages):
        at = host._alloc(host.page_units, False)  # pyright: ignore[reportPrivateUsage]
        if at is None:
            for unit in got:
                host._free(unit, host.page_units)  # pyright: ignore[reportPrivateUsage]
            return None
        got.append(at)
    return got


@settings(max_examples=400)
@given(page_units=st.integers(1, 3), holes=st.lists(st.integers(0, 5), min_size=1, max_size=12),
       pages=st.integers(0, 30))
def test_bulk_page_allocation_is_the_per_page_first_fit(page_units: int, holes: list[int], pages: int) -> None:
    pool, _ = Pool.create(PAGED)
    fast, slow = (Host(pool, 96, page_units=page_units, slot_units=1) for _ in range(2))
    for host in (fast, slow):  # the same fragmented free list: runs of the given sizes between taken units
        host._runs = _holes(holes)  # pyright: ignore[reportPrivateUsage]
        host._used = 96 - sum(e - s for s, e in host._runs)  # pyright: ignore[reportPrivateUsage]
    want = _sequential_alloc_pages(slow, pages)
    got = fast._alloc_pages(pages)  # pyright: ignore[reportPrivateUsage]
    assert got == want
    assert (fast.runs(), fast.used) == (slow.runs(), slow.used)


def _holes(sizes: list[int]) -> list[tuple[int, int]]:
    """Free runs of `sizes` (empty ones dropped), each after one taken unit, then the rest of 96."""
    runs: list[tuple[int, int]] = []
    at = 0
    for size in sizes:
        at += 1
        if size:
            runs.append((at, at + size))
        at += size
    if at + 1 < 96:
        runs.append((at + 1, 96))
    return runs
