"""Chunk sizing, budgets, the pool configuration, and the chunk map that backs pages and slots.

Every pooled state owns one arena: a reserved address range measured in chunk positions. A page
is an interval of positions in every paged arena; a slot is an interval in every per-seq arena.
Positions keep user counts, so two objects whose boundary falls inside one chunk share it: the
chunk is mapped when the first user arrives and unmapped when the last one leaves.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NewType

from kern_pool.errors import ApiError, ConfigError

__all__ = [
    "CHUNKS_MAX",
    "CHUNK_CAP",
    "GRANULE",
    "HEADROOM",
    "Capacity",
    "ChunkId",
    "Grant",
    "LineTable",
    "Map",
    "PageId",
    "PagedState",
    "PoolConfig",
    "Remap",
    "SeqState",
    "SlotId",
    "TokenId",
    "Unmap",
    "chunk_bytes",
    "pool_config",
]

PageId = NewType("PageId", int)
SlotId = NewType("SlotId", int)
ChunkId = NewType("ChunkId", int)
TokenId = NewType("TokenId", int)

GRANULE = 2 << 20
"""The VMM allocation granularity (2 MiB): every chunk is a multiple of it."""
CHUNK_CAP = 64 << 20
"""The largest chunk (64 MiB): the driver bills pool operations per chunk."""
HEADROOM = 1 << 30
"""Device bytes left free when the caller gives no token budget (1 GiB)."""
CHUNKS_MAX = 1 << 20
"""The most physical chunks of one pool (2 TiB at the granule, 64 TiB at the cap): the pool keeps
words per chunk position of every arena, the driver a handle per chunk."""


def chunk_bytes(smallest_object: int) -> int:
    """The chunk size for a pool whose smallest object (one page or slot of one state) is given.

    A multiple of `GRANULE`, at most half the smallest object, capped at `CHUNK_CAP`; when the
    smallest object is under two granules an object cannot span two chunks anyway, so the cap.

    Raises:
        ConfigError: `smallest_object` is not positive.
    """
    if type(smallest_object) is not int or smallest_object <= 0:
        raise ConfigError(f"smallest pooled object must be a positive int of bytes, got {smallest_object!r}")
    if smallest_object < 2 * GRANULE:
        return CHUNK_CAP
    return min(CHUNK_CAP, smallest_object // 2 // GRANULE * GRANULE)


def _int(what: str, value: object, least: int) -> None:
    """ConfigError naming `what` unless `value` is an int (not a bool) of at least `least`."""
    if type(value) is not int or value < least:
        raise ConfigError(f"{what} must be an int >= {least}, got {value!r}")


def _name(what: str, value: object) -> None:
    if type(value) is not str or not value:
        raise ConfigError(f"{what} must be a non-empty str, got {value!r}")


@dataclass(frozen=True, slots=True)
class PagedState:
    """A state that scales with tokens (a KV cache): `bytes_per_token` in every page.

    Raises:
        ConfigError: an empty or non-str name, or bytes_per_token not a positive int.
    """

    name: str
    bytes_per_token: int

    def __post_init__(self) -> None:
        _name("PagedState.name", self.name)
        _int(f"state {self.name!r}: bytes_per_token", self.bytes_per_token, 1)


@dataclass(frozen=True, slots=True)
class SeqState:
    """A state with one slot per live sequence (conv / SSM state): `bytes_per_seq` per slot.

    Raises:
        ConfigError: an empty or non-str name, or bytes_per_seq not a positive int.
    """

    name: str
    bytes_per_seq: int

    def __post_init__(self) -> None:
        _name("SeqState.name", self.name)
        _int(f"state {self.name!r}: bytes_per_seq", self.bytes_per_seq, 1)


@dataclass(frozen=True, slots=True)
class LineTable:
    """A line table over a per-seq state: `[lines, seqs]` or `[lines, seqs, width]` line indices.

    One line is `stride` bytes of the state, so a slot holds `bytes_per_seq // stride` lines;
    row `r` of a sequence names line `slot * lines_per_slot + r` (`Lease.seq_line`). A wide table
    has `width` entries per (line, sequence) cell: the caller puts the line in the one its program
    reads and the null line 0 in the rest.

    Raises:
        ConfigError: an empty name or state, or lines / stride / width not positive ints.
    """

    name: str
    state: str
    lines: int
    stride: int
    width: int = 1

    def __post_init__(self) -> None:
        _name("LineTable.name", self.name)
        _name(f"line table {self.name!r}: state", self.state)
        for field in ("lines", "stride", "width"):
            _int(f"line table {self.name!r}: {field}", getattr(self, field), 1)


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the caller wants to hold at once: `tokens` (None: all free memory) and `seqs`.

    Raises:
        ConfigError: tokens neither None nor an int >= 0, or seqs not an int >= 0 (whether the
            numbers can hold anything is `pool_config`'s question).
    """

    tokens: int | None
    seqs: int = 1

    def __post_init__(self) -> None:
        if self.tokens is not None:
            _int("Capacity.tokens", self.tokens, 0)
        _int("Capacity.seqs", self.seqs, 0)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """Everything a Pool needs, frozen. Arenas are `paged` then `per_seq`, in that order.

    Attributes:
        paged: paged states (may be empty only if `per_seq` is not).
        per_seq: per-sequence states.
        unit: tokens per page (the LCM of the page-table strides over paged states).
        row_pages: pages in one page-table row; a sequence never holds more.
        chunk: bytes per physical chunk.
        chunks: physical chunks in the budget.
        first_slots: slots made at creation (the rest of the budget becomes pages).
        line_tables: the line tables over per-seq states (`Lease.seq_line`).

    Raises:
        ConfigError: a field of the wrong type or sign, more than `CHUNKS_MAX` chunks, duplicate state names, first slots
            without a per-seq state or beyond the budget, a line table over no per-seq state of
            this pool or naming more lines than a slot holds, or a budget that cannot hold one
            sequence (one page plus a slot when there are per-seq states).
    """

    paged: tuple[PagedState, ...]
    per_seq: tuple[SeqState, ...]
    unit: int
    row_pages: int
    chunk: int
    chunks: int
    first_slots: int = 0
    line_tables: tuple[LineTable, ...] = ()

    def __post_init__(self) -> None:
        _check_states(self.paged, self.per_seq)
        for field in ("unit", "row_pages", "chunk"):
            _int(f"PoolConfig.{field}", getattr(self, field), 1)
        _int("PoolConfig.chunks", self.chunks, 0)
        if self.chunks > CHUNKS_MAX:
            raise ConfigError(f"a budget of {self.chunks} chunks of {self.chunk} bytes is past the {CHUNKS_MAX} chunks "
                              "a pool holds: ask for fewer tokens")
        _int("PoolConfig.first_slots", self.first_slots, 0)
        if self.first_slots and not self.per_seq:
            raise ConfigError("PoolConfig.first_slots needs at least one per-seq state")
        if self.first_slots > self.slots_max:
            raise ConfigError(
                f"{self.first_slots} first slots need more than the {self.chunks} chunks in the budget"
            )
        _check_line_tables(self.line_tables, self.per_seq)
        one = (1 if self.paged else 0, 1 if self.per_seq else 0)
        if self.chunks_for(*one) > self.chunks:
            what = " and ".join(w for w, n in zip(("one page", "one slot"), one, strict=True) if n)
            raise ConfigError(f"a budget of {self.chunks} chunk(s) of {self.chunk} bytes cannot hold {what}: it holds nothing")

    @property
    def arenas(self) -> tuple[str, ...]:
        """Arena names: paged states first, then per-seq states."""
        return tuple(s.name for s in self.paged) + tuple(s.name for s in self.per_seq)

    @property
    def page_bytes(self) -> tuple[int, ...]:
        """Bytes of one page in each paged arena."""
        return tuple(s.bytes_per_token * self.unit for s in self.paged)

    @property
    def slot_bytes(self) -> tuple[int, ...]:
        """Bytes of one slot in each per-seq arena."""
        return tuple(s.bytes_per_seq for s in self.per_seq)

    @property
    def pages_max(self) -> int:
        """Pages that fit when the whole budget is pages (0 without paged states)."""
        return _most(self.page_bytes, self.chunk, self.chunks)

    @property
    def slots_max(self) -> int:
        """Slots that fit when the whole budget is slots (0 without per-seq states)."""
        return _most(self.slot_bytes, self.chunk, self.chunks)

    def chunks_for(self, pages: int, slots: int) -> int:
        """Chunks that pages 0..pages-1 plus slots 0..slots-1 occupy (the densest layout).

        Raises:
            ApiError: pages or slots not an int >= 0.
        """
        if type(pages) is not int or type(slots) is not int or pages < 0 or slots < 0:
            raise ApiError(f"pages and slots must be ints >= 0, got {pages!r}, {slots!r}")
        return _span_total(self.page_bytes, self.chunk, pages) + _span_total(
            self.slot_bytes, self.chunk, slots
        )


