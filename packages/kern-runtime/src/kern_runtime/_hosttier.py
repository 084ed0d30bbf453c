"""The host tier of a runtime's sequence memory: one pinned block under kern_pool's `Host`, the
park and wake copies, the transfer stream and the staged wake's slices. `HostTier` is the part of
`Sequences` (its base class) that owns them; `Sequences` owns the arenas, remap plans and leases.

A host unit is the gcd of one page of every paged state end to end and one slot of every per-seq
state; a parked page is its paged states' pages side by side in `page_units` units, a parked slot
its per-seq states' slots side by side. Runs of consecutive pages (`kern_pool.fold`) move as one
copy per state (a 2-D copy when the host rows interleave several states). `park(room)` and
`wake(.., tokens)` copy on a transfer stream that starts after everything queued on the compute
stream (an event) and which the compute stream never waits for; every in-flight copy holds the
handles it reads and writes until it landed. `park_now` (and `park(checkpoint)` /
`wake(parked, length)`) copy on the compute stream, ordered with the kernels that touch the same
pages. `wake_now` stages its copies on the transfer stream slice by slice (a paged state's
declared `slices`, else whole pages), an event after each: the runtime makes each eager call wait
only for the slices it touches, and everything else on the compute stream (graphs, captures,
zeroing, device copies, remap plans) for them all.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import kern_pool
from kern_pool import Checkpoint, Lease, Parked, Pool, PoolConfig, Room

from . import _driver as drv
from . import memory
from .errors import ApiError

if TYPE_CHECKING:
    from .sequences import Arena

__all__ = ["HostTier", "Slice", "Waking"]

T = TypeVar("T")


class _Positioned(Protocol):
    @property
    def position(self) -> int: ...


S = TypeVar("S", bound=_Positioned)


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

    def __init__(self, seqs: HostTier, lease: Lease, transfer: _Transfer) -> None:
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


class HostTier:
    """The host tier's part of `Sequences` (its base class): the pinned block, park and wake,
    the transfer stream and the staged wake's slices."""

    if TYPE_CHECKING:  # NOTE: what it reads of the Sequences it is part of
        config: PoolConfig
        pool: Pool
        slices: dict[str, int]
        _stream: Any
        _stack: ExitStack
        _dev: Any

        def _paged(self) -> list[Arena]: ...

        def _seq(self) -> list[Arena]: ...

        def _retry(self, ask: Callable[[], T], wait: bool) -> T: ...

        def _zero_owned(self, lease: Lease, filled: Sequence[tuple[int, int]]) -> None: ...

    def _init_host_tier(self) -> None:
        self._host: kern_pool.Host | None = None
        self._host_base = 0
        self._host_unit = 0
        self._transfer: Any = None
        self._order: Any = None
        self._flying: list[_Transfer] = []
        self._pending: dict[Slice, tuple[Any, _Transfer]] = {}

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
