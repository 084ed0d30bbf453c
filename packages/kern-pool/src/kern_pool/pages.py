"""The Pool: pages and slots on the chunk map, leases, checkpoints, fork, and remap plans.

Three rules keep shared memory safe: whole pages are shared; a partial page is copied for
whoever newly holds it; the only writer of a page is the live lease that owns it, and a page
sealed into a chain node is frozen from then on. Decisions come back as `Copies` (page and slot
copies the runtime performs on its stream) and `Remap` plans (unmaps, maps, access grants).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, Self, TypeVar

from kern_pool._kinds import Status
from kern_pool._objects import Objects
from kern_pool.chunks import (
    LineTable,
    PageId,
    PoolConfig,
    Remap,
    SlotId,
)
from kern_pool.errors import ApiError, ExceedsRow

if TYPE_CHECKING:
    from kern_pool.host import HostNode, HostStore

__all__ = ["Checkpoint", "Copies", "DeviceCopies", "Lease", "Pool", "PoolSnapshot"]

P = TypeVar("P")
Q = TypeVar("Q")

_KEY = object()


@dataclass(frozen=True, slots=True)
class Copies(Generic[P, Q]):
    """Copies to perform: whole pages as `(src, dst)` pairs in order, then the state slot if any."""

    pages: tuple[P, ...]
    slot: Q | None


DeviceCopies = Copies[tuple[PageId, PageId], tuple[SlotId, SlotId]]
"""Device-to-device copies: (source page, destination page), (source slot, destination slot)."""


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Everything that defines a pool's state, as plain comparable data (tests compare these)."""

    pages: tuple[Status, ...]
    slots: tuple[Status, ...]
    users: tuple[tuple[int, ...], ...]
    chunk_at: tuple[tuple[int | None, ...], ...]
    free_chunks: tuple[int, ...]
    pages_free: int
    slots_free: int
    nodes: int
    pending: int | None
    remaps: int


class Node:
    """One sealed page of a chain: frozen, refcounted (holders plus one per child)."""

    __slots__ = ("depth", "page", "parent", "refs", "twin")

    def __init__(self, page: PageId, parent: Node | None, depth: int) -> None:
        self.page = page
        self.parent = parent
        self.depth = depth
        self.refs = 1
        self.twin: HostNode | None = None


class _Linked(Protocol):
    @property
    def parent(self) -> Self | None: ...


_N = TypeVar("_N", bound=_Linked)


def chain(tip: _N | None) -> list[_N]:
    """The nodes from the root to `tip`, in page order (a device chain, or its host twin's)."""
    out: list[_N] = []
    while tip is not None:
        out.append(tip)
        tip = tip.parent
    out.reverse()
    return out


class Store:
    """What a checkpoint names: a chain, an optional private partial page, an optional slot."""

    __slots__ = ("_chain", "_pages", "length", "paged", "refs", "slot", "tail", "tip", "twin")

    def __init__(
        self, length: int, paged: bool, tip: Node | None, tail: PageId | None, slot: SlotId | None
    ) -> None:
        self.length = length
        self.paged = paged
        self.tip = tip
        self.tail = tail
        self.slot = slot
        self.refs = 1
        self.twin: HostStore | None = None  # NOTE: the parked copy this store was woken from
        self._chain: list[Node] | None = None
        self._pages: tuple[PageId, ...] | None = None

    # NOTE: both made once: a node's parent never changes, and a live store keeps its tip and tail.

    def chain(self) -> list[Node]:
        """`chain(tip)`; callers must not change the list."""
        if self._chain is None:
            self._chain = chain(self.tip)
        return self._chain

    def page_ids(self) -> tuple[PageId, ...]:
        """The chain's pages, then the tail if any."""
        if self._pages is None:
            pages = [n.page for n in self.chain()]
            self._pages = (*pages, self.tail) if self.tail is not None else tuple(pages)
        return self._pages


