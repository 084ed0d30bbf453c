"""Property test of the Pool against plain reference models (stamps, chunk mapping, holdings).

Two identical pools replay every operation; their answers and snapshots must agree (the same
calls give the same decisions). Device memory is a dict of (page, offset) -> stamp and
slot -> stamp: every write puts a fresh stamp, every returned `Copies` is executed, and each live
handle must read back exactly the stamps it last wrote or inherited. Remap plans are executed
on a chunk-mapping model that checks each unmap and map.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kern_pool import (
    ApiError,
    Busy,
    Checkpoint,
    Copies,
    Denied,
    ExceedsPool,
    ExceedsRow,
    Lease,
    LineTable,
    PagedState,
    PageId,
    Pool,
    PoolConfig,
    Remap,
    Remapping,
    SeqState,
    SlotId,
    Status,
)

PAGED_ONLY = PoolConfig(
    (PagedState("kv", 2), PagedState("draft", 1)), (), unit=4, row_pages=5, chunk=4, chunks=72
)
"""Two paged states: a page is 2 + 1 chunks; 24 pages."""
SMALL_CHUNKS = PoolConfig(
    (PagedState("kv", 2),), (SeqState("ssm", 12),), unit=4, row_pages=4, chunk=4, chunks=29, first_slots=3
)
"""Chunks smaller than every object: a page is 2 chunks, a slot 3; 3 slots and 10 pages at first."""
SHARED_BOUNDARIES = PoolConfig(
    (PagedState("kv", 3),), (SeqState("conv", 10), SeqState("ssm", 4)),
    unit=2, row_pages=4, chunk=8, chunks=13, first_slots=2,
)
"""Object boundaries inside chunks: 6-byte pages, 10- and 4-byte slots, 8-byte chunks; 2 + 12."""

STEPS = settings(
    max_examples=80,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _span(size: int, chunk: int, index: int) -> range:
    return range(index * size // chunk, -(-(index + 1) * size // chunk))


def _view(value: Any) -> Any:
    """A comparable picture of an operation's answer."""
    if isinstance(value, tuple):
        return tuple(_view(v) for v in value)  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, Lease):
        return ("lease", value.pages, value.state_slot, value.prefix, value.tokens, value.sealed)
    if isinstance(value, Checkpoint):
        return ("checkpoint", value.pages, value.state_slot, value.length, value.sealed)
    if isinstance(value, BaseException):
        return (type(value).__name__, str(value))
    return value


@dataclass
class Held:
    a: Lease | Checkpoint
    b: Lease | Checkpoint
    kv: dict[int, int] = field(default_factory=dict[int, int])
    slot: int | None = None


