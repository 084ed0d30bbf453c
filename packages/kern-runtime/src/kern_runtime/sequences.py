"""Sequence memory: kern_pool's decisions executed on VMM arenas.

Every paged and per-seq state is one arena: an address range reserved once (never moved) whose
chunk positions are mapped to physical chunks as kern_pool's `Remap` plans say. Page p of a paged
state lives at `base + p * page_bytes`, slot s of a per-seq state at `base + s * slot_bytes`, so
programs address states by their base and the graphs captured at load stay valid across remaps.

A remap plan runs on a background thread: an event recorded on the stream when the plan is made
marks the work that may still touch the chunks it unmaps; the thread waits for that event, then
unmaps, maps and grants. The plan that landed is collected on the caller's thread at the next
lease / checkpoint / restore / fork (or `settle`): the objects it made are zeroed on the stream,
then `Pool.complete` makes them leasable. At most one plan is in flight (the pool's rule).

The host tier (optional) is one pinned host block under kern_pool's `Host`: a host unit is the gcd
of one page of every paged state end to end and one slot of every per-seq state; a parked page is
its paged states' pages side by side in `page_units` units, a parked slot its per-seq states'
slots side by side. Runs of consecutive pages (`kern_pool.fold`) move as one copy per state (a
2-D copy when the host rows interleave several states). `park(room)` and `wake(.., tokens)` copy on
a transfer stream that starts after everything queued on the compute stream (an event) and which
the compute stream never waits for; every in-flight copy holds the handles it reads and writes
until it landed. `park_now` (and `park(checkpoint)` / `wake(parked, length)`) copy on the compute
stream, ordered with the kernels that touch the same pages. `wake_now` stages its copies on the
transfer stream slice by slice (a paged state's declared `slices`, else whole pages), an event
after each: the runtime makes each eager call wait only for the slices it touches, and everything
else on the compute stream (graphs, captures, zeroing, device copies, remap plans) for them all.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import kern_pool
from kern_manifest import Manifest
from kern_manifest.schema import Call, StateArg
from kern_pool import (
    Capacity,
    Checkpoint,
    DeviceCopies,
    Lease,
    Parked,
    Pool,
    PoolConfig,
    Remap,
    Room,
)

from . import _driver as drv
from . import memory
from .errors import ApiError

__all__ = ["Arena", "Sequences", "Waking", "pool_config_for", "pool_layout"]

T = TypeVar("T")


class _Positioned(Protocol):
    @property
    def position(self) -> int: ...


S = TypeVar("S", bound=_Positioned)


@dataclass(slots=True)
class Arena:
    """One pooled state's reserved range: base, reserved bytes, object size, mapped positions."""

    name: str
    base: int
    reserved: int
    object_bytes: int
    mapped: set[int] = field(default_factory=set[int])


def _index_buffers(manifest: Manifest, state: str) -> list[tuple[int, int]]:
    """(stride, last-dim size at the var maxima) of every buffer whose domain indexes `state`."""
    out: list[tuple[int, int]] = []
    env = manifest.var_max
    for b in manifest.buffers.values():
        if b.domain is not None and b.domain.index_into == state:
            out.append((b.domain.stride or 1, b.shape[-1].eval(env) if b.shape else 1))
    return out


def pool_layout(manifest: Manifest) -> tuple[tuple[kern_pool.PagedState, ...], tuple[kern_pool.SeqState, ...], int, int]:
    """(paged states, per-seq states, tokens per page, pages per table row) from the manifest."""
    paged = tuple(kern_pool.PagedState(n, s.bytes_per_token) for n, s in manifest.states.items() if s.bytes_per_token)
    per_seq = tuple(kern_pool.SeqState(n, s.bytes_per_seq) for n, s in manifest.states.items() if s.bytes_per_seq)
    tables = [t for p in paged for t in _index_buffers(manifest, p.name)]
    unit = math.lcm(*[s for s, _ in tables]) if tables else 1
    row = max((w for s, w in tables if s > 1), default=0)
    return paged, per_seq, unit, row