class Lease:
    """A live sequence: shared chain pages, then owned pages, and a state slot if the pool has one.

    Factory-only (`Pool.lease`, `Pool.lease_slot`, `Pool.restore`, `Pool.fork`). Release with
    `release()`; a released lease raises `ApiError` everywhere.
    """
    # NOTE: factories pass `own` in ascending order (as `Kind.take` returns ids): release frees a
    # contiguous run from its two ends.

    __slots__ = ("_length", "_live", "_nodes", "_own", "_paged", "_pages", "_pool", "_prefix", "_slot")

    def __init__(
        self,
        key: object,
        pool: Pool,
        nodes: list[Node],
        own: list[PageId],
        slot: SlotId | None,
        prefix: int,
        paged: bool,
        pages: tuple[PageId, ...] | None = None,
    ) -> None:
        if key is not _KEY:
            raise ApiError("Lease is factory-only: use Pool.lease / lease_slot / restore / fork")
        self._pool = pool
        self._nodes = nodes
        self._own = own
        self._slot = slot
        self._prefix = prefix
        self._length = prefix
        self._paged = paged
        self._live = True
        self._pages = pages  # NOTE: `pages`, when known, is every page id in token order

    def _check(self) -> None:
        if not self._live:
            raise ApiError("this lease was released or retired; it names nothing")

    def _page(self, k: int) -> PageId:
        """Page `k` in token order, without building the whole list."""
        sealed = len(self._nodes)
        return self._nodes[k].page if k < sealed else self._own[k - sealed]

    @property
    def live(self) -> bool:
        """False once released or retired."""
        return self._live

    @property
    def paged(self) -> bool:
        """False for a slot-only lease (`Pool.lease_slot`)."""
        return self._paged

    @property
    def pages(self) -> tuple[PageId, ...]:
        """Page ids in token order (shared chain pages first)."""
        self._check()
        # NOTE: made once: sealing moves own pages to the chain in order, and nothing else changes
        # the pages of a live lease.
        if self._pages is None:
            self._pages = (*[n.page for n in self._nodes], *self._own)
        return self._pages

    @property
    def own_pages(self) -> tuple[PageId, ...]:
        """The lease's own pages in token order: `pages[sealed:]`, without the shared chain."""
        self._check()
        return tuple(self._own)

    @property
    def state_slot(self) -> SlotId | None:
        """The per-seq state slot, or None in a pool without per-seq states."""
        self._check()
        return self._slot

    @property
    def tokens(self) -> int:
        """Token capacity: pages x unit."""
        return (len(self._nodes) + len(self._own)) * self._pool.unit

    @property
    def prefix(self) -> int:
        """Tokens inherited from a checkpoint or parent; positions below it are not writable."""
        return self._prefix

    @property
    def sealed(self) -> int:
        """Leading pages sealed into a shared chain; positions inside them are not writable."""
        return len(self._nodes)

    @property
    def length(self) -> int:
        """The written frontier: the prefix, or one past the highest position handed out."""
        return self._length

    def kv_index(self, pos: int) -> int:
        """The paged index of token `pos` (page x unit + pos % unit); records it as written.

        Raises:
            ApiError: released lease, slot-only lease, or `pos` before the prefix, inside a sealed
                page, or past the lease.
        """
        self._writable(pos, pos + 1)
        unit = self._pool.unit
        page = self._own[pos // unit - len(self._nodes)]
        self._length = max(self._length, pos + 1)
        return page * unit + pos % unit

    def kv_indices(self, start: int, stop: int) -> list[int]:
        """`kv_index` for every position in [start, stop).

        Raises:
            ApiError: as `kv_index`, for any position in the range.
        """
        self._writable(start, stop)
        unit = self._pool.unit
        base = len(self._nodes)
        out: list[int] = []
        pos = start
        while pos < stop:
            page, off = divmod(pos, unit)
            end = min(stop, (page + 1) * unit)
            first = self._own[page - base] * unit
            out.extend(range(first + off, first + off + end - pos))
            pos = end
        self._length = max(self._length, stop)
        return out

    def _writable(self, start: int, stop: int) -> None:
        self._check()
        if type(start) is not int or type(stop) is not int:
            raise ApiError(f"positions must be ints, got {start!r}, {stop!r}")
        if not self._paged:
            raise ApiError("a slot-only lease has no pages: it has no token positions")
        floor = max(self._prefix, len(self._nodes) * self._pool.unit)
        if start >= stop or start < floor or stop > self.tokens:
            raise ApiError(
                f"positions [{start}, {stop}) not writable: this lease writes [{floor}, {self.tokens})"
            )

    def table_row(self) -> tuple[PageId, ...]:
        """The page-table row: every page id, padded to the row width with the first one.

        Raises:
            ApiError: released or slot-only lease.
        """
        pages = self.pages
        if not pages:
            raise ApiError("a slot-only lease has no page-table row")
        return pages + (pages[0],) * (self._pool.row_pages - len(pages))

    def _line_table(self, table: str) -> LineTable:
        self._check()
        for t in self._pool.config.line_tables:
            if t.name == table:
                return t
        names = ", ".join(t.name for t in self._pool.config.line_tables) or "none"
        raise ApiError(f"{table!r} is not a line table of this pool (line tables: {names})")

    def seq_line(self, table: str, r: int) -> int:
        """The line index row `r` of line table `table` holds for this sequence.

        `slot * lines_per_slot + r`, where a slot of the table's state holds
        `bytes_per_seq // stride` lines: the entry `[r, i]` (or one of the `seq_width` entries of
        cell `[r, i]` in a wide table) when this sequence is column `i` of a batch.

        Raises:
            ApiError: released lease, no such line table, `r` not an int in [0, seq_lines).
        """
        t = self._line_table(table)
        if type(r) is not int or not 0 <= r < t.lines:
            raise ApiError(f"{table!r} has {t.lines} line(s) per sequence: r must be an int in [0, {t.lines}), got {r!r}")
        assert self._slot is not None  # NOTE: a line table needs a per-seq state: every lease has a slot
        state = next(q for q in self._pool.config.per_seq if q.name == t.state)
        return self._slot * (state.bytes_per_seq // t.stride) + r

    def seq_lines(self, table: str) -> int:
        """Rows of line table `table` per sequence (the `lines` of `[lines, seqs(, w)]`).

        Raises:
            ApiError: released lease, or no such line table.
        """
        return self._line_table(table).lines

    def seq_width(self, table: str) -> int:
        """Entries per (line, sequence) cell of line table `table`: 1, or a wide table's `w`.

        Raises:
            ApiError: released lease, or no such line table.
        """
        return self._line_table(table).width

    def release(self) -> None:
        """Give back the owned pages, the chain reference and the slot.

        Raises:
            ApiError: already released or retired.
        """
        self._check()
        self._pool._drop_lease(self)  # pyright: ignore[reportPrivateUsage]


class Checkpoint:
    """The first `length` tokens of a sequence, kept: whole pages shared, partial page and slot own.

    Factory-only (`Pool.checkpoint`, `Pool.retire`, `Host.wake`). `clone()` adds a holder;
    each holder calls `release()` once.
    """

    __slots__ = ("_live", "_pool", "_store")

    def __init__(self, key: object, pool: Pool, store: Store) -> None:
        if key is not _KEY:
            raise ApiError("Checkpoint is factory-only: use Pool.checkpoint / retire / Host.wake")
        self._pool = pool
        self._store = store
        self._live = True

    def _check(self) -> None:
        if not self._live:
            raise ApiError("this checkpoint was released; it names nothing")

    @property
    def live(self) -> bool:
        """False once released."""
        return self._live

    @property
    def length(self) -> int:
        """Tokens kept."""
        return self._store.length

    @property
    def stateful(self) -> bool:
        """True when it holds a state slot: usable only at exactly `length`."""
        return self._store.slot is not None

    @property
    def paged(self) -> bool:
        """False for a checkpoint of a slot-only lease."""
        return self._store.paged

    @property
    def pages(self) -> tuple[PageId, ...]:
        """Page ids in token order (chain pages, then the private partial page if any)."""
        self._check()
        return self._store.page_ids()

    @property
    def sealed(self) -> int:
        """Leading pages that are shared chain pages (the rest, if any, is its own partial page)."""
        self._check()
        tip = self._store.tip
        return 0 if tip is None else tip.depth + 1

    @property
    def state_slot(self) -> SlotId | None:
        """The copied state slot, or None."""
        self._check()
        return self._store.slot

    def clone(self) -> Checkpoint:
        """Another holder of the same checkpoint.

        Raises:
            ApiError: released checkpoint.
        """
        self._check()
        self._store.refs += 1
        return Checkpoint(_KEY, self._pool, self._store)

    def release(self) -> None:
        """Drop this holder; the last one gives the pages and slot back.

        Raises:
            ApiError: already released.
        """
        self._check()
        self._live = False
        self._pool._drop_store(self._store)  # pyright: ignore[reportPrivateUsage]


class Pool:
    """Pages and slots over one chunk budget. Create with `Pool.create(config)`."""

    __slots__ = ("_nodes", "_nslots", "_objs", "config")

    def __init__(self, key: object, config: PoolConfig) -> None:
        if key is not _KEY:
            raise ApiError("Pool is factory-only: use Pool.create(config)")
        self.config = config
        self._objs = Objects(config)
        self._nslots = 1 if config.per_seq else 0
        self._nodes = 0

    @staticmethod
    def create(config: PoolConfig) -> tuple[Pool, Remap]:
        """A pool and its initial plan: `first_slots` slots, then as many pages as fit.

        The initial plan has landed by definition: execute it before handing out any page.
        """
        if not isinstance(config, PoolConfig):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"Pool.create needs a PoolConfig, got {type(config).__name__}")
        pool = Pool(_KEY, config)
        return pool, pool._objs.initial()

    # ---- queries -------------------------------------------------------------------------

    @property
    def unit(self) -> int:
        """Tokens per page."""
        return self.config.unit

    @property
    def row_pages(self) -> int:
        """Pages in one page-table row."""
        return self.config.row_pages

    @property
    def has_slots(self) -> bool:
        """True when the pool has per-seq states (every lease then takes a slot)."""
        return self._nslots == 1

    @property
    def pages_used(self) -> int:
        """Pages held by live handles."""
        return self._objs.pages.held

    @property
    def pages_free(self) -> int:
        """Pages made and free."""
        return self._objs.pages.free

    @property
    def pages_max(self) -> int:
        """Pages that exist when the whole budget is pages."""
        return self._objs.pages.limit

    @property
    def slots_used(self) -> int:
        """Slots held by live handles."""
        return self._objs.slots.held

    @property
    def slots_free(self) -> int:
        """Slots made and free."""
        return self._objs.slots.free

    @property
    def slots_max(self) -> int:
        """Slots that exist when the whole budget is slots."""
        return self._objs.slots.limit

    @property
    def remaps(self) -> int:
        """Remap plans made since creation."""
        return self._objs.remaps

    @property
    def pending(self) -> Remap | None:
        """The plan in flight, if any: execute it and call `complete(plan)`."""
        return self._objs.pending

    def snapshot(self) -> PoolSnapshot:
        """The pool's whole state as comparable data."""
        users, chunk_at, free = self._objs.chunks.snapshot()
        return PoolSnapshot(
            tuple(map(Status, self._objs.pages.state)),
            tuple(map(Status, self._objs.slots.state)),
            users,
            chunk_at,
            free,
            self._objs.pages.free,
            self._objs.slots.free,
            self._nodes,
            None if self._objs.pending is None else self._objs.pending.serial,
            self._objs.remaps,
        )

    # ---- remap ---------------------------------------------------------------------------

    def complete(self, plan: Remap) -> None:
        """The runtime reports that `plan` landed: its made objects become free.

        Raises:
            ApiError: `plan` is not the plan in flight.
        """
        self._objs.complete(plan)

    # ---- handles -------------------------------------------------------------------------

    def _mine(self, handle: Lease | Checkpoint, kind: type[Lease] | type[Checkpoint] | None = None) -> None:
        want = (Lease, Checkpoint) if kind is None else kind
        if not isinstance(handle, want):  # pyright: ignore[reportUnnecessaryIsInstance]
            names = "a Lease or a Checkpoint" if kind is None else f"a {kind.__name__}"
            raise ApiError(f"expected {names}, got {type(handle).__name__}")
        if handle._pool is not self:  # pyright: ignore[reportPrivateUsage]
            raise ApiError(f"this {type(handle).__name__} belongs to another pool")
        if not handle._live:  # pyright: ignore[reportPrivateUsage]
            raise ApiError(f"this {type(handle).__name__} was released; it names nothing")

    def _row(self, tokens: int) -> int:
        if type(tokens) is not int or tokens <= 0:
            raise ApiError(f"tokens must be a positive int, got {tokens!r}")
        pages = -(-tokens // self.unit)
        if not self._objs.pages.arenas:
            raise ApiError("this pool has no paged states: use lease_slot()")
        if pages > self.row_pages:
            raise ExceedsRow(self.row_pages * self.unit)
        return pages

    def lease(self, tokens: int) -> Lease:
        """Fresh pages for `tokens` plus one slot if the pool has per-seq states; all or nothing.

        Raises:
            ApiError: tokens not positive, or a pool without paged states.
            ExceedsRow, ExceedsPool, Busy, Remapping: see `Denied`.
        """
        pages, slots = self._objs.take(self._row(tokens), self._nslots)
        return Lease(_KEY, self, [], pages, slots[0] if slots else None, 0, True)

    def lease_slot(self) -> Lease:
        """A slot-only lease (a peer rank's share of a row): one slot, no pages.

        Raises:
            ApiError: the pool has no per-seq states.
            ExceedsPool, Busy, Remapping: see `Denied`.
        """
        if not self._nslots:
            raise ApiError("this pool has no per-seq states: lease_slot() has nothing to give")
        _, slots = self._objs.take(0, 1)
        return Lease(_KEY, self, [], [], slots[0], 0, False)

    def _seal(self, lease: Lease, k: int) -> None:
        nodes, own = lease._nodes, lease._own  # pyright: ignore[reportPrivateUsage]
        grow = k - len(nodes)
        if grow <= 0:
            return
        parent = nodes[-1] if nodes else None
        depth = len(nodes)
        new: list[Node] = []
        append = new.append
        for page in own[:grow]:
            parent = Node(page, parent, depth)
            append(parent)
            depth += 1
        nodes += new
        del own[:grow]
        self._nodes += grow

    def _length(self, handle_tokens: int, length: int, paged: bool) -> None:
        if type(length) is not int or length <= 0:
            raise ApiError(f"length must be a positive int, got {length!r}")
        if paged and length > handle_tokens:
            raise ApiError(f"length {length} is past the handle's {handle_tokens} tokens")

    def checkpoint(self, lease: Lease, length: int) -> tuple[Checkpoint, DeviceCopies]:
        """Keep the lease's first `length` tokens: seal whole pages, copy the partial page and slot.

        Returns the checkpoint and `Copies`: pages as (lease page, checkpoint page), slot as
        (lease slot, checkpoint slot). The lease keeps writing its own partial page.

        Raises:
            ApiError: foreign or released lease, length not in [1, lease.tokens].
            Busy, Remapping, ExceedsPool: no fresh page or slot for the copies.
        """
        self._mine(lease, Lease)
        self._length(lease.tokens, length, lease._paged)  # pyright: ignore[reportPrivateUsage]
        k, part = divmod(length, self.unit)
        paged = lease._paged  # pyright: ignore[reportPrivateUsage]
        in_chain = part > 0 and k < len(lease._nodes)  # pyright: ignore[reportPrivateUsage]
        need_page = paged and part > 0 and not in_chain
        src_page = lease._page(k) if need_page else None  # pyright: ignore[reportPrivateUsage]
        pages, slots = self._objs.take(int(need_page), int(lease._slot is not None))  # pyright: ignore[reportPrivateUsage]
        if paged:
            self._seal(lease, k)
        nodes = lease._nodes  # pyright: ignore[reportPrivateUsage]
        tip = nodes[k] if in_chain else (nodes[k - 1] if paged and k else None)
        if tip is not None:
            tip.refs += 1
        page_copies = ((src_page, pages[0]),) if src_page is not None else ()
        slot = lease._slot  # pyright: ignore[reportPrivateUsage]
        store = Store(length, paged, tip, pages[0] if pages else None, slots[0] if slots else None)
        copies = Copies(page_copies, (slot, slots[0]) if slot is not None else None)
        return Checkpoint(_KEY, self, store), copies

    def retire(self, lease: Lease, length: int) -> Checkpoint:
        """End the lease and keep its first `length` tokens without copying anything.

        Pages past `length` go back to the pool; the partial page and the slot change owner.

        Raises:
            ApiError: foreign or released lease, length not in [1, lease.tokens].
        """
        self._mine(lease, Lease)
        paged = lease._paged  # pyright: ignore[reportPrivateUsage]
        self._length(lease.tokens, length, paged)
        k, part = divmod(length, self.unit)
        tail: PageId | None = None
        tip: Node | None = None
        if paged:
            self._seal(lease, k)
            nodes, own = lease._nodes, lease._own  # pyright: ignore[reportPrivateUsage]
            if part and k < len(nodes):
                tip = nodes[k]
            else:
                tip = nodes[k - 1] if k else None
                if part:
                    tail = own.pop(0)
            if tip is not None:
                tip.refs += 1
        store = Store(length, paged, tip, tail, lease._slot)  # pyright: ignore[reportPrivateUsage]
        lease._slot = None  # pyright: ignore[reportPrivateUsage]
        self._drop_lease(lease)
        return Checkpoint(_KEY, self, store)

    def restore(self, checkpoint: Checkpoint, length: int, tokens: int) -> tuple[Lease, DeviceCopies]:
        """A new lease of `tokens` starting from the checkpoint's first `length` tokens.

        Shares the whole pages, copies the partial page and the slot. `length` is the
        checkpoint's length, or for a stateless checkpoint a whole number of pages below it.
        For a slot-only checkpoint `tokens` must be 0 and the lease is slot-only.

        Raises:
            ApiError: foreign or released checkpoint, bad length or tokens.
            ExceedsRow, ExceedsPool, Busy, Remapping: see `Denied`.
        """
        self._mine(checkpoint, Checkpoint)
        store = checkpoint._store  # pyright: ignore[reportPrivateUsage]
        self._length(store.length, length, True)
        if length < store.length and (store.slot is not None or length % self.unit):
            raise ApiError(
                f"length {length} below the checkpoint's {store.length}: only stateless, at whole pages"
            )
        pages, slots = self._start_take(length, tokens, store.paged, store.slot is not None)
        nodes = store.chain()
        k, part = divmod(length, self.unit)
        src = (nodes[k].page if k < len(nodes) else store.tail) if part and store.paged else None
        return self._start(nodes, store.page_ids(), src, store.slot, pages, slots, length, store.paged)

    lease_from = restore

    def fork(self, parent: Lease, length: int, tokens: int) -> tuple[Lease, DeviceCopies]:
        """A new lease of `tokens` sharing the parent's first `length` tokens.

        Whole pages are sealed into the parent's chain and shared, the partial page is copied,
        the slot is copied. A stateful parent forks only at its `length` (its current state).
        For a slot-only parent `tokens` must be 0.

        Raises:
            ApiError: foreign or released parent, bad length or tokens.
            ExceedsRow, ExceedsPool, Busy, Remapping: see `Denied`.
        """
        self._mine(parent, Lease)
        paged, slot = parent._paged, parent._slot  # pyright: ignore[reportPrivateUsage]
        self._length(parent.tokens, length, paged)
        if paged and slot is not None and length != parent.length:
            raise ApiError(f"a stateful lease forks only at its current length {parent.length}, not {length}")
        k, part = divmod(length, self.unit)
        src = parent._page(k) if paged and part else None  # pyright: ignore[reportPrivateUsage]
        pages, slots = self._start_take(length, tokens, paged, slot is not None)
        if paged:
            self._seal(parent, k)
        return self._start(parent._nodes, parent.pages, src, slot, pages, slots, length, paged)  # pyright: ignore[reportPrivateUsage]

    def _start_take(
        self, length: int, tokens: int, paged: bool, stateful: bool
    ) -> tuple[list[PageId], list[SlotId]]:
        if type(tokens) is not int:
            raise ApiError(f"tokens must be an int, got {tokens!r}")
        if not paged:
            if tokens != 0:
                raise ApiError(f"a slot-only source starts a slot-only lease: tokens must be 0, got {tokens}")
            return self._objs.take(0, int(stateful))
        if tokens < length:
            raise ApiError(f"tokens {tokens!r} must cover the {length} tokens the lease starts from")
        return self._objs.take(self._row(tokens) - length // self.unit, int(stateful))

    def _start(
        self,
        nodes: list[Node],
        known: tuple[PageId, ...],
        src: PageId | None,
        slot: SlotId | None,
        pages: list[PageId],
        slots: list[SlotId],
        length: int,
        paged: bool,
    ) -> tuple[Lease, DeviceCopies]:
        """A lease sharing the first length // unit of `nodes` (whose pages `known` starts with)."""
        shared = nodes[: length // self.unit] if paged else []
        if shared:
            shared[-1].refs += 1
        ids = (*known[: len(shared)], *pages)
        lease = Lease(_KEY, self, shared, pages, slots[0] if slots else None, length, paged, ids)
        page_copies = ((src, pages[0]),) if src is not None else ()
        return lease, Copies(page_copies, (slot, slots[0]) if slot is not None else None)

    # ---- giving back ---------------------------------------------------------------------

    def _unref(self, node: Node | None) -> None:
        pages: list[PageId] = []
        append = pages.append
        while node is not None:
            node.refs -= 1
            if node.refs:
                break
            append(node.page)
            node = node.parent
        if pages:
            self._objs.pages.give(pages)
            self._nodes -= len(pages)

    def _drop_lease(self, lease: Lease) -> None:
        lease._live = False  # pyright: ignore[reportPrivateUsage]
        # NOTE: a lease's own pages are always ascending: they come from `Kind.take`, and sealing
        # or retiring only removes them from the front.
        self._objs.pages.give_ascending(lease._own)  # pyright: ignore[reportPrivateUsage]
        lease._own = []  # pyright: ignore[reportPrivateUsage]
        if lease._nodes:  # pyright: ignore[reportPrivateUsage]
            self._unref(lease._nodes[-1])  # pyright: ignore[reportPrivateUsage]
        lease._nodes = []  # pyright: ignore[reportPrivateUsage]
        lease._pages = None  # pyright: ignore[reportPrivateUsage]
        if lease._slot is not None:  # pyright: ignore[reportPrivateUsage]
            self._objs.slots.give([lease._slot])  # pyright: ignore[reportPrivateUsage]
            lease._slot = None  # pyright: ignore[reportPrivateUsage]

    def _drop_store(self, store: Store) -> None:
        store.refs -= 1
        if store.refs:
            return
        self._unref(store.tip)
        store.tip = None
        store._chain = store._pages = None  # pyright: ignore[reportPrivateUsage]
        if store.tail is not None:
            self._objs.pages.give([store.tail])
            store.tail = None
        if store.slot is not None:
            self._objs.slots.give([store.slot])
            store.slot = None