class PoolMachine(RuleBasedStateMachine):
    config: ClassVar[PoolConfig] = PAGED_ONLY

    def __init__(self) -> None:
        super().__init__()
        cfg = self.config
        self.a, plan = Pool.create(cfg)
        self.b, plan_b = Pool.create(cfg)
        assert plan == plan_b
        self.initial = self.a.snapshot()
        self.unit = cfg.unit
        self.sizes = dict(zip(cfg.arenas, cfg.page_bytes + cfg.slot_bytes, strict=True))
        self.chunk_at: dict[tuple[str, int], int] = {}
        self.free: set[int] = set(range(cfg.chunks))
        self.live_pages: set[int] = set()
        self.live_slots: set[int] = set()
        self.seen: int | None = None
        self.execute(plan)
        self.mem: dict[tuple[int, int], int] = {}
        self.smem: dict[int, int] = {}
        self.leases: list[Held] = []
        self.cps: list[Held] = []
        self.stamp = 0

    # ---- models --------------------------------------------------------------------------

    def execute(self, plan: Remap) -> None:
        """Run a plan on the mapping model, checking each step, and record what it made."""
        for u in plan.unmaps:
            assert self.chunk_at.pop((u.arena, u.pos)) == u.chunk
            self.free.add(u.chunk)
        for m in plan.maps:
            assert (m.arena, m.pos) not in self.chunk_at, "map onto a mapped position"
            assert m.chunk in self.free, "map of a chunk that is not free"
            self.free.remove(m.chunk)
            self.chunk_at[m.arena, m.pos] = m.chunk
        for g in plan.grants:
            assert all((g.arena, p) in self.chunk_at for p in range(g.start, g.stop))
        self.live_pages |= set(plan.made_pages)
        self.live_slots |= set(plan.made_slots)

    def notice_plan(self) -> None:
        plan = self.a.pending
        assert (plan is None) == (self.b.pending is None)
        if plan is not None and plan.serial != self.seen:
            assert plan == self.b.pending
            self.seen = plan.serial
            self.live_pages -= set(plan.unmade_pages)
            self.live_slots -= set(plan.unmade_slots)

    def copy(self, copies: Copies[Any, Any]) -> None:
        for src, dst in copies.pages:
            for off in range(self.unit):
                if (src, off) in self.mem:
                    self.mem[dst, off] = self.mem[src, off]
                else:
                    self.mem.pop((dst, off), None)
        if copies.slot is not None:
            src, dst = copies.slot
            if src in self.smem:
                self.smem[dst] = self.smem[src]

    def both(self, op: Any) -> tuple[Any, Any]:
        """Run `op(pool, side)` on both pools; the answers must agree."""
        out: list[Any] = []
        for pool, side in ((self.a, 0), (self.b, 1)):
            try:
                out.append(op(pool, side))
            except (ApiError, Denied) as exc:
                out.append(exc)
        assert _view(out[0]) == _view(out[1])
        self.notice_plan()
        return out[0], out[1]

    def next_stamp(self) -> int:
        self.stamp += 1
        return self.stamp

    # ---- rules ---------------------------------------------------------------------------

    @rule(pick=st.integers(0, 99))
    def lease(self, pick: int) -> None:
        tokens = 1 + pick % (self.a.row_pages * self.unit + 1)
        a, b = self.both(lambda pool, _: pool.lease(tokens))
        if isinstance(a, Lease):
            self.leases.append(Held(a, b))

    @precondition(lambda self: self.a.has_slots)
    @rule(go=st.integers(0, 3))
    def lease_slot(self, go: int) -> None:
        if go:
            return
        a, b = self.both(lambda pool, _: pool.lease_slot())
        if isinstance(a, Lease):
            self.leases.append(Held(a, b))

    @precondition(lambda self: self.a.pending is not None)
    @rule()
    def land(self) -> None:
        plan = self.a.pending
        assert plan is not None and self.b.pending is not None
        self.execute(plan)
        self.a.complete(plan)
        self.b.complete(self.b.pending)

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 99), start=st.integers(0, 23), n=st.integers(1, 9), slot=st.booleans())
    def write(self, i: int, start: int, n: int, slot: bool) -> None:
        h = self.leases[i % len(self.leases)]
        assert isinstance(h.a, Lease) and isinstance(h.b, Lease)
        if h.a.paged:
            lo = max(h.a.prefix, h.a.sealed * self.unit)
            if lo < h.a.tokens:
                start = lo + start % (h.a.tokens - lo)
                stop = min(h.a.tokens, start + n)
                idx = h.a.kv_indices(start, stop)
                assert idx == h.b.kv_indices(start, stop)
                for pos, index in zip(range(start, stop), idx, strict=True):
                    stamp = self.next_stamp()
                    h.kv[pos] = stamp
                    self.mem[divmod(index, self.unit)] = stamp
        if slot and h.a.state_slot is not None:
            h.slot = self.next_stamp()
            self.smem[h.a.state_slot] = h.slot

    def _length(self, lease: Lease, pick: int) -> int:
        return 1 + pick % lease.tokens if lease.paged else 1 + pick % 9

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 99), pick=st.integers(0, 99))
    def checkpoint(self, i: int, pick: int) -> None:
        h = self.leases[i % len(self.leases)]
        assert isinstance(h.a, Lease)
        length = self._length(h.a, pick)
        a, b = self.both(lambda pool, side: pool.checkpoint((h.a, h.b)[side], length))
        if isinstance(a, tuple):
            self.copy(a[1])
            kv = {p: s for p, s in h.kv.items() if p < length}
            self.cps.append(Held(a[0], b[0], kv, h.slot))

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 99), pick=st.integers(0, 99))
    def retire(self, i: int, pick: int) -> None:
        h = self.leases.pop(i % len(self.leases))
        assert isinstance(h.a, Lease)
        length = self._length(h.a, pick)
        a, b = self.both(lambda pool, side: pool.retire((h.a, h.b)[side], length))
        assert isinstance(a, Checkpoint) and isinstance(b, Checkpoint)
        self.cps.append(Held(a, b, {p: s for p, s in h.kv.items() if p < length}, h.slot))

    def _start(self, h: Held, a: Any, b: Any, length: int) -> None:
        if isinstance(a, tuple):
            self.copy(a[1])
            self.leases.append(Held(a[0], b[0], {p: s for p, s in h.kv.items() if p < length}, h.slot))

    @precondition(lambda self: self.cps)
    @rule(i=st.integers(0, 99), pick=st.integers(0, 99), extra=st.integers(0, 12))
    def restore(self, i: int, pick: int, extra: int) -> None:
        h = self.cps[i % len(self.cps)]
        assert isinstance(h.a, Checkpoint)
        length, tokens = h.a.length, 0
        if h.a.paged:
            if not h.a.stateful and pick % 2:
                length = min(self.unit * (1 + pick % 4), length // self.unit * self.unit) or length
            tokens = length + extra
        a, b = self.both(lambda pool, side: pool.restore((h.a, h.b)[side], length, tokens))
        self._start(h, a, b, length)

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 99), pick=st.integers(0, 99), extra=st.integers(0, 12))
    def fork(self, i: int, pick: int, extra: int) -> None:
        h = self.leases[i % len(self.leases)]
        assert isinstance(h.a, Lease)
        stateful = h.a.state_slot is not None
        if not h.a.paged:
            length, tokens = 1 + pick % 9, 0
        else:
            length = h.a.length if stateful else self._length(h.a, pick)
            if length == 0:
                return
            tokens = length + extra
        a, b = self.both(lambda pool, side: pool.fork((h.a, h.b)[side], length, tokens))
        self._start(h, a, b, length)

    @precondition(lambda self: self.leases or self.cps)
    @rule(i=st.integers(0, 99))
    def release(self, i: int) -> None:
        group = self.leases if (i % 2 and self.leases) or not self.cps else self.cps
        h = group.pop(i % len(group))
        h.a.release()
        h.b.release()

    @rule(kind=st.integers(0, 5), i=st.integers(0, 99))
    def bad_call(self, kind: int, i: int) -> None:
        dead: Lease | None = None
        if kind == 5 and self.leases:
            h = self.leases.pop(i % len(self.leases))
            assert isinstance(h.a, Lease)
            h.a.release()
            h.b.release()
            dead = h.a
        before = self.a.snapshot(), self.b.snapshot()
        views = [_view(h.a) for h in self.leases + self.cps]
        with pytest.raises(ApiError):
            self._bad(kind, i, dead)
        assert (self.a.snapshot(), self.b.snapshot()) == before
        assert [_view(h.a) for h in self.leases + self.cps] == views

    def _bad(self, kind: int, i: int, dead: Lease | None) -> None:
        lease = self.leases[i % len(self.leases)].a if self.leases else None
        cp = self.cps[i % len(self.cps)].a if self.cps else None
        if kind == 0:
            self.a.lease(-(i % 3))
        elif kind == 1 and lease is not None and lease.paged:
            self.a.checkpoint(lease, lease.tokens + 1 + i % 3)
        elif kind == 2 and lease is not None:
            self.b.fork(lease, 1, lease.tokens)  # a foreign pool's lease
        elif kind == 3 and cp is not None:
            self.a.restore(cp, cp.length + 1, cp.length + 4)
        elif kind == 4 and lease is not None and lease.paged:
            lease.kv_index(lease.tokens + i % 3)
        elif dead is not None:
            with pytest.raises(ApiError):
                dead.release()
            with pytest.raises(ApiError):
                dead.kv_index(0)
            self.a.retire(dead, 1)
        else:
            self.a.lease(0)

    # ---- invariants ----------------------------------------------------------------------

    @invariant()
    def same_state(self) -> None:
        assert self.a.snapshot() == self.b.snapshot()

    @invariant()
    def stamps(self) -> None:
        for h in self.leases + self.cps:
            pages = h.a.pages
            for pos, stamp in h.kv.items():
                assert self.mem.get((pages[pos // self.unit], pos % self.unit)) == stamp
            if h.slot is not None:
                slot = h.a.state_slot
                assert slot is not None and self.smem.get(slot) == h.slot

    @invariant()
    def holdings(self) -> None:
        own_pages: list[int] = []
        shared: set[int] = set()
        slots: list[int] = []
        for h in self.leases + self.cps:
            pages = h.a.pages
            shared |= set(pages[: h.a.sealed])
            own_pages += pages[h.a.sealed :]
            if h.a.state_slot is not None:
                slots.append(h.a.state_slot)
        assert len(own_pages) == len(set(own_pages)), "a page held twice"
        assert not shared & set(own_pages), "a sealed page is also someone's own"
        assert len(slots) == len(set(slots)), "a slot held twice"
        assert self.a.pages_used == len(shared) + len(own_pages)
        assert self.a.slots_used == len(slots)
        assert self.a.pages_used + self.a.pages_free == len(self.live_pages)
        assert self.a.slots_used + self.a.slots_free == len(self.live_slots)

    @invariant()
    def mapping(self) -> None:
        cfg = self.config
        assert len(self.free) + len(self.chunk_at) == cfg.chunks
        assert len(set(self.chunk_at.values())) == len(self.chunk_at)
        npaged = len(cfg.paged)
        for kinds, ids in ((cfg.arenas[:npaged], self.live_pages), (cfg.arenas[npaged:], self.live_slots)):
            for arena in kinds:
                for index in ids:
                    for p in _span(self.sizes[arena], cfg.chunk, index):
                        assert (arena, p) in self.chunk_at, f"{arena} object {index} not mapped"

    def teardown(self) -> None:
        for h in self.leases + self.cps:
            h.a.release()
            h.b.release()
        assert self.a.pages_used == 0 and self.a.slots_used == 0
        if self.a.pending is not None:
            self.land()
        assert self.a.pending is None
        snap = self.a.snapshot()
        assert snap.nodes == 0
        assert set(snap.pages) | set(snap.slots) <= {Status.ABSENT, Status.FREE}
        assert sum(map(sum, snap.users)) == sum(
            len(_span(self.sizes[a], self.config.chunk, i))
            for arenas, ids in ((self.config.arenas[: len(self.config.paged)], self.live_pages),
                                (self.config.arenas[len(self.config.paged) :], self.live_slots))
            for a in arenas
            for i in ids
        )
        if snap.remaps == 0:
            assert snap == self.initial


class PagedOnlyMachine(PoolMachine):
    config = PAGED_ONLY


class SmallChunksMachine(PoolMachine):
    config = SMALL_CHUNKS


class SharedBoundariesMachine(PoolMachine):
    config = SHARED_BOUNDARIES


TestPagedOnly = PagedOnlyMachine.TestCase
TestPagedOnly.settings = STEPS
TestSmallChunks = SmallChunksMachine.TestCase
TestSmallChunks.settings = STEPS
TestSharedBoundaries = SharedBoundariesMachine.TestCase
TestSharedBoundaries.settings = STEPS


# ---- exact decisions -----------------------------------------------------------------------

KV = PoolConfig((PagedState("kv", 1),), (), unit=4, row_pages=8, chunk=4, chunks=16)
"""Paged only: one chunk per page, 16 pages."""


def test_initial_plan_maps_slots_then_pages() -> None:
    pool, plan = Pool.create(SMALL_CHUNKS)
    assert plan.made_slots == (0, 1, 2)
    assert plan.made_pages == tuple(range(10))
    assert [(m.arena, m.pos, m.chunk) for m in plan.maps[:9]] == [("ssm", p, p) for p in range(9)]
    assert [(m.arena, m.pos, m.chunk) for m in plan.maps[9:]] == [("kv", p, 9 + p) for p in range(20)]
    assert [(g.arena, g.start, g.stop) for g in plan.grants] == [("kv", 0, 20), ("ssm", 0, 9)]
    assert (pool.pages_free, pool.slots_free, pool.pages_max, pool.slots_max) == (10, 3, 14, 9)
    assert pool.pending is None


def test_leases_take_lowest_pages_and_give_them_back() -> None:
    pool, _ = Pool.create(KV)
    a = pool.lease(9)
    b = pool.lease(1)
    assert (a.pages, b.pages) == ((0, 1, 2), (3,))
    a.release()
    c = pool.lease(5)
    assert c.pages == (0, 1)
    assert c.table_row() == (0, 1, 0, 0, 0, 0, 0, 0)
    assert pool.pages_used == 3


def test_denials() -> None:
    pool, _ = Pool.create(KV)
    with pytest.raises(ExceedsRow) as row:
        pool.lease(33)
    assert row.value.limit == 32
    wide = PoolConfig((PagedState("kv", 1),), (), unit=4, row_pages=64, chunk=4, chunks=16)
    pool2, _ = Pool.create(wide)
    with pytest.raises(ExceedsPool):
        pool2.lease(65)
    held = [pool.lease(32), pool.lease(32)]
    with pytest.raises(Busy):
        pool.lease(1)
    held[0].release()
    assert pool.lease(1).pages == (0,)


def test_remap_takes_highest_free_pages_for_the_lowest_absent_slot() -> None:
    pool, _ = Pool.create(SMALL_CHUNKS)
    slots = [pool.lease_slot() for _ in range(3)]
    assert [s.state_slot for s in slots] == [0, 1, 2]
    with pytest.raises(Remapping):
        pool.lease(4)
    plan = pool.pending
    assert plan is not None
    assert [(u.arena, u.pos, u.chunk) for u in plan.unmaps] == [
        ("kv", 18, 27), ("kv", 19, 28), ("kv", 16, 25), ("kv", 17, 26)
    ]
    assert [(m.arena, m.pos, m.chunk) for m in plan.maps] == [("ssm", 9, 25), ("ssm", 10, 26), ("ssm", 11, 27)]
    assert [(g.arena, g.start, g.stop) for g in plan.grants] == [("ssm", 9, 12)]
    assert (plan.made_slots, plan.unmade_pages, plan.made_pages, plan.unmade_slots) == ((3,), (9, 8), (), ())
    with pytest.raises(Remapping):  # one plan in flight: ask again later, do not evict
        pool.lease(4)
    snap = pool.snapshot()
    with pytest.raises(ApiError):
        pool.complete(Remap(plan.serial, (), (), (), (), (), (), ()))
    assert pool.snapshot() == snap
    pool.complete(plan)
    lease = pool.lease(4)
    assert (lease.pages, lease.state_slot) == ((0,), 3)
    assert pool.remaps == 1 and pool.pages_free == 7


def test_remap_back_from_slots_to_pages_uses_loose_chunks_first() -> None:
    cfg = PoolConfig((PagedState("kv", 2),), (SeqState("ssm", 12),), unit=4, row_pages=4, chunk=4, chunks=29, first_slots=6)
    pool, plan = Pool.create(cfg)
    assert (plan.made_pages, plan.made_slots) == (tuple(range(5)), tuple(range(6)))  # chunk 28 is loose
    held = pool.lease(16)
    with pytest.raises(Remapping):
        pool.lease(12)  # 3 pages: 1 free, so pages 5 and 6 are made from the loose chunk + slot 5
    plan = pool.pending
    assert plan is not None
    assert (plan.made_pages, plan.unmade_slots) == ((5, 6), (5,))
    assert [(u.arena, u.pos, u.chunk) for u in plan.unmaps] == [("ssm", 15, 15), ("ssm", 16, 16), ("ssm", 17, 17)]
    assert [(m.arena, m.pos, m.chunk) for m in plan.maps] == [
        ("kv", 10, 15), ("kv", 11, 16), ("kv", 12, 17), ("kv", 13, 28)
    ]
    pool.complete(plan)
    lease = pool.lease(12)
    assert (lease.pages, lease.state_slot) == ((4, 5, 6), 1)
    held.release()
    lease.release()
    assert (pool.pages_free, pool.slots_free) == (7, 5)  # chunks stay with the kind that last used them


def test_busy_when_the_other_kind_is_held_too() -> None:
    pool, _ = Pool.create(SMALL_CHUNKS)
    held = [pool.lease(16), pool.lease(16), pool.lease(8)]  # 10 pages, 3 slots
    with pytest.raises(Busy):
        pool.lease(1)
    assert pool.pending is None
    for h in held:
        h.release()


def test_checkpoint_restore_fork_retire_decisions() -> None:
    pool, _ = Pool.create(KV)
    lease = pool.lease(10)
    assert lease.kv_indices(0, 10) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    cp, copies = pool.checkpoint(lease, 6)
    assert (cp.pages, cp.sealed, cp.length, cp.stateful) == ((0, 3), 1, 6, False)
    assert copies == Copies(((PageId(1), PageId(3)),), None)
    assert lease.sealed == 1
    with pytest.raises(ApiError, match="not writable"):
        lease.kv_index(3)  # inside the sealed page
    assert lease.kv_index(4) == 4

    child, copies = pool.restore(cp, 6, 9)
    assert (child.pages, child.prefix, copies.pages) == ((0, 4, 5), 6, ((3, 4),))
    with pytest.raises(ApiError):
        child.kv_index(5)  # before the prefix
    assert child.kv_index(6) == 4 * 4 + 2

    whole, copies = pool.restore(cp, 4, 8)
    assert (whole.pages, copies) == ((0, 6), Copies((), None))
    with pytest.raises(ApiError, match="whole pages"):
        pool.restore(cp, 5, 8)

    fork, copies = pool.fork(lease, 8, 12)
    assert (fork.pages, copies.pages, lease.sealed) == ((0, 1, 7), (), 2)
    fork2, copies = pool.fork(lease, 9, 9)
    assert (fork2.pages, copies.pages) == ((0, 1, 8), ((2, 8),))

    kept = pool.retire(lease, 9)  # zero copy: the partial page changes owner
    assert (kept.pages, kept.sealed, lease.live) == ((0, 1, 2), 2, False)
    for h in (cp, child, whole, fork, fork2, kept):
        h.release()
    snap = pool.snapshot()
    assert (pool.pages_used, snap.nodes) == (0, 0)


def test_pages_are_made_once_and_keep_their_order_through_sealing() -> None:
    pool, _ = Pool.create(KV)
    lease = pool.lease(10)
    first = lease.pages
    assert first == (0, 1, 2) and lease.pages is first
    cp, _ = pool.checkpoint(lease, 6)  # page 0 sealed
    fork, _ = pool.fork(lease, 9, 9)  # pages 0 and 1 sealed
    assert (lease.pages, lease.sealed, lease.own_pages) == (first, 2, (2,)) and lease.pages is first
    assert lease.table_row() == (0, 1, 2) + (0,) * 5
    child, _ = pool.restore(cp, 6, 9)
    again, _ = pool.restore(cp, 4, 4)  # the checkpoint's chain, walked once, serves both
    assert (child.pages, again.pages, cp.pages) == ((0, 5, 6), (0,), (0, 3))
    lease.release()
    with pytest.raises(ApiError, match="released"):
        _ = lease.pages
    for h in (cp, fork, child, again):
        h.release()
    assert (pool.pages_used, pool.snapshot().nodes) == (0, 0)


def test_retire_returns_pages_past_length_and_reuses_sealed_partial_page() -> None:
    pool, _ = Pool.create(KV)
    lease = pool.lease(16)
    cp, _ = pool.checkpoint(lease, 12)  # seals pages 0..2
    kept = pool.retire(lease, 6)  # the partial page 1 is already a frozen node: shared, no tail
    assert (kept.pages, kept.sealed) == ((0, 1), 2)
    assert pool.pages_used == 3  # page 3 came back; pages 0..2 live in cp's chain
    cp.release()
    assert pool.pages_used == 2
    kept.release()
    assert pool.pages_used == 0


def test_stateful_decisions() -> None:
    pool, _ = Pool.create(SMALL_CHUNKS)
    lease = pool.lease(8)
    lease.kv_indices(0, 6)
    cp, copies = pool.checkpoint(lease, 6)
    assert copies == Copies(((PageId(1), PageId(2)),), (SlotId(0), SlotId(1)))
    assert (cp.pages, cp.state_slot) == ((0, 2), 1)
    with pytest.raises(ApiError, match="stateless"):
        pool.restore(cp, 4, 8)
    with pytest.raises(ApiError, match="current length 6"):
        pool.fork(lease, 4, 8)
    child, copies = pool.fork(lease, 6, 8)
    assert (child.pages, copies) == ((0, 3), Copies(((PageId(1), PageId(3)),), (SlotId(0), SlotId(2))))
    with pytest.raises(Remapping):
        pool.lease_slot()  # three slots held: the fourth is made from free pages
    plan = pool.pending
    assert plan is not None and plan.made_slots == (3,)
    pool.complete(plan)
    only = pool.lease_slot()
    assert (only.paged, only.pages, only.state_slot, only.tokens) == (False, (), 3, 0)
    with pytest.raises(ApiError):
        only.kv_index(0)
    for h in (cp, child, lease, only):
        h.release()


def test_bad_calls_raise_and_leave_the_pool_unchanged() -> None:
    pool, _ = Pool.create(KV)
    other, _ = Pool.create(KV)
    lease = pool.lease(8)
    cp, _ = pool.checkpoint(lease, 4)
    dead = pool.lease(1)
    dead.release()
    dead_cp = cp.clone()
    dead_cp.release()
    stranger = other.lease(4)
    calls = [
        lambda: pool.lease(0),
        lambda: pool.lease(-3),
        lambda: pool.checkpoint(lease, 9),
        lambda: pool.checkpoint(lease, 0),
        lambda: pool.retire(lease, 9),
        lambda: pool.fork(lease, 9, 12),
        lambda: pool.fork(lease, 4, 3),
        lambda: pool.restore(cp, 5, 8),
        lambda: pool.restore(cp, 4, 0),
        lambda: pool.checkpoint(dead, 1),
        lambda: dead.release(),
        lambda: pool.retire(stranger, 1),
        lambda: other.restore(cp, 4, 8),
        lambda: other.checkpoint(lease, 4),
        lambda: pool.lease_slot(),
        lambda: Lease(object(), pool, [], [], None, 0, True),  # pyright: ignore[reportArgumentType]
        lambda: Pool(object(), KV),
        # wrong types, stale handles, handles of the wrong kind
        lambda: pool.lease(True),
        lambda: pool.lease(4.0),
        lambda: pool.lease("4"),
        lambda: pool.checkpoint(lease, 4.0),
        lambda: pool.checkpoint(lease, True),
        lambda: pool.checkpoint(cp, 4),
        lambda: pool.checkpoint("lease", 4),
        lambda: pool.retire(cp, 4),
        lambda: pool.fork(cp, 4, 8),
        lambda: pool.fork(lease, 4, 8.0),
        lambda: pool.fork(lease, 4, True),
        lambda: pool.restore(lease, 4, 8),
        lambda: pool.restore(cp, 4, 8.0),
        lambda: pool.restore(cp, 4, None),
        lambda: pool.restore(dead_cp, 4, 8),
        lambda: dead_cp.clone(),
        lambda: dead_cp.release(),
        lambda: dead_cp.pages,
        lambda: dead.pages,
        lambda: dead.kv_index(0),
        lambda: dead.table_row(),
        lambda: pool.retire(dead, 1),
        lambda: pool.fork(dead, 1, 4),
        lambda: lease.kv_index(8),  # past the lease
        lambda: lease.kv_index(2),  # inside the sealed page
        lambda: lease.kv_index(4.0),
        lambda: lease.kv_index(True),
        lambda: lease.kv_indices(4, 9),
        lambda: lease.kv_indices(6, 6),
        lambda: lease.kv_indices(4, 8.0),
        lambda: lease.seq_line("lines", 0),  # no line tables in this pool
        lambda: pool.complete(None),  # pyright: ignore[reportArgumentType]
        lambda: Pool.create("KV"),  # pyright: ignore[reportArgumentType]
    ]
    for call in calls:
        before = pool.snapshot(), other.snapshot(), lease.pages, cp.pages, stranger.pages, lease.length
        with pytest.raises(ApiError):
            call()
        assert (pool.snapshot(), other.snapshot(), lease.pages, cp.pages, stranger.pages, lease.length) == before
        assert (pool.pages_used, pool.slots_used) == (2, 0)


def test_records_have_no_dict() -> None:
    pool, plan = Pool.create(KV)
    lease = pool.lease(4)
    cp, copies = pool.checkpoint(lease, 2)
    for obj in (plan, plan.maps[0], plan.grants[0], copies, pool, lease, cp, pool.snapshot(), KV):
        assert not hasattr(obj, "__dict__"), type(obj).__name__


def test_a_200k_page_chain_unwinds_without_recursion() -> None:
    cfg = PoolConfig((PagedState("kv", 1),), (), unit=1, row_pages=200_000, chunk=1, chunks=200_000)
    pool, _ = Pool.create(cfg)
    lease = pool.lease(200_000)
    cp = pool.retire(lease, 200_000)  # 200k nodes, one chain
    child, _ = pool.restore(cp, 200_000, 200_000)
    cp.release()
    assert pool.pages_used == 200_000
    child.release()
    assert (pool.pages_used, pool.snapshot().nodes) == (0, 0)


LINES = PoolConfig(
    (PagedState("kv", 1),),
    (SeqState("gdn", 24),),
    unit=4,
    row_pages=4,
    chunk=4,
    chunks=64,
    first_slots=4,
    line_tables=(LineTable("line_index", "gdn", 3, 8), LineTable("wide", "gdn", 2, 12, width=4)),
)


def test_seq_line_is_slot_times_lines_per_slot_plus_row() -> None:
    pool, _ = Pool.create(LINES)
    a, b = pool.lease(4), pool.lease(8)
    assert (a.state_slot, b.state_slot) == (0, 1)
    # 24-byte slots: 3 lines of 8 bytes (line_index), 2 lines of 12 bytes (wide)
    assert [b.seq_line("line_index", r) for r in range(3)] == [3, 4, 5]
    assert [a.seq_line("line_index", r) for r in range(3)] == [0, 1, 2]
    assert [b.seq_line("wide", r) for r in range(2)] == [2, 3]
    assert (b.seq_lines("line_index"), b.seq_width("line_index")) == (3, 1)
    assert (b.seq_lines("wide"), b.seq_width("wide")) == (2, 4)
    only = pool.lease_slot()
    assert only.seq_line("line_index", 2) == only.state_slot * 3 + 2  # pyright: ignore[reportOptionalOperand]
    before = pool.snapshot()
    for call, line in [
        (lambda: b.seq_line("line_index", 3), r"^'line_index' has 3 line\(s\) per sequence: r must be an int in \[0, 3\), got 3$"),
        (lambda: b.seq_line("line_index", -1), r"got -1$"),
        (lambda: b.seq_line("line_index", True), r"got True$"),
        (lambda: b.seq_line("nope", 0), r"^'nope' is not a line table of this pool \(line tables: line_index, wide\)$"),
        (lambda: b.seq_width("nope"), r"^'nope' is not a line table"),
        (lambda: b.seq_lines("nope"), r"^'nope' is not a line table"),
    ]:
        with pytest.raises(ApiError, match=line):
            call()
    assert pool.snapshot() == before
    a.release()
    with pytest.raises(ApiError, match="released"):
        a.seq_line("line_index", 0)
