"""The host tier: a first-fit allocator over a pinned block, and park / wake of checkpoints.

Units are the host's accounting grain (the runtime sizes them: one page of every paged state end
to end, or a slot). Pages are placed from the low end, slots from the high end. Host pages form
chains like device pages, one refcounted node per page; a device node remembers its host twin,
so parking a later turn of the same chain copies only the pages that are new.
"""
# pyright: reportPrivateUsage=false
# NOTE: host.py is the pool's friend module: it builds checkpoints from the pool's internals.

from __future__ import annotations

import bisect
from typing import NewType

from kern_pool.chunks import PageId, SlotId
from kern_pool.errors import ApiError, ConfigError, HostFull
from kern_pool.pages import _KEY, Checkpoint, Copies, Node, Pool, Store, chain

__all__ = ["Host", "HostUnit", "ParkCopies", "Parked", "WakeCopies"]

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


class _HostStore:
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

    def __init__(self, key: object, host: Host, store: _HostStore) -> None:
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


class Host:
    """First-fit units over one pinned block, bound to one pool."""

    __slots__ = ("_runs", "_used", "page_units", "pool", "slot_units", "units")

    def __init__(self, pool: Pool, units: int, page_units: int, slot_units: int) -> None:
        """A host tier of `units`; one page takes `page_units`, one slot `slot_units`.

        Raises:
            ConfigError: a count is negative, or a unit size is not positive.
        """
        if units < 0 or page_units <= 0 or slot_units <= 0:
            raise ConfigError(f"host units {units} must be >= 0 and unit sizes positive")
        self.pool = pool
        self.units = units
        self.page_units = page_units
        self.slot_units = slot_units
        self._runs: list[tuple[int, int]] = [(0, units)] if units else []
        self._used = 0

    @property
    def used(self) -> int:
        """Units held by parked copies."""
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

    # ---- park / wake ---------------------------------------------------------------------

    def _mine(self, parked: Parked) -> None:
        if parked._host is not self:
            raise ApiError("this Parked belongs to another host tier")
        if not parked._live:
            raise ApiError("this Parked was released; it names nothing")

    def park(self, checkpoint: Checkpoint) -> tuple[Parked, ParkCopies]:
        """Copy a checkpoint to the host, reusing pages an earlier park of the chain left there.

        The checkpoint stays valid; release it once the copies have landed.

        Raises:
            ApiError: released checkpoint or one of another pool.
            HostFull: the block cannot hold the new pages and slot; nothing is kept.
        """
        self.pool._mine(checkpoint)
        store = checkpoint._store
        nodes = chain(store.tip)
        reuse = 0
        for i in range(len(nodes) - 1, -1, -1):
            twin = nodes[i].twin
            if twin is not None and twin.alive:
                reuse = i + 1
                break
        fresh = nodes[reuse:]
        units = self._alloc_all(len(fresh) + (store.tail is not None), store.slot is not None)
        host_tip = nodes[reuse - 1].twin if reuse else None
        if host_tip is not None:
            host_tip.refs += 1  # NOTE: held by the first new node, or by the Parked if none
        pairs: list[tuple[PageId, HostUnit]] = []
        for node, unit in zip(fresh, units, strict=False):
            host_tip = HostNode(unit, host_tip, node.depth)
            node.twin = host_tip
            pairs.append((node.page, unit))
        tail = units[len(fresh)] if store.tail is not None else None
        if store.tail is not None and tail is not None:
            pairs.append((store.tail, tail))
        slot_unit = units[-1] if store.slot is not None else None
        hs = _HostStore(store.length, store.paged, host_tip, tail, slot_unit)
        slot = (store.slot, slot_unit) if store.slot is not None and slot_unit is not None else None
        return Parked(_KEY, self, hs), Copies(tuple(pairs), slot)

    def _alloc_all(self, pages: int, slot: bool) -> list[HostUnit]:
        got: list[tuple[HostUnit, int]] = []
        for high, n in [(False, self.page_units)] * pages + ([(True, self.slot_units)] if slot else []):
            at = self._alloc(n, high)
            if at is None:
                for unit, size in got:
                    self._free(unit, size)
                need = pages * self.page_units + slot * self.slot_units
                raise HostFull(need, self.free)
            got.append((at, n))
        return [unit for unit, _ in got]

    def wake(self, parked: Parked, length: int) -> tuple[Checkpoint, WakeCopies]:
        """A device checkpoint of the parked copy's first `length` tokens.

        Copies ceil(length / unit) pages into fresh device pages (whole ones become chain nodes
        twinned with their host nodes, so parking them again copies nothing) and the slot.
        `length` is the parked length, or for a stateless copy a whole number of pages below it.

        Raises:
            ApiError: released or foreign Parked, bad length.
            ExceedsPool, Busy, Remapping: the pool cannot give the pages or slot now.
        """
        self._mine(parked)
        hs = parked._store
        unit = self.pool.unit
        if not isinstance(length, int) or not 0 < length <= hs.length:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"length {length!r} must be in [1, {hs.length}]")
        if length < hs.length and (hs.slot is not None or length % unit):
            raise ApiError(f"length {length} below the parked {hs.length}: only stateless, at whole pages")
        k, part = divmod(length, unit)
        n = k + (part > 0) if hs.paged else 0
        pages, slots = self.pool._take(n, int(hs.slot is not None))
        hnodes = chain(hs.tip)
        tip: Node | None = None
        pairs: list[tuple[HostUnit, PageId]] = []
        for j in range(k if hs.paged else 0):
            tip = Node(pages[j], tip, j)
            tip.twin = hnodes[j]
            pairs.append((hnodes[j].unit, pages[j]))
        self.pool._nodes += k if hs.paged else 0
        tail: PageId | None = None
        if hs.paged and part:
            src = hnodes[k].unit if k < len(hnodes) else hs.tail
            assert src is not None
            tail = pages[k]
            pairs.append((src, tail))
        slot = slots[0] if slots else None
        store = Store(length, hs.paged, tip, tail, slot)
        copies = Copies(tuple(pairs), (hs.slot, slot) if hs.slot is not None and slot is not None else None)
        return Checkpoint(_KEY, self.pool, store), copies

    def _drop(self, hs: _HostStore) -> None:
        hs.refs -= 1
        if hs.refs:
            return
        node = hs.tip
        while node is not None:
            node.refs -= 1
            if node.refs:
                break
            node.alive = False
            self._free(node.unit, self.page_units)
            node = node.parent
        hs.tip = None
        if hs.tail is not None:
            self._free(hs.tail, self.page_units)
            hs.tail = None
        if hs.slot is not None:
            self._free(hs.slot, self.slot_units)
            hs.slot = None