def _check_line_tables(tables: tuple[LineTable, ...], per_seq: tuple[SeqState, ...]) -> None:
    if type(tables) is not tuple or not all(isinstance(t, LineTable) for t in tables):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigError("PoolConfig.line_tables must be a tuple of LineTable")
    states = {s.name: s for s in per_seq}
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ConfigError(f"line table names must be unique, got {sorted(names)}")
    for t in tables:
        state = states.get(t.state)
        if state is None:
            raise ConfigError(f"line table {t.name!r} indexes {t.state!r}, not a per-seq state of this pool")
        if t.lines > state.bytes_per_seq // t.stride:
            raise ConfigError(
                f"line table {t.name!r} names {t.lines} lines per sequence; a slot of {t.state!r} holds "
                f"{state.bytes_per_seq // t.stride} lines of {t.stride} bytes"
            )


def _check_states(paged: tuple[PagedState, ...], per_seq: tuple[SeqState, ...]) -> None:
    if type(paged) is not tuple or not all(isinstance(p, PagedState) for p in paged):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigError("paged states must be a tuple of PagedState")
    if type(per_seq) is not tuple or not all(isinstance(q, SeqState) for q in per_seq):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigError("per-seq states must be a tuple of SeqState")
    if not paged and not per_seq:
        raise ConfigError("a pool needs at least one paged or per-seq state")
    names = [s.name for s in paged] + [s.name for s in per_seq]
    if len(set(names)) != len(names):
        raise ConfigError(f"pooled state names must be unique, got {sorted(names)}")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _span_total(sizes: tuple[int, ...], chunk: int, count: int) -> int:
    return sum(_ceil(count * size, chunk) for size in sizes)