def pool_config_for(manifest: Manifest, capacity: Capacity, free_bytes: int | None = None) -> PoolConfig | None:
    """The pool of a manifest's paged and per-seq states for `capacity` (None: no such state).

    With `capacity.tokens` set, each state gets its own whole-chunk budget (tokens rounded down to
    the page unit, at least one page). With tokens None, `free_bytes` (the device memory still
    free once buffers, scratch and fixed states are allocated) less kern_pool's 1 GiB headroom
    becomes the budget. The row width is the widest block table, else the whole budget.

    Raises:
        ApiError: tokens None without free_bytes, or too little free memory for the slots and a page.
    """
    paged, per_seq, unit, row = pool_layout(manifest)
    if not paged and not per_seq:
        return None
    if capacity.tokens is None:
        if free_bytes is None:
            raise ApiError("Capacity(tokens=None) sizes the pool from free device memory: pass free_bytes")
        cap = capacity
    else:
        cap = Capacity(tokens=max(capacity.tokens // unit * unit, unit), seqs=capacity.seqs)
    rows = row or -(-(cap.tokens or unit) // unit)
    try:
        config = kern_pool.pool_config(paged, per_seq, unit=unit, row_pages=rows, capacity=cap, free_bytes=free_bytes)
    except kern_pool.ConfigError as exc:
        raise ApiError(f"{_budget_text(free_bytes)} cannot hold the pool: {exc}") from None
    if cap.tokens is None and not row:
        config = dataclasses.replace(config, row_pages=max(config.pages_max, 1))
    if cap.tokens is None and paged and config.pages_max == 0:
        raise ApiError(f"{_budget_text(free_bytes)} holds no page beyond the 1 GiB headroom: free device memory first")
    return config


def _budget_text(free_bytes: int | None) -> str:
    return "the capacity" if free_bytes is None else f"{free_bytes} free device bytes"


@dataclass(slots=True)
class _Flight:
    """A remap plan on the background thread."""

    plan: Remap
    event: Any
    thread: threading.Thread = field(init=False)
    error: BaseException | None = None


@dataclass(slots=True)
class _Transfer:
    """Copies queued on the transfer stream and the handles they read and write until they land."""

    event: Any
    """The transfer stream's event after the copies; None once they landed and it was destroyed."""
    holds: list[Checkpoint | Parked | Lease]
    slices: list[Any] = field(default_factory=list[Any])
    """A staged wake's events, one after each slice's copies (destroyed when it lands)."""


Slice = tuple[str, int]
"""(pooled state, slice of each page): what a call touches and a staged wake fills in turn."""


def _runs(pairs: Iterable[tuple[int, int]], device_first: bool, per_object: int) -> list[tuple[int, int, int]]:
    """(device object, host unit, count) runs of consecutive `pairs`, given as (device object,
    host unit) or, not `device_first`, as (host unit, device object); a host object is
    `per_object` units."""
    if device_first:
        return [(r.src, r.dst, r.count) for r in kern_pool.fold(pairs, 1, per_object)]
    return [(r.dst, r.src, r.count) for r in kern_pool.fold(pairs, per_object, 1)]


def _offsets(arenas: list[Arena]) -> list[int]:
    """Where each arena's part of a host object starts: after the arenas before it."""
    return list(itertools.accumulate((a.object_bytes for a in arenas), initial=0))


def _device_first(copies: kern_pool.WakeCopies) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """A wake's (host unit, device object) pairs turned to (device object, host unit)."""
    slot = (copies.slot[1], copies.slot[0]) if copies.slot is not None else None
    return [(p, u) for u, p in copies.pages], slot


class Waking:
    """A lease being filled from the host tier on the transfer stream (`Runtime.wake` with
    tokens). `Runtime.awake` hands the lease over once the copies landed; `release()` before
    that waits for the copies, then gives the pages back. Factory-only."""

    __slots__ = ("_lease", "_live", "_seqs", "_transfer")

    def __init__(self, seqs: Sequences, lease: Lease, transfer: _Transfer) -> None:
        self._seqs = seqs
        self._lease = lease
        self._transfer = transfer
        self._live = True

    @property
    def live(self) -> bool:
        """False once awake or released."""
        return self._live

    @property
    def length(self) -> int:
        """Tokens being woken (the lease's prefix)."""
        return self._lease.prefix

    def release(self) -> None:
        """Waits for the copies, then gives the lease's pages and slot back.

        Raises:
            ApiError: already awake or released.
        """
        self._seqs.mine_waking(self)
        self._live = False
        if self._transfer.event is not None:
            drv.event_synchronize(self._transfer.event)
        self._seqs.land(self._transfer)
        self._lease.release()


class Sequences:
    """The pool of one runtime: arenas, physical chunks, executed plans, the host tier."""

    def __init__(self, stack: ExitStack, dev: Any, stream: Any, config: PoolConfig, ctx: Any = None,
                 slices: Mapping[str, int] | None = None) -> None:
        self._stack = stack
        self._dev = dev
        self._ctx = ctx
        self._stream = stream
        self.config = config
        self._host: kern_pool.Host | None = None
        self._host_base = 0
        self._host_unit = 0
        self._transfer: Any = None
        self._order: Any = None
        self._flying: list[_Transfer] = []
        self._pending: dict[Slice, tuple[Any, _Transfer]] = {}
        self._flight: _Flight | None = None
        gran = drv.vmm_granularity(dev)
        if config.chunk % gran:
            raise ApiError(f"pool chunk {config.chunk} is not a multiple of the device granularity {gran}")
        self.pool, plan = Pool.create(config)
        sizes = config.page_bytes + config.slot_bytes
        counts = [config.pages_max] * len(config.paged) + [config.slots_max] * len(config.per_seq)
        self.arenas: dict[str, Arena] = {}
        for name, size, count in zip(config.arenas, sizes, counts, strict=True):
            reserved = max(1, -(-count * size // config.chunk)) * config.chunk
            base = drv.vmm_reserve(reserved, gran)
            stack.callback(drv.vmm_free_address, base, reserved)
            arena = Arena(name, base, reserved, size)
            stack.callback(self._unmap_all, arena)
            self.arenas[name] = arena
        self.slices = self._check_slices(slices or {})
        self._handles: list[Any] = []
        for _ in range(config.chunks):
            handle = drv.vmm_create(config.chunk, dev)
            stack.callback(drv.vmm_release, handle)
            self._handles.append(handle)
        self._execute(plan)  # NOTE: the initial plan counts as landed; the pool expects no complete()
        for arena in self.arenas.values():
            for pos in sorted(arena.mapped):
                drv.memset_async(arena.base + pos * config.chunk, config.chunk, stream)
        stack.callback(self._join)  # NOTE: runs before the unmaps above (an ExitStack unwinds LIFO)

    def _check_slices(self, slices: Mapping[str, int]) -> dict[str, int]:
        """Slices per page of every paged state (1 unless declared), each dividing its page."""
        out = {s.name: 1 for s in self.config.paged}
        for name, n in slices.items():
            if name not in out:
                raise ApiError(f"slices for {name!r}, which is not a paged state ({sorted(out) or 'none'})")
            if type(n) is not int or n < 1 or self.arenas[name].object_bytes % n:
                raise ApiError(f"{n!r} slices do not divide state {name!r}'s {self.arenas[name].object_bytes}-byte page")
            out[name] = n
        return out

    def touched(self, state: str, offset: int | None) -> tuple[Slice, ...]:
        """The slices a call touches through `state` at byte `offset` of a page or slot (None: an
        offset read from vars, every slice)."""
        n = self.slices.get(state, 1)
        if offset is None or n == 1:
            return tuple((state, i) for i in range(n))
        return ((state, min(offset * n // self.arenas[state].object_bytes, n - 1)),)

    def call_slices(self, calls: Sequence[Call]) -> dict[int, tuple[Slice, ...]]:
        """Call position -> the pooled states' slices its state args touch (calls touching none
        left out)."""
        out: dict[int, tuple[Slice, ...]] = {}
        for position, call in enumerate(calls):
            keys = [k for a in call.args if isinstance(a, StateArg) and a.state in self.arenas
                    for k in self.touched(a.state, None if a.offset.vars else a.offset.eval({}))]
            if keys:
                out[position] = tuple(keys)
        return out

    def _unmap_all(self, arena: Arena) -> None:
        for pos in sorted(arena.mapped):
            drv.vmm_unmap(arena.base + pos * self.config.chunk, self.config.chunk)
        arena.mapped.clear()

    def _execute(self, plan: Remap) -> None:
        chunk = self.config.chunk
        for u in plan.unmaps:
            arena = self.arenas[u.arena]
            drv.vmm_unmap(arena.base + u.pos * chunk, chunk)
            arena.mapped.discard(u.pos)
        for m in plan.maps:
            arena = self.arenas[m.arena]
            drv.vmm_map(arena.base + m.pos * chunk, chunk, self._handles[m.chunk])
            arena.mapped.add(m.pos)
        for g in plan.grants:
            arena = self.arenas[g.arena]
            drv.vmm_set_access(arena.base + g.start * chunk, (g.stop - g.start) * chunk, self._dev)

    @property
    def spans(self) -> Mapping[str, tuple[int, int]]:
        """Each pooled state's (base, reserved bytes): what programs address."""
        return {n: (a.base, a.reserved) for n, a in self.arenas.items()}

    # ---- remap plans on a background thread ------------------------------------------------

    @property
    def remapping(self) -> bool:
        """True while a plan is in flight (made, not yet collected)."""
        return self.pool.pending is not None

    def _launch_plan(self) -> None:
        """Starts the pool's pending plan on the background thread (once per plan)."""
        plan = self.pool.pending
        if plan is None or self._flight is not None:
            return
        self.await_staged()  # NOTE: a staged wake's pages, released early, may be among the unmapped
        event = drv.event_create(timing=False)
        drv.event_record(event, self._stream)
        flight = _Flight(plan, event)
        flight.thread = threading.Thread(target=self._land_plan, args=(flight,), name="kern-remap", daemon=True)
        self._flight = flight
        flight.thread.start()

    def _land_plan(self, flight: _Flight) -> None:
        try:
            if self._ctx is not None:
                drv.set_current(self._ctx)
            drv.event_synchronize(flight.event)
            self._execute(flight.plan)
        except BaseException as exc:  # NOTE: re-raised on the caller's thread by _collect
            flight.error = exc

    def _collect(self) -> None:
        """Takes a landed plan in: zeroes what it made on the stream, completes it in the pool."""
        flight = self._flight
        if flight is None or flight.thread.is_alive():
            return
        flight.thread.join()
        self._flight = None
        drv.event_destroy(flight.event)
        if flight.error is not None:
            raise flight.error
        self._zero_pages(flight.plan.made_pages)
        for s in flight.plan.made_slots:
            self._zero_slot(s)
        self.pool.complete(flight.plan)

    def _join(self) -> None:
        if self._flight is not None:
            self._flight.thread.join()

    def settle(self) -> None:
        """Blocks until the plan in flight (if any) has landed and is collected."""
        self._launch_plan()
        if self._flight is not None:
            self._flight.thread.join()
        self._collect()
        self._reap()

    def _retry(self, ask: Callable[[], T], wait: bool) -> T:
        self._collect()
        for _ in range(4):
            try:
                return ask()
            except kern_pool.Remapping:
                self._launch_plan()
                if not wait:
                    raise
                self.settle()
        return ask()

    # ---- leases ------------------------------------------------------------------------------

    def _paged(self) -> list[Arena]:
        return [self.arenas[s.name] for s in self.config.paged]

    def _seq(self) -> list[Arena]:
        return [self.arenas[s.name] for s in self.config.per_seq]

    def _zero_pages(self, pages: Iterable[int]) -> None:
        """Zeroes pages on the stream, one memset per state for each run of consecutive pages."""
        self.await_staged()
        arenas = self._paged()
        for run in kern_pool.fold(((p, p) for p in pages), 1, 1):
            for a in arenas:
                drv.memset_async(a.base + run.src * a.object_bytes, run.count * a.object_bytes, self._stream)

    def _zero_slot(self, slot: int) -> None:
        self.await_staged()
        for a in self._seq():
            drv.memset_async(a.base + slot * a.object_bytes, a.object_bytes, self._stream)

    def lease(self, tokens: int, wait: bool = True) -> Lease:
        """Fresh pages for `tokens` (and a slot), zeroed on the stream before anything reads them.
        With `wait` False a plan in flight is `kern_pool.Remapping` instead of a wait."""
        lease = self._retry(lambda: self.pool.lease(tokens), wait)
        self._zero_pages(lease.pages)
        if lease.state_slot is not None:
            self._zero_slot(lease.state_slot)
        return lease

    def lease_slot(self, wait: bool = True) -> Lease:
        """A slot-only lease (a peer rank's share of a row): one fresh slot, zeroed on the stream."""
        lease = self._retry(self.pool.lease_slot, wait)
        if lease.state_slot is not None:
            self._zero_slot(lease.state_slot)
        return lease

    def retire(self, lease: Lease, length: int) -> Checkpoint:
        """Ends the lease and keeps its first `length` tokens in place: no copy, no device work
        (the partial page and the slot change owner; pages past `length` go back to the pool)."""
        return self.pool.retire(lease, length)

    def copy(self, copies: DeviceCopies) -> None:
        """Performs a pool decision's page and slot copies on the stream, in order."""
        self.await_staged()
        for src, dst in copies.pages:
            for a in self._paged():
                drv.copy_dtod_async(a.base + dst * a.object_bytes, a.base + src * a.object_bytes, a.object_bytes, self._stream)
        if copies.slot is not None:
            src, dst = copies.slot
            for a in self._seq():
                drv.copy_dtod_async(a.base + dst * a.object_bytes, a.base + src * a.object_bytes, a.object_bytes, self._stream)

    def checkpoint(self, lease: Lease, length: int, wait: bool = True) -> Checkpoint:
        """Keeps the lease's first `length` tokens (partial page and slot copied on the stream)."""
        cp, copies = self._retry(lambda: self.pool.checkpoint(lease, length), wait)
        self.copy(copies)
        return cp

    def restore(self, checkpoint: Checkpoint, length: int, tokens: int, wait: bool = True) -> Lease:
        """A new lease from a checkpoint's first `length` tokens, with room for `tokens`."""
        lease, copies = self._retry(lambda: self.pool.restore(checkpoint, length, tokens), wait)
        self._zero_owned(lease, copies.pages)
        self.copy(copies)
        return lease

    def fork(self, parent: Lease, length: int, tokens: int, wait: bool = True) -> Lease:
        """A new lease sharing the parent's first `length` tokens."""
        lease, copies = self._retry(lambda: self.pool.fork(parent, length, tokens), wait)
        self._zero_owned(lease, copies.pages)
        self.copy(copies)
        return lease

    def _zero_owned(self, lease: Lease, filled: Sequence[tuple[int, int]]) -> None:
        """Zeroes the lease's own pages except the partial page a copy fills (a restore's copies
        end with it: the pool's and the host's alike)."""
        if not lease.paged:
            return
        skip = filled[-1][1] if filled else None
        self._zero_pages(p for p in lease.own_pages if p != skip)

    # ---- host tier: the block ----------------------------------------------------------------

    def _units(self) -> tuple[int, int, int]:
        """(unit bytes, units per page, units per slot)."""
        page = sum(self.config.page_bytes)
        slot = sum(self.config.slot_bytes)
        unit = math.gcd(page, slot)
        return unit, max(page // unit, 1), max(slot // unit, 1)

    def reserve_host(self, pages: int, slots: int) -> kern_pool.Host:
        """One pinned block for `pages` parked pages and `slots` parked slots, on the GPU's NUMA
        node, under kern_pool's host tier (once per runtime).

        Raises:
            ApiError: already reserved, or counts that are not ints >= 0 holding nothing.
        """
        for name, value in (("pages", pages), ("slots", slots)):
            if type(value) is not int or value < 0:
                raise ApiError(f"reserve_host: {name} must be an int >= 0, got {value!r}")
        _, page_units, slot_units = self._units()
        units = pages * page_units * bool(self.config.paged) + slots * slot_units * bool(self.config.per_seq)
        if units == 0:
            raise ApiError(f"reserve_host({pages}, {slots}) holds nothing: give pages (or slots, with per-seq states)")
        return self._reserve(units)

    def enable_host(self, nbytes: int) -> kern_pool.Host:
        """A pinned host block of the largest whole number of units within `nbytes` (once).

        Raises:
            ApiError: already enabled, or `nbytes` holds no page or slot.
        """
        unit, _, _ = self._units()
        need = min(b for b in (sum(self.config.page_bytes), sum(self.config.slot_bytes)) if b)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < need:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"a host tier of {nbytes!r} bytes holds no page or slot: give at least {need} bytes")
        return self._reserve(nbytes // unit)

    def _reserve(self, units: int) -> kern_pool.Host:
        if self._host is not None:
            raise ApiError(f"the host tier is already enabled ({self._host.units} units of {self._host_unit} bytes)")
        unit, page_units, slot_units = self._units()
        block = memory.host_near(self._stack, self._dev, units * unit)
        self._transfer = drv.stream_create()
        self._stack.callback(drv.stream_destroy, self._transfer)
        self._order = drv.event_create(timing=False)
        self._stack.callback(drv.event_destroy, self._order)
        self._stack.callback(self._drain)  # NOTE: before the stream, event and block go
        self._host = kern_pool.Host(self.pool, units, page_units=page_units, slot_units=slot_units)
        self._host_base, self._host_unit = block.ptr, unit
        return self._host

    @property
    def host(self) -> kern_pool.Host:
        """The host tier's planner (for schedulers that read its counts).

        Raises:
            ApiError: the host tier is not enabled.
        """
        if self._host is None:
            raise ApiError("no host tier: reserve it first (Runtime.reserve_host or enable_host_tier)")
        return self._host

    # ---- host tier: copies -------------------------------------------------------------------

    def _rows(self, dst: int, dst_pitch: int, to_host: bool, src: int, src_pitch: int, width: int, height: int, stream: Any) -> None:
        """`height` rows of `width` bytes: one 1-D copy when both sides are contiguous, else 2-D."""
        if height == 1 or (dst_pitch == width and src_pitch == width):
            copy = drv.copy_dtoh_async if to_host else drv.copy_htod_async
            copy(dst, src, width * height, stream)
        else:
            drv.copy_2d_async(dst, dst_pitch, not to_host, src, src_pitch, to_host, width, height, stream)

    def _object_copies(self, pairs: Iterable[tuple[int, int]], device_first: bool, arenas: list[Arena], per_object: int,
                       to_host: bool, stream: Any) -> None:
        """Device objects <-> host units, `pairs` in order as (device object, host unit), or as
        (host unit, device object) when not `device_first` (a wake decision's own order), folded
        into runs; each arena's part of a host object sits after the arenas before it."""
        host_pitch = per_object * self._host_unit
        offsets = _offsets(arenas)
        for run in _runs(pairs, device_first, per_object):
            for a, off in zip(arenas, offsets, strict=False):
                self._run_rows(a, run, off, 0, a.object_bytes, host_pitch, to_host, stream)

    def _run_rows(self, a: Arena, run: tuple[int, int, int], host_at: int, lo: int, width: int, host_pitch: int,
                  to_host: bool, stream: Any) -> None:
        """Bytes [lo, lo + width) of each object of one run (device object, host unit, count) of
        arena `a`, to or from the host, where `a`'s part of a host object starts `host_at` bytes in."""
        obj, unit, count = run
        dev = a.base + obj * a.object_bytes + lo
        at = self._host_base + unit * self._host_unit + host_at + lo
        if to_host:
            self._rows(at, host_pitch, True, dev, a.object_bytes, width, count, stream)
        else:
            self._rows(dev, a.object_bytes, False, at, host_pitch, width, count, stream)

    def _host_copies(self, pages: Iterable[tuple[int, int]], slot: tuple[int, int] | None, to_host: bool, stream: Any,
                     device_first: bool = True) -> None:
        """Pages and the slot, each as (device object, host unit) (or, not `device_first`, as
        (host unit, device object)), to or from the host block."""
        host = self.host
        self._object_copies(pages, device_first, self._paged(), host.page_units, to_host, stream)
        self._object_copies([slot] if slot is not None else [], device_first, self._seq(), host.slot_units, to_host, stream)

    def _out(self, copies: kern_pool.ParkCopies, stream: Any) -> None:
        self._host_copies(copies.pages, copies.slot, True, stream)

    def _in(self, copies: kern_pool.WakeCopies, stream: Any) -> None:
        self._host_copies(copies.pages, copies.slot, False, stream, device_first=False)

    def _on_transfer(self, run: Callable[[Any], None], holds: list[Checkpoint | Parked | Lease]) -> _Transfer:
        """Queues copies on the transfer stream after everything queued on the compute stream."""
        drv.event_record(self._order, self._stream)
        drv.stream_wait_event(self._transfer, self._order)
        run(self._transfer)
        event = drv.event_create(timing=False)
        drv.event_record(event, self._transfer)
        transfer = _Transfer(event, holds)
        self._flying.append(transfer)
        return transfer

    def _on_compute(self) -> Any:
        """The compute stream, made to wait for the transfer stream only while copies there are
        in flight (a compute-stream copy may read or write what they do)."""
        self._reap()
        if self._flying:
            drv.stream_wait_event(self._stream, self._flying[-1].event)
            self._pending.clear()
        return self._stream

    # ---- staged wakes: calls wait for their own slices -----------------------------------------

    @property
    def pending(self) -> bool:
        """True while a staged wake's slices are not yet waited for by the compute stream."""
        return bool(self._pending)

    def await_slices(self, keys: Iterable[Slice]) -> None:
        """Makes the compute stream wait for these slices' staged copies still pending."""
        for key in keys:
            got = self._pending.pop(key, None)
            if got is not None:
                drv.stream_wait_event(self._stream, got[0])

    def staged(self, steps: Iterable[S], touch: Mapping[int, tuple[Slice, ...]]) -> Iterator[S]:
        """`steps` (anything with a call `position`), each yielded once the compute stream waits
        for the pending slices its call touches (`touch`: `call_slices` of its program)."""
        for step in steps:
            keys = touch.get(step.position)
            if keys is not None:
                self.await_slices(keys)
            yield step

    def await_staged(self) -> None:
        """Makes the compute stream wait for every staged copy still pending (before a graph, a
        capture, or pool work on the compute stream)."""
        if not self._pending:
            return
        staged = {id(t) for _, t in self._pending.values()}
        last = next(t for t in reversed(self._flying) if id(t) in staged)
        drv.stream_wait_event(self._stream, last.event)
        self._pending.clear()

    def land(self, transfer: _Transfer) -> None:
        """Lets the handles of landed copies go."""
        # NOTE: a Waking's transfer may be landed by a reap (synchronize) before its awake: the
        # event is destroyed once, and `landed` answers from the None left behind.
        if transfer in self._flying:
            self._flying.remove(transfer)
        if transfer.event is not None:
            drv.event_destroy(transfer.event)
            transfer.event = None
        if transfer.slices:
            for key in [k for k, (_, t) in self._pending.items() if t is transfer]:
                del self._pending[key]
            for e in transfer.slices:
                drv.event_destroy(e)
            transfer.slices.clear()
        for h in transfer.holds:
            if h.live:
                h.release()
        transfer.holds.clear()

    def _reap(self) -> None:
        """Lets every landed transfer go, in stream order (no blocking)."""
        while self._flying and drv.event_query(self._flying[0].event):
            self.land(self._flying[0])

    def _drain(self) -> None:
        for t in list(self._flying):
            drv.event_synchronize(t.event)
            self.land(t)

    def synchronize_transfers(self) -> None:
        """Blocks until every copy on the transfer stream landed."""
        if self._transfer is not None:
            drv.stream_synchronize(self._transfer)
        self._reap()

    # ---- host tier: park ---------------------------------------------------------------------

    def room(self, checkpoint: Checkpoint) -> Room | Checkpoint:
        """Host units for a park of `checkpoint` (the room holds it), or `checkpoint` back."""
        self._reap()
        return self.host.room(checkpoint)

    def park_room(self, room: Room) -> Parked:
        """Fills a room on the transfer stream; the room's checkpoint is held until the copies
        landed, then released (its pages go back to the pool)."""
        host = self.host
        checkpoint = room.checkpoint
        parked, copies = host.park(room)
        self._on_transfer(lambda s: self._out(copies, s), [checkpoint, parked.clone()])
        return parked

    def park(self, checkpoint: Checkpoint) -> Parked:
        """Copies a checkpoint to the host tier on the compute stream; it stays valid.

        Raises:
            ApiError: no host tier, or a released / foreign checkpoint. kern_pool.HostFull: the host
                block cannot hold it; nothing was kept.
        """
        parked, copies = self.host.park(checkpoint)
        self._out(copies, self._on_compute())
        return parked

    def park_now(self, checkpoint: Checkpoint) -> Parked:
        """`park` that also lets the checkpoint go: its pages return at once, and what later
        reuses them is ordered after the copies on the compute stream."""
        parked = self.park(checkpoint)
        checkpoint.release()
        return parked

    def copy_out(self, copies: kern_pool.ParkCopies) -> None:
        """Performs another runtime's park decision (the same ids) on the compute stream.

        Raises:
            ApiError: a page, slot or unit outside this runtime's pool or host block.
        """
        self._check_ids(copies.pages, copies.slot)
        self._out(copies, self._on_compute())

    def copy_in(self, copies: kern_pool.WakeCopies) -> None:
        """Performs another runtime's wake decision (the same ids) on the compute stream.

        Raises:
            ApiError: a page, slot or unit outside this runtime's pool or host block.
        """
        pages, slot = _device_first(copies)
        self._check_ids(pages, slot)
        self._host_copies(pages, slot, False, self._on_compute())

    def _check_ids(self, pages: Sequence[tuple[int, int]], slot: tuple[int, int] | None) -> None:
        host = self.host
        for what, (obj, unit), limit, size in [
            *[("page", pair, self.pool.pages_max, host.page_units) for pair in pages],
            *([("slot", slot, self.pool.slots_max, host.slot_units)] if slot is not None else []),
        ]:
            if not 0 <= obj < limit:
                raise ApiError(f"{what} {obj} is outside this pool's {limit} {what}s")
            if not 0 <= unit <= host.units - size:
                raise ApiError(f"host unit {unit} ({what}) is outside this host block's {host.units} units")

    # ---- host tier: wake ---------------------------------------------------------------------

    def wake(self, parked: Parked, length: int) -> Checkpoint:
        """A device checkpoint of a parked copy's first `length` tokens: fresh pages and slot,
        filled by host-to-device copies on the compute stream.

        Raises:
            ApiError: no host tier, a released / foreign Parked, or a bad length. kern_pool.Denied:
                the pool cannot give the pages or slot now.
        """
        host = self.host
        checkpoint, copies = self._retry(lambda: host.wake(parked, length), True)
        self._in(copies, self._on_compute())
        return checkpoint

    def _restore(self, parked: Parked, length: int, tokens: int, wait: bool) -> tuple[Lease, kern_pool.WakeCopies]:
        host = self.host
        lease, copies = self._retry(lambda: host.restore(parked, length, tokens), wait)
        self._zero_owned(lease, copies.pages)
        return lease, copies

    def wake_now(self, parked: Parked, length: int, tokens: int, wait: bool = True) -> Lease:
        """A lease of `tokens` from a parked copy's first `length` tokens, usable at once: staged
        on the transfer stream slice by slice (the slot first), an event after each. Until the
        compute stream waited for them (`await_slices` per call, `await_staged` for everything
        else), the slices are pending; pool work on the compute stream waits for them all."""
        lease, copies = self._restore(parked, length, tokens, wait)
        marks: list[tuple[list[Slice], Any]] = []
        transfer = self._on_transfer(lambda s: marks.extend(self._in_staged(copies, s)), [parked.clone()])
        for keys, event in marks:
            transfer.slices.append(event)
            for key in keys:
                self._pending[key] = (event, transfer)
        return lease

    def _in_staged(self, copies: kern_pool.WakeCopies, stream: Any) -> list[tuple[list[Slice], Any]]:
        """A wake's copies on `stream`: the slot, then slice 0 of every page of every paged state,
        slice 1, ...; each followed by an event, returned with the slices it closes."""
        marks: list[tuple[list[Slice], Any]] = []
        if copies.slot is not None:
            self._object_copies([copies.slot], False, self._seq(), self.host.slot_units, False, stream)
            marks.append(([(a.name, 0) for a in self._seq()], self._mark(stream)))
        if not copies.pages:
            return marks
        host_pitch = self.host.page_units * self._host_unit
        runs = _runs(copies.pages, False, self.host.page_units)
        offsets = _offsets(self._paged())
        for i in range(max(self.slices.values())):
            keys: list[Slice] = []
            for a, off in zip(self._paged(), offsets, strict=False):
                n = self.slices[a.name]
                if i >= n:
                    continue
                width = a.object_bytes // n
                for run in runs:
                    self._run_rows(a, run, off, i * width, width, host_pitch, False, stream)
                keys.append((a.name, i))
            marks.append((keys, self._mark(stream)))
        return marks

    @staticmethod
    def _mark(stream: Any) -> Any:
        event = drv.event_create(timing=False)
        drv.event_record(event, stream)
        return event

    def wake_async(self, parked: Parked, length: int, tokens: int, wait: bool = True) -> Waking:
        """A Waking: the lease's pages filled on the transfer stream; `awake` hands it over."""
        lease, copies = self._restore(parked, length, tokens, wait)
        transfer = self._on_transfer(lambda s: self._in(copies, s), [parked.clone()])
        return Waking(self, lease, transfer)

    def mine_waking(self, waking: Waking) -> None:
        if not isinstance(waking, Waking):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"waking must be a Waking, got {type(waking).__name__}")
        if waking._seqs is not self:  # pyright: ignore[reportPrivateUsage]
            raise ApiError("this Waking belongs to another runtime")
        if not waking._live:  # pyright: ignore[reportPrivateUsage]
            raise ApiError("this Waking is awake or released; it holds nothing")

    def landed(self, waking: Waking) -> bool:
        """True once the Waking's copies have landed (never blocks)."""
        self.mine_waking(waking)
        event = waking._transfer.event  # pyright: ignore[reportPrivateUsage]
        return event is None or drv.event_query(event)

    def awake(self, waking: Waking) -> Lease | Waking:
        """The woken lease once its copies landed, else `waking` itself (never blocks)."""
        if not self.landed(waking):
            return waking
        waking._live = False  # pyright: ignore[reportPrivateUsage]
        self.land(waking._transfer)  # pyright: ignore[reportPrivateUsage]
        self._reap()
        return waking._lease  # pyright: ignore[reportPrivateUsage]
