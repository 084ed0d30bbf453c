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
    Checkpoint,
    Copies,
    Denied,
    Lease,
    PagedState,
    Pool,
    PoolConfig,
    Remap,
    SeqState,
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
        group = self.leases if i % 2 and self.leases or not self.cps else self.cps
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