def _most(sizes: tuple[int, ...], chunk: int, chunks: int) -> int:
    if not sizes:
        return 0
    lo, hi = 0, chunks * chunk // min(sizes) + 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _span_total(sizes, chunk, mid) <= chunks:
            lo = mid
        else:
            hi = mid - 1
    return lo


def pool_config(
    paged: tuple[PagedState, ...],
    per_seq: tuple[SeqState, ...],
    *,
    unit: int,
    row_pages: int,
    capacity: Capacity,
    free_bytes: int | None = None,
    line_tables: tuple[LineTable, ...] = (),
) -> PoolConfig:
    """Size chunks and the budget for `capacity`, and return the frozen config.

    With `capacity.tokens` set, each pooled state gets its own whole-chunk arena budget:
    tokens (rounded down to the page unit) x bytes_per_token per paged state and
    (seqs + 2) x bytes_per_seq per per-seq state, each rounded up to whole chunks. With tokens
    unset, the budget is `free_bytes` minus `HEADROOM`. `first_slots` is seqs + 2 either way.

    Raises:
        ConfigError: bad states, unit, row_pages or capacity; tokens unset without free_bytes; a
            capacity that holds nothing (no live sequence, fewer tokens than one page, or free
            bytes that leave no room past the headroom); see also `PoolConfig`.
    """
    _check_states(paged, per_seq)
    _int("unit", unit, 1)
    _int("row_pages", row_pages, 1)
    if not isinstance(capacity, Capacity):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigError(f"capacity must be a Capacity, got {type(capacity).__name__}")
    if capacity.seqs < 1:
        raise ConfigError(f"Capacity.seqs is {capacity.seqs}: a pool for no live sequence holds nothing")
    if paged and capacity.tokens is not None and capacity.tokens < unit:
        raise ConfigError(
            f"Capacity.tokens {capacity.tokens} is less than one page of {unit} tokens: the pool would hold no page"
        )
    if capacity.tokens is None and free_bytes is not None:
        _int("free_bytes", free_bytes, 0)
    sizes = [s.bytes_per_token * unit for s in paged] + [s.bytes_per_seq for s in per_seq]
    chunk = chunk_bytes(min(sizes))
    slots = capacity.seqs + 2 if per_seq else 0
    if capacity.tokens is None:
        if free_bytes is None:
            raise ConfigError("Capacity.tokens is unset: pass free_bytes (device bytes still free)")
        chunks = max(0, free_bytes - HEADROOM) // chunk
    else:
        if capacity.tokens < 0:
            raise ConfigError(f"Capacity.tokens must not be negative, got {capacity.tokens}")
        tokens = capacity.tokens // unit * unit
        chunks = sum(_ceil(tokens * s.bytes_per_token, chunk) for s in paged)
        chunks += sum(_ceil(slots * s.bytes_per_seq, chunk) for s in per_seq)
    if chunks == 0:
        raise ConfigError(
            f"{free_bytes} free bytes leave no {chunk}-byte chunk past the {HEADROOM}-byte headroom: the pool holds nothing"
        )
    return PoolConfig(paged, per_seq, unit, row_pages, chunk, chunks, slots, line_tables)


