"""The host tier: a first-fit allocator over a pinned block, and park / wake of checkpoints.

Units are the host's accounting grain (the runtime sizes them: one page of every paged state end
to end, or a slot). Pages are placed from the low end, slots from the high end. Host pages form
chains like device pages, one refcounted node per page; a device node remembers its host twin,
so parking a later turn of the same chain copies only the pages that are new, and a checkpoint
woken from a parked copy that is still held parks again as that copy (nothing is copied).

A park is two steps when the caller needs to know there is room before any byte moves: `room`
reserves the units (or hands the checkpoint back), `park(room)` turns them into a `Parked`.
`fold` turns copy pairs into runs of consecutive objects, which the runtime moves as one
(2-D) copy each.
"""
# pyright: reportPrivateUsage=false
# NOTE: host.py is the pool's friend module: it builds checkpoints from the pool's internals.

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NewType

from kern_pool.chunks import PageId, SlotId
from kern_pool.errors import ApiError, ConfigError, HostFull
from kern_pool.pages import _KEY, Checkpoint, Copies, Lease, Node, Pool, Store, chain

__all__ = ["Host", "HostUnit", "ParkCopies", "Parked", "Room", "Run", "WakeCopies", "fold"]

HostUnit = NewType("HostUnit", int)

ParkCopies = Copies[tuple[PageId, HostUnit], tuple[SlotId, HostUnit]]
"""Device-to-host copies: (device page, host unit), (device slot, host unit)."""
WakeCopies = Copies[tuple[HostUnit, PageId], tuple[HostUnit, SlotId]]
"""Host-to-device copies: (host unit, device page), (host unit, device slot)."""


class HostNode:
    """One parked page of a chain; `alive` turns False when its units are freed."""

    __slots__ = ("alive", "depth", "parent", "refs", "unit")

    def __init__(self, unit: HostUnit, parent: HostNode | None, depth: int) -> None:
        self.unit = unit
        self.parent = parent
        self.depth = depth
        self.refs = 1
        self.alive = True


class HostStore:
    """What a Parked names: a host chain, an optional partial page, an optional slot."""

    __slots__ = ("length", "paged", "refs", "slot", "tail", "tip")

    def __init__(
        self, length: int, paged: bool, tip: HostNode | None, tail: HostUnit | None, slot: HostUnit | None
    ) -> None:
        self.length = length
        self.paged = paged
        self.tip = tip
        self.tail = tail
        self.slot = slot
        self.refs = 1


class Parked:
    """A checkpoint's copy on the host. Factory-only (`Host.park`); `release()` once per holder."""

    __slots__ = ("_host", "_live", "_store")

    def __init__(self, key: object, host: Host, store: HostStore) -> None:
        if key is not _KEY:
            raise ApiError("Parked is factory-only: use Host.park")
        self._host = host
        self._store = store
        self._live = True

    @property
    def live(self) -> bool:
        """False once released."""
        return self._live

    @property
    def length(self) -> int:
        """Tokens parked."""
        return self._store.length

    @property
    def stateful(self) -> bool:
        """True when a state slot is parked: usable only at exactly `length`."""
        return self._store.slot is not None

    @property
    def units(self) -> tuple[HostUnit, ...]:
        """Host units of the pages in token order (chain, then the partial page)."""
        self._host._mine(self)
        pages = [n.unit for n in chain(self._store.tip)]
        return tuple(pages + ([self._store.tail] if self._store.tail is not None else []))

    @property
    def slot_unit(self) -> HostUnit | None:
        """Host unit of the parked slot, or None."""
        self._host._mine(self)
        return self._store.slot

    def clone(self) -> Parked:
        """Another holder of the same parked copy.

        Raises:
            ApiError: released.
        """
        self._host._mine(self)
        self._store.refs += 1
        return Parked(_KEY, self._host, self._store)

    def release(self) -> None:
        """Drop this holder; the last one frees the host units no other chain shares.

        Raises:
            ApiError: already released.
        """
        self._host._mine(self)
        self._live = False
        self._host._drop(self._store)


