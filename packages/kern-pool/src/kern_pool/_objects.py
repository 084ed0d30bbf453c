"""The pool's objects over its chunk budget: which pages and slots exist, which are free, and the
remap plans that make more of one kind from the other's free ones (at most one in flight). The
`Pool` hands these objects to leases and checkpoints; this part decides where they come from."""

from __future__ import annotations

from kern_pool._kinds import Kind, Status
from kern_pool.chunks import ChunkMap, Map, PageId, PoolConfig, Remap, SlotId, Unmap, grants
from kern_pool.errors import ApiError, Busy, ExceedsPool, Remapping

__all__ = ["Objects"]


class Objects:
    """Pages and slots made over one chunk budget."""

    __slots__ = ("chunks", "config", "pages", "pending", "remaps", "serial", "slots")

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.chunks = ChunkMap(config)
        npaged = len(config.paged)
        self.pages = Kind(range(npaged), config.pages_max)
        self.slots = Kind(range(npaged, npaged + len(config.per_seq)), config.slots_max)
        self.pending: Remap | None = None
        """The plan in flight, if any."""
        self.remaps = 0
        self.serial = 0

    def initial(self) -> Remap:
        """The first plan: `first_slots` slots, then as many pages as fit; landed by definition."""
        config = self.config
        maps: list[Map] = []
        slots = [self._make(self.slots, i, maps) for i in range(config.first_slots)]
        pages: list[PageId] = []
        for i in range(config.pages_max):
            if self.chunks.cost(self.pages.arenas, i, {}) > self.chunks.free_chunks:
                break
            pages.append(PageId(self._make(self.pages, i, maps)))
        for p in pages:
            self.pages.arrive(p)
        for s in slots:
            self.slots.arrive(s)
        return Remap(0, (), tuple(maps), grants(config.arenas, maps), tuple(pages), (), tuple(SlotId(s) for s in slots), ())

    def _make(self, kind: Kind, i: int, maps: list[Map]) -> int:
        self.chunks.make(kind.arenas, i, maps)
        kind.state[i] = Status.ARRIVING.value
        return i

    def complete(self, plan: Remap) -> None:
        """The runtime reports that `plan` landed: its made objects become free.

        Raises:
            ApiError: `plan` is not the plan in flight.
        """
        if not isinstance(plan, Remap):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"complete needs a Remap plan, got {type(plan).__name__}")
        if self.pending is None or plan != self.pending:
            raise ApiError(f"remap plan {plan.serial} is not the plan in flight; complete only `pending`")
        self.pending = None
        for p in plan.made_pages:
            self.pages.arrive(p)
        for s in plan.made_slots:
            self.slots.arrive(s)
        for p in plan.unmade_pages:
            self.pages.state[p] = Status.ABSENT.value
        for s in plan.unmade_slots:
            self.slots.state[s] = Status.ABSENT.value

    def take(self, pages: int, slots: int) -> tuple[list[PageId], list[SlotId]]:
        kp, ks = self.pages, self.slots
        if pages <= kp.free and slots <= ks.free:
            # NOTE: PageId / SlotId are NewTypes of int: the ids are the ints themselves.
            return kp.take(pages), ks.take(slots)  # pyright: ignore[reportReturnType]
        if pages > kp.limit or slots > ks.limit or self.config.chunks_for(pages, slots) > self.config.chunks:
            raise ExceedsPool(pages, slots)
        if self.pending is not None:
            raise Remapping()
        plan = None
        if slots <= ks.free:
            plan = self._rebalance(kp, pages - kp.free, ks, slots)
        elif pages <= kp.free:
            plan = self._rebalance(ks, slots - ks.free, kp, pages)
        if plan is None:
            raise Busy(max(0, pages - kp.free), max(0, slots - ks.free))
        self.pending = plan
        self.remaps += 1
        raise Remapping()

    def _rebalance(self, make: Kind, need: int, other: Kind, keep: int) -> Remap | None:
        chosen = self._choose(make, need, other, keep)
        if chosen is None:
            return None
        made, unmade = chosen
        unmaps: list[Unmap] = []
        maps: list[Map] = []
        for v in unmade:
            self.chunks.unmake(other.arenas, v, unmaps)
            other.retire(v)
        for t in made:
            self._make(make, t, maps)
        self.serial += 1
        pages_made = make is self.pages
        made_ids, unmade_ids = tuple(made), tuple(unmade)
        return Remap(
            self.serial,
            tuple(unmaps),
            tuple(maps),
            grants(self.config.arenas, maps),
            tuple(PageId(i) for i in made_ids) if pages_made else (),
            () if pages_made else tuple(PageId(i) for i in unmade_ids),
            () if pages_made else tuple(SlotId(i) for i in made_ids),
            tuple(SlotId(i) for i in unmade_ids) if pages_made else (),
        )

    def _choose(self, make: Kind, need: int, other: Kind, keep: int) -> tuple[list[int], list[int]] | None:
        overlay: dict[tuple[int, int], int] = {}
        users = self.chunks.users
        avail = self.chunks.free_chunks
        victims = iter(other.highest_free(keep))
        made: list[int] = []
        unmade: list[int] = []
        for t in make.absent():
            while (cost := self.chunks.cost(make.arenas, t, overlay)) > avail:
                v = next(victims, None)
                if v is None:
                    return None
                unmade.append(v)
                for a in other.arenas:
                    for p in self.chunks.span(a, v):
                        overlay[a, p] = overlay.get((a, p), users[a][p]) - 1
                        avail += overlay[a, p] == 0
            avail -= cost
            for a in make.arenas:
                for p in self.chunks.span(a, t):
                    overlay[a, p] = overlay.get((a, p), users[a][p]) + 1
            made.append(t)
            if len(made) == need:
                return made, unmade
        return None