@dataclass(frozen=True, slots=True)
class Unmap:
    """Unmap the chunk at `pos` of `arena` (it becomes free for the maps that follow)."""

    arena: str
    pos: int
    chunk: ChunkId


@dataclass(frozen=True, slots=True)
class Map:
    """Map physical `chunk` at position `pos` of `arena`."""

    arena: str
    pos: int
    chunk: ChunkId


@dataclass(frozen=True, slots=True)
class Grant:
    """Grant device access to positions [start, stop) of `arena` (after the maps)."""

    arena: str
    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class Remap:
    """A plan for the runtime: execute `unmaps`, then `maps`, then `grants`, in order.

    The made objects become usable (zero them first) once the runtime reports the plan landed
    with `Pool.complete(plan)`; the unmade ones are gone from the moment the plan is made.
    """

    serial: int
    unmaps: tuple[Unmap, ...]
    maps: tuple[Map, ...]
    grants: tuple[Grant, ...]
    made_pages: tuple[PageId, ...]
    unmade_pages: tuple[PageId, ...]
    made_slots: tuple[SlotId, ...]
    unmade_slots: tuple[SlotId, ...]


class ChunkMap:
    """Positions, user counts and physical chunks of every arena (internal to the pool)."""

    __slots__ = ("_chunk", "_free", "_sizes", "chunk_at", "names", "users")

    def __init__(self, config: PoolConfig) -> None:
        self.names = config.arenas
        self._sizes = config.page_bytes + config.slot_bytes
        self._chunk = config.chunk
        counts = [config.pages_max] * len(config.paged) + [config.slots_max] * len(config.per_seq)
        widths = [_ceil(n * s, config.chunk) for n, s in zip(counts, self._sizes, strict=True)]
        self.users: list[list[int]] = [[0] * w for w in widths]
        self.chunk_at: list[list[ChunkId | None]] = [[None] * w for w in widths]
        self._free: list[ChunkId] = [ChunkId(c) for c in range(config.chunks)]

    @property
    def free_chunks(self) -> int:
        """Physical chunks mapped nowhere."""
        return len(self._free)

    def span(self, arena: int, index: int) -> range:
        """Chunk positions of object `index` in `arena`."""
        size = self._sizes[arena]
        return range(index * size // self._chunk, _ceil((index + 1) * size, self._chunk))

    def cost(self, arenas: range, index: int, users: dict[tuple[int, int], int]) -> int:
        """Chunks needed to make object `index` in `arenas`, given overlay user counts."""
        need = 0
        for a in arenas:
            for p in self.span(a, index):
                if users.get((a, p), self.users[a][p]) == 0:
                    need += 1
        return need

    def make(self, arenas: range, index: int, maps: list[Map]) -> None:
        """Take a user on every position of the object, mapping the lowest free chunks."""
        for a in arenas:
            for p in self.span(a, index):
                if self.users[a][p] == 0:
                    chunk = heapq.heappop(self._free)
                    self.chunk_at[a][p] = chunk
                    maps.append(Map(self.names[a], p, chunk))
                self.users[a][p] += 1

    def unmake(self, arenas: range, index: int, unmaps: list[Unmap]) -> None:
        """Drop a user on every position of the object, unmapping positions left unused."""
        for a in arenas:
            for p in self.span(a, index):
                self.users[a][p] -= 1
                if self.users[a][p] == 0:
                    chunk = self.chunk_at[a][p]
                    assert chunk is not None
                    self.chunk_at[a][p] = None
                    heapq.heappush(self._free, chunk)
                    unmaps.append(Unmap(self.names[a], p, chunk))

    def snapshot(self) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[ChunkId | None, ...], ...], tuple[ChunkId, ...]]:
        """User counts, chunk placement and the sorted free list, as plain tuples."""
        return (
            tuple(tuple(u) for u in self.users),
            tuple(tuple(c) for c in self.chunk_at),
            tuple(sorted(self._free)),
        )


def grants(names: tuple[str, ...], maps: list[Map]) -> tuple[Grant, ...]:
    """Fold mapped positions into one access grant per contiguous run, per arena, in order."""
    out: list[Grant] = []
    for name in names:
        positions = sorted(m.pos for m in maps if m.arena == name)
        start = prev = None
        for p in positions:
            if start is None or prev is None or p != prev + 1:
                if start is not None and prev is not None:
                    out.append(Grant(name, start, prev + 1))
                start = p
            prev = p
        if start is not None and prev is not None:
            out.append(Grant(name, start, prev + 1))
    return tuple(out)