@dataclass(frozen=True, slots=True)
class Run:
    """`count` consecutive copies: object `src + i * src_step` to `dst + i * dst_step`."""

    src: int
    dst: int
    count: int


def fold(pairs: Iterable[tuple[int, int]], src_step: int, dst_step: int) -> tuple[Run, ...]:
    """Folds `(src, dst)` copy pairs, in order, into runs where both sides advance by their step.

    Pages a pool hands out lowest-first and units a first-fit host places low-first are mostly
    consecutive, so a long checkpoint becomes a few runs (one copy each) instead of one per page.
    """
    out: list[Run] = []
    start_src = start_dst = next_src = next_dst = count = 0
    for src, dst in pairs:
        if count and src == next_src and dst == next_dst:
            count += 1
        else:
            if count:
                out.append(Run(start_src, start_dst, count))
            start_src, start_dst, count = src, dst, 1
        next_src, next_dst = src + src_step, dst + dst_step
    if count:
        out.append(Run(start_src, start_dst, count))
    return tuple(out)


class Room:
    """Host units reserved for one checkpoint's park (`Host.room`). Factory-only.

    `Host.park(room)` turns it into a Parked; `cancel()` gives the units back and hands the
    checkpoint back; `release()` gives both back.
    """

    __slots__ = ("_checkpoint", "_fresh", "_host", "_live", "_same", "_tip", "_units")

    def __init__(
        self,
        key: object,
        host: Host,
        checkpoint: Checkpoint,
        fresh: list[Node],
        units: list[HostUnit],
        tip: HostNode | None,
        same: HostStore | None,
    ) -> None:
        if key is not _KEY:
            raise ApiError("Room is factory-only: use Host.room")
        self._host = host
        self._checkpoint = checkpoint
        self._fresh = fresh
        self._units = units
        self._tip = tip
        self._same = same
        self._live = True

    @property
    def live(self) -> bool:
        """False once parked, cancelled or released."""
        return self._live

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint this room is for (still the caller's until the room is parked)."""
        self._host._mine_room(self)
        return self._checkpoint

    @property
    def units(self) -> int:
        """Host units reserved (0 when the checkpoint parks as a copy the host already holds)."""
        self._host._mine_room(self)
        return sum(self._host._sizes(self))

    def cancel(self) -> Checkpoint:
        """Gives the units back and hands the checkpoint back (not released).

        Raises:
            ApiError: the room was parked, cancelled or released.
        """
        self._host._mine_room(self)
        self._host._unroom(self)
        return self._checkpoint

    def release(self) -> None:
        """Gives the units back and releases the checkpoint.

        Raises:
            ApiError: the room was parked, cancelled or released.
        """
        self.cancel().release()


def _wake_copies(hs: HostStore, pairs: list[tuple[HostUnit, PageId]], slot: SlotId | None) -> WakeCopies:
    """A wake's copies: the page pairs, then the parked slot into the device `slot`."""
    return Copies(tuple(pairs), (hs.slot, slot) if hs.slot is not None and slot is not None else None)


class Host:
    """First-fit units over one pinned block, bound to one pool."""

    __slots__ = ("_runs", "_used", "page_units", "pool", "slot_units", "units")

    def __init__(self, pool: Pool, units: int, page_units: int, slot_units: int) -> None:
        """A host tier of `units`; one page takes `page_units`, one slot `slot_units`.

        Raises:
            ApiError: `pool` is not a Pool.
            ConfigError: a count is negative, or a unit size is not positive.
        """
        if not isinstance(pool, Pool):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"pool must be a kern_pool.Pool, got {type(pool).__name__}")
        for name, value, least in (("units", units, 0), ("page_units", page_units, 1), ("slot_units", slot_units, 1)):
            if type(value) is not int or value < least:
                raise ConfigError(f"Host {name} must be an int >= {least}, got {value!r}")
        self.pool = pool
        self.units = units
        self.page_units = page_units
        self.slot_units = slot_units
        self._runs: list[tuple[int, int]] = [(0, units)] if units else []
        self._used = 0

    @property
    def used(self) -> int:
        """Units held by parked copies and rooms."""
        return self._used

    @property
    def free(self) -> int:
        """Units free."""
        return self.units - self._used

    def runs(self) -> tuple[tuple[int, int], ...]:
        """Free runs as (start, stop), ascending."""
        return tuple(self._runs)

    # ---- allocator -----------------------------------------------------------------------

    def _alloc(self, n: int, high: bool) -> HostUnit | None:
        order = range(len(self._runs) - 1, -1, -1) if high else range(len(self._runs))
        for i in order:
            start, stop = self._runs[i]
            if stop - start < n:
                continue
            at = stop - n if high else start
            rest = (start, stop - n) if high else (start + n, stop)
            if rest[0] == rest[1]:
                del self._runs[i]
            else:
                self._runs[i] = rest
            self._used += n
            return HostUnit(at)
        return None

    def _free(self, at: int, n: int) -> None:
        i = bisect.bisect_left(self._runs, (at, at))
        start, stop = at, at + n
        if i < len(self._runs) and self._runs[i][0] == stop:
            stop = self._runs.pop(i)[1]
        if i > 0 and self._runs[i - 1][1] == start:
            i -= 1
            start = self._runs.pop(i)[0]
        self._runs.insert(i, (start, stop))
        self._used -= n

    def _alloc_pages(self, pages: int) -> list[HostUnit] | None:
        """`pages` page-sized units, first fit from the low end: what `pages` calls of
        `_alloc(page_units, False)` would take, one pass over the free runs. None (nothing
        taken) when they do not fit."""
        n = self.page_units
        got: list[HostUnit] = []
        runs: list[tuple[int, int]] = []
        i = 0
        while len(got) < pages:
            if i == len(self._runs):
                return None
            start, stop = self._runs[i]
            k = min(pages - len(got), (stop - start) // n)
            got += [HostUnit(start + j * n) for j in range(k)]
            if start + k * n < stop:
                runs.append((start + k * n, stop))
            i += 1
        self._runs = runs + self._runs[i:]
        self._used += pages * n
        return got

    def _alloc_all(self, pages: int, slot: bool) -> list[HostUnit] | None:
        units = self._alloc_pages(pages)
        if units is None:
            return None
        if slot:
            at = self._alloc(self.slot_units, True)
            if at is None:
                for unit in units:
                    self._free(unit, self.page_units)
                return None
            units.append(at)
        return units

    # ---- handles -------------------------------------------------------------------------

    def _mine(self, parked: Parked) -> None:
        if not isinstance(parked, Parked):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"parked must be a kern_pool.Parked, got {type(parked).__name__}")
        if parked._host is not self:
            raise ApiError("this Parked belongs to another host tier")
        if not parked._live:
            raise ApiError("this Parked was released; it names nothing")

    def _mine_room(self, room: Room) -> None:
        if not isinstance(room, Room):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"room must be a kern_pool.Room, got {type(room).__name__}")
        if room._host is not self:
            raise ApiError("this Room belongs to another host tier")
        if not room._live:
            raise ApiError("this Room was parked, cancelled or released; it holds nothing")

    def _checkpoint(self, checkpoint: Checkpoint) -> None:
        if not isinstance(checkpoint, Checkpoint):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"checkpoint must be a kern_pool.Checkpoint, got {type(checkpoint).__name__}")
        self.pool._mine(checkpoint)

    def _sizes(self, room: Room) -> list[int]:
        store = room._checkpoint._store
        pages = [self.page_units] * (len(room._fresh) + (store.tail is not None))
        return pages + ([self.slot_units] if store.slot is not None else []) if room._same is None else []

    def _unroom(self, room: Room) -> None:
        room._live = False
        for unit, size in zip(room._units, self._sizes(room), strict=True):
            self._free(unit, size)
        self._unref(room._tip)
        if room._same is not None:
            self._drop(room._same)

    # ---- park / wake ---------------------------------------------------------------------

    def room(self, checkpoint: Checkpoint) -> Room | Checkpoint:
        """Reserves the host units a park of `checkpoint` needs, or hands it back when full.

        The room holds the checkpoint (the caller's holder) until it is parked, cancelled or
        released; nothing moves until `park(room)`. Pages an earlier park of the chain left on
        the host are shared, not reserved again.

        Raises:
            ApiError: not a Checkpoint, released, or of another pool.
        """
        self._checkpoint(checkpoint)
        store = checkpoint._store
        same = store.twin
        if same is not None and same.refs > 0 and same.length == store.length:
            same.refs += 1
            return Room(_KEY, self, checkpoint, [], [], None, same)
        nodes = store.chain()
        reuse = 0
        for i in range(len(nodes) - 1, -1, -1):
            twin = nodes[i].twin
            if twin is not None and twin.alive:
                reuse = i + 1
                break
        fresh = nodes[reuse:]
        units = self._alloc_all(len(fresh) + (store.tail is not None), store.slot is not None)
        if units is None:
            return checkpoint
        tip = nodes[reuse - 1].twin if reuse else None
        if tip is not None:
            tip.refs += 1  # NOTE: held by the room, then by the first new node or the Parked
        return Room(_KEY, self, checkpoint, fresh, units, tip, None)

    def park(self, target: Checkpoint | Room) -> tuple[Parked, ParkCopies]:
        """Parks a checkpoint (or fills a `room`) on the host: the pages no earlier park of the
        chain left there, the private partial page, and the slot, as device-to-host copies.

        A Checkpoint stays the caller's (release it once the copies landed); a Room is
        consumed, and its checkpoint with it: the caller that performs the copies releases that
        checkpoint once they landed (`Room.checkpoint`, read before).

        Raises:
            ApiError: not a Checkpoint or Room, released, or of another pool or host.
            HostFull: a Checkpoint the block cannot hold; nothing is kept.
        """
        if isinstance(target, Room):
            self._mine_room(target)
            return self._fill(target)
        got = self.room(target)
        if isinstance(got, Checkpoint):
            store = target._store
            chain_len = len(store.chain())
            need = (chain_len + (store.tail is not None)) * self.page_units + (store.slot is not None) * self.slot_units
            raise HostFull(need, self.free)
        return self._fill(got)

    def _fill(self, room: Room) -> tuple[Parked, ParkCopies]:
        room._live = False
        store = room._checkpoint._store
        if room._same is not None:
            return Parked(_KEY, self, room._same), Copies((), None)
        host_tip = room._tip
        pairs: list[tuple[PageId, HostUnit]] = []
        for node, unit in zip(room._fresh, room._units, strict=False):
            host_tip = HostNode(unit, host_tip, node.depth)
            node.twin = host_tip
            pairs.append((node.page, unit))
        at = len(room._fresh)
        tail = room._units[at] if store.tail is not None else None
        if store.tail is not None and tail is not None:
            pairs.append((store.tail, tail))
        slot_unit = room._units[-1] if store.slot is not None else None
        hs = HostStore(store.length, store.paged, host_tip, tail, slot_unit)
        slot = (store.slot, slot_unit) if store.slot is not None and slot_unit is not None else None
        return Parked(_KEY, self, hs), Copies(tuple(pairs), slot)

    def _wake_length(self, hs: HostStore, length: int) -> tuple[int, int]:
        if type(length) is not int or not 0 < length <= hs.length:
            raise ApiError(f"length {length!r} must be an int in [1, {hs.length}]")
        if length < hs.length and (hs.slot is not None or length % self.pool.unit):
            raise ApiError(f"length {length} below the parked {hs.length}: only stateless, at whole pages")
        k, part = divmod(length, self.pool.unit)
        return (k, part) if hs.paged else (0, 0)

    def _woken(
        self, hs: HostStore, k: int, part: int, pages: list[PageId]
    ) -> tuple[list[Node], list[tuple[HostUnit, PageId]]]:
        """Chain nodes on `pages[:k]` twinned with the host chain, and the copies filling them
        (plus the partial page into `pages[k]` when `part`)."""
        hnodes = chain(hs.tip)
        nodes: list[Node] = []
        pairs: list[tuple[HostUnit, PageId]] = []
        for j in range(k):
            node = Node(pages[j], nodes[-1] if nodes else None, j)
            node.twin = hnodes[j]
            nodes.append(node)
            pairs.append((hnodes[j].unit, pages[j]))
        self.pool._nodes += k
        if part:
            src = hnodes[k].unit if k < len(hnodes) else hs.tail
            assert src is not None
            pairs.append((src, pages[k]))
        return nodes, pairs

    def wake(self, parked: Parked, length: int) -> tuple[Checkpoint, WakeCopies]:
        """A device checkpoint of the parked copy's first `length` tokens; `parked` stays valid
        (it is not consumed: release it when the host copy is no longer wanted).

        Copies ceil(length / unit) pages into fresh device pages (whole ones become chain nodes
        twinned with their host nodes, so parking them again copies nothing) and the slot.
        `length` is the parked length, or for a stateless copy a whole number of pages below it.
        A checkpoint woken at the parked length parks again as `parked` itself, with no copy.

        Raises:
            ApiError: not a Parked, released or foreign, bad length.
            ExceedsPool, Busy, Remapping: the pool cannot give the pages or slot now.
        """
        self._mine(parked)
        hs = parked._store
        k, part = self._wake_length(hs, length)
        pages, slots = self.pool._objs.take(k + (part > 0), int(hs.slot is not None))
        nodes, pairs = self._woken(hs, k, part, pages)
        slot = slots[0] if slots else None
        store = Store(length, hs.paged, nodes[-1] if nodes else None, pages[k] if part else None, slot)
        if length == hs.length:
            store.twin = hs
        copies = _wake_copies(hs, pairs, slot)
        return Checkpoint(_KEY, self.pool, store), copies

    def restore(self, parked: Parked, length: int, tokens: int) -> tuple[Lease, WakeCopies]:
        """A new lease of `tokens` from the parked copy's first `length` tokens (`lease_from`
        from the host); `parked` stays valid.

        The whole pages become chain nodes twinned with the host (the lease's sealed prefix),
        the partial page is copied into the lease's first own page, the slot into its slot; the
        other own pages are fresh. For a slot-only copy `tokens` must be 0.

        Raises:
            ApiError: not a Parked, released or foreign, bad length or tokens.
            ExceedsRow, ExceedsPool, Busy, Remapping: see `Denied`.
        """
        self._mine(parked)
        hs = parked._store
        k, part = self._wake_length(hs, length)
        if not hs.paged:
            if tokens != 0:
                raise ApiError(f"a slot-only parked copy starts a slot-only lease: tokens must be 0, got {tokens!r}")
            npages = 0
        else:
            if type(tokens) is not int or tokens < length:
                raise ApiError(f"tokens {tokens!r} must be an int covering the {length} tokens the lease starts from")
            npages = self.pool._row(tokens)
        pages, slots = self.pool._objs.take(npages, int(hs.slot is not None))
        nodes, pairs = self._woken(hs, k, part, pages)
        slot = slots[0] if slots else None
        lease = Lease(_KEY, self.pool, nodes, pages[k:], slot, length, hs.paged)
        copies = _wake_copies(hs, pairs, slot)
        return lease, copies

    lease_from = restore

    def _unref(self, node: HostNode | None) -> None:
        while node is not None:
            node.refs -= 1
            if node.refs:
                return
            node.alive = False
            self._free(node.unit, self.page_units)
            node = node.parent

    def _drop(self, hs: HostStore) -> None:
        hs.refs -= 1
        if hs.refs:
            return
        self._unref(hs.tip)
        hs.tip = None
        if hs.tail is not None:
            self._free(hs.tail, self.page_units)
            hs.tail = None
        if hs.slot is not None:
            self._free(hs.slot, self.slot_units)
            hs.slot = None
