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

The host tier (optional: a pinned block, park and wake copies on a transfer stream, a staged
wake's slices) is `HostTier`, the base class `_hosttier.py` defines.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kern_pool
from kern_manifest import Manifest
from kern_manifest.schema import Call, StateArg
from kern_pool import (
    Capacity,
    Checkpoint,
    DeviceCopies,
    Lease,
    Pool,
    PoolConfig,
    Remap,
)

from . import _driver as drv
from ._hosttier import HostTier, Slice, Waking
from .errors import ApiError

__all__ = ["Arena", "Sequences", "Waking", "pool_config_for", "pool_layout"]

T = TypeVar("T")


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


class Sequences(HostTier):
    """The pool of one runtime: arenas, physical chunks, executed plans, the host tier."""

    def __init__(self, stack: ExitStack, dev: Any, stream: Any, config: PoolConfig, ctx: Any = None,
                 slices: Mapping[str, int] | None = None) -> None:
        self._stack = stack
        self._dev = dev
        self._ctx = ctx
        self._stream = stream
        self.config = config
        self._init_host_tier()
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
