"""A token-keyed radix tree of kept sequences, generic over what it stores.

Entries live at exact token keys and carry a resident value (on the device), a parked value (on
the host), or both. `lookup` finds the longest usable entry for a prompt; `evict` parks or drops
the least recently hit resident leaf. A logical clock orders hits: no wall clock, no hashing, no
iteration over unordered containers, so the same calls give the same answers.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from enum import Enum
from typing import Generic, Protocol, TypeAlias, TypeVar

from kern_pool.errors import ApiError

__all__ = ["Evicted", "Hit", "Kept", "Prefix", "Tier", "common_prefix"]


class Kept(Protocol):
    """What the index stores: a length, whether it holds a state slot, and a release."""

    @property
    def length(self) -> int: ...

    @property
    def stateful(self) -> bool: ...

    def release(self) -> None: ...


R = TypeVar("R", bound=Kept)
P = TypeVar("P", bound=Kept)


class Tier(Enum):
    """Where a hit lives: on the device (Resident) or on the host (Parked)."""

    RESIDENT = "resident"
    PARKED = "parked"


@dataclass(frozen=True, slots=True)
class Hit(Generic[R, P]):
    """A usable entry: reuse its first `length` tokens. Exactly one of resident / parked is set.

    The value is borrowed from the index: clone it before any call that may evict.
    """

    length: int
    key: tuple[int, ...]
    resident: R | None
    parked: P | None

    @property
    def tier(self) -> Tier:
        """RESIDENT when `resident` is set, else PARKED."""
        return Tier.RESIDENT if self.resident is not None else Tier.PARKED


@dataclass(frozen=True, slots=True)
class Evicted(Generic[R, P]):
    """What `evict` did: the resident value at `key` left the device; the entry is parked or gone.

    Attributes:
        key: the entry's tokens (its length is `len(key)`).
        parked: the entry's host value now (borrowed from the index, like a hit's), or None when
            the entry was dropped.
        dropped: keys of the parked entries dropped to make room on the host, coldest first.
        value: the resident value that left; the index has released it (compare by identity only).
        stateful: whether the entry holds a state slot (usable only at exactly `len(key)`).
        parked_now: True when `park` made `parked` in this call; False when the entry was parked
            already (only its resident copy went) or was dropped.
        dropped_values: the parked values of `dropped`, in that order (released, identity only).
    """

    key: tuple[int, ...]
    parked: P | None
    dropped: tuple[tuple[int, ...], ...]
    value: R
    stateful: bool
    parked_now: bool
    dropped_values: tuple[P, ...]

    @property
    def tier(self) -> Tier | None:
        """Where the entry lives now: PARKED, or None when it left the index."""
        return Tier.PARKED if self.parked is not None else None


class _Entry(Generic[R, P]):
    __slots__ = ("key", "node", "parked", "resident", "stamp", "stateful")

    def __init__(self, key: tuple[int, ...], node: _Node[R, P], stateful: bool) -> None:
        self.key = key
        self.node = node
        self.stateful = stateful
        self.resident: R | None = None
        self.parked: P | None = None
        self.stamp = 0


class _Node(Generic[R, P]):
    # NOTE: `ids` is the edge as unsigned 64-bit ids, or None when it may hold one past 2**64 - 1:
    # edges are matched on `ids` by memcmp when the other side has ids too, else on `edge`.
    __slots__ = ("children", "depth", "edge", "entry", "ids", "parent", "park", "park_sl", "res", "res_sl")

    def __init__(self, edge: tuple[int, ...], ids: _Ids | None, parent: _Node[R, P] | None, depth: int) -> None:
        self.edge = edge
        self.ids = ids
        self.parent = parent
        self.depth = depth
        self.children: dict[int, _Node[R, P]] = {}
        self.entry: _Entry[R, P] | None = None
        self.res = self.park = self.res_sl = self.park_sl = 0

    def copy_counts(self, other: _Node[R, P]) -> None:
        self.res, self.park, self.res_sl, self.park_sl = other.res, other.park, other.res_sl, other.park_sl


_Region = tuple["_Node[R, P]", "_Node[R, P] | None", "_Node[R, P] | None"]
"""A lookup region: (owner, excluded child, only child): entries sharing one lcp with the prompt."""
_Candidate = tuple[int, int, "_Entry[R, P] | None", "_Region[R, P] | None"]


def _region_counts(region: _Region[R, P]) -> tuple[int, int]:
    """Stateless (resident, parked) entries in a region, by subtraction (no scan)."""
    owner, exclude, only = region
    if only is not None:
        return only.res_sl, only.park_sl
    res, park = owner.res_sl, owner.park_sl
    own = owner.entry
    if own is not None and not own.stateful:
        res -= own.resident is not None
        park -= own.parked is not None
    if exclude is not None:
        res -= exclude.res_sl
        park -= exclude.park_sl
    return res, park


def _compact(heap: list[tuple[int, int, _Entry[R, P]]], resident: bool) -> list[tuple[int, int, _Entry[R, P]]]:
    """Drop stale heap items (restamped, moved tier, or removed entries); keeps the order."""
    live = [
        item
        for item in heap
        if item[2].stamp == item[0]
        and item[2].node.entry is item[2]
        and (item[2].resident if resident else item[2].parked) is not None
    ]
    heapq.heapify(live)
    return live


_Ids: TypeAlias = "array[int]"
"""Token ids as array("Q"): sliced, concatenated and compared (by memcmp) like tuples."""


def _tokens(arg: str, key: object) -> Sequence[int]:
    """`key`'s token ids as a tuple (a list stays that list); ApiError naming `arg` unless `key`
    is a sequence (not str or bytes)."""
    if isinstance(key, str | bytes) or not isinstance(key, Sequence):
        raise ApiError(f"{arg} must be a sequence of token ids (ints >= 0), got {type(key).__name__}")
    return key if type(key) is list else tuple(key)  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]


def _ids(arg: str, tokens: Sequence[int]) -> _Ids | None:
    """`tokens` as unsigned 64-bit ids (None when an id is past 2**64 - 1); ApiError naming `arg`
    unless every element is an int >= 0."""
    # NOTE: one C-level pass over the types (bool is a subclass of int, not int itself; counting
    # in a list beats a set's hashing), then one into unsigned ids, which refuses a negative id
    # (and one too large, which min tells apart).
    ids: _Ids | None = None
    if list(map(type, tokens)).count(int) == len(tokens):
        with suppress(OverflowError):
            ids = array("Q", tokens)
        if ids is not None or min(tokens) >= 0:
            return ids
    at, bad = next((i, t) for i, t in enumerate(tokens) if type(t) is not int or t < 0)
    raise ApiError(f"{arg} must hold token ids (ints >= 0), got {bad!r} at index {at}")


def _matched(node: _Node[R, P], key: Sequence[int], ids: _Ids | None, d: int) -> int:
    """How many of `node`'s edge tokens `key` (and `ids`, its ids or None) holds from position `d`."""
    n = len(node.edge)
    if ids is not None and node.ids is not None:
        seg = ids[d : d + n]
        return n if len(seg) == n and seg == node.ids else common_prefix(node.ids, seg)
    return common_prefix(node.edge, tuple(key[d : d + n]))


def _check_kept(arg: str, value: object) -> None:
    """ApiError naming `arg` unless `value` has an int length, a bool stateful and release(), and is live."""
    length = getattr(value, "length", None)
    if type(length) is not int or type(getattr(value, "stateful", None)) is not bool:
        raise ApiError(
            f"{arg} must have an int length, a bool stateful and release() (a Checkpoint, a Parked, ...), "
            f"got {type(value).__name__}"
        )
    if not callable(getattr(value, "release", None)):
        raise ApiError(f"{arg} must have release(), got {type(value).__name__}")
    if getattr(value, "live", True) is False:
        raise ApiError(f"{arg} was released; it names nothing")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token sequences, by slice equality: windows doubling
    from the start until one differs, then a binary search inside it.

    Args:
        a: one sequence.
        b: the other.

    Returns:
        The number of leading positions where `a` and `b` agree.
    """
    lo, hi = 0, min(len(a), len(b))
    # NOTE: the slices compared (and copied, for lists) add up to about twice the common prefix,
    # not the shorter sequence: sequences that part early cost little however long they are.
    step = 32
    while True:
        end = min(hi, lo + step)
        if a[lo:end] != b[lo:end]:
            hi = end - 1
            break
        if end == hi:
            return hi
        lo, step = end, 2 * step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class Prefix(Generic[R, P]):
    """The radix tree. `unit` is the page size: stateless entries hit partially at whole pages."""

    __slots__ = ("_heap_p", "_heap_r", "_held", "_push", "_root", "_tick", "unit")

    def __init__(self, unit: int) -> None:
        """An empty index for pages of `unit` tokens.

        Raises:
            ApiError: `unit` is not a positive int.
        """
        if type(unit) is not int or unit <= 0:
            raise ApiError(f"Prefix unit must be a positive int (tokens per page), got {unit!r}")
        self.unit = unit
        # NOTE: id(value) -> the entry holding it, for membership only (never iterated): the index
        # owns each value once, so the same object under two keys or tiers is refused.
        self._held: dict[int, _Entry[R, P]] = {}
        self._root: _Node[R, P] = _Node((), array("Q"), None, 0)
        self._tick = 0
        self._push = 0
        self._heap_r: list[tuple[int, int, _Entry[R, P]]] = []
        self._heap_p: list[tuple[int, int, _Entry[R, P]]] = []

    # ---- counts and clock ----------------------------------------------------------------

    def _bump(self, entry: _Entry[R, P], res: int, park: int) -> None:
        node: _Node[R, P] | None = entry.node
        sl = not entry.stateful
        while node is not None:
            node.res += res
            node.park += park
            if sl:
                node.res_sl += res
                node.park_sl += park
            node = node.parent

    def _stamp(self, entry: _Entry[R, P]) -> None:
        self._tick += 1
        entry.stamp = self._tick
        self._push += 1
        if entry.resident is not None:
            heapq.heappush(self._heap_r, (entry.stamp, self._push, entry))
            if len(self._heap_r) > 2 * self._root.res + 64:
                self._heap_r = _compact(self._heap_r, True)
        if entry.parked is not None:
            heapq.heappush(self._heap_p, (entry.stamp, self._push, entry))
            if len(self._heap_p) > 2 * self._root.park + 64:
                self._heap_p = _compact(self._heap_p, False)

    def _stamp_path(self, node: _Node[R, P] | None) -> None:
        while node is not None:
            if node.entry is not None:
                self._stamp(node.entry)
            node = node.parent

    # ---- structure -----------------------------------------------------------------------

    def _find(self, key: tuple[int, ...], ids: _Ids | None) -> _Node[R, P] | None:
        node, d = self._root, 0
        while d < len(key):
            child = node.children.get(key[d])
            if child is None or _matched(child, key, ids, d) < len(child.edge):
                return None
            node, d = child, d + len(child.edge)
        return node

    def _make(self, key: tuple[int, ...], ids: _Ids | None) -> _Node[R, P]:
        node, d = self._root, 0
        while d < len(key):
            child = node.children.get(key[d])
            if child is None:
                leaf: _Node[R, P] = _Node(key[d:], None if ids is None else ids[d:], node, len(key))
                node.children[key[d]] = leaf
                return leaf
            m = _matched(child, key, ids, d)
            if m < len(child.edge):
                cut = child.ids
                mid: _Node[R, P] = _Node(child.edge[:m], None if cut is None else cut[:m], node, d + m)
                mid.copy_counts(child)
                child.edge = child.edge[m:]
                child.ids = None if cut is None else cut[m:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                node.children[key[d]] = mid
                child = mid
            node, d = child, d + m
        return node

    def _prune(self, node: _Node[R, P]) -> None:
        while node.parent is not None and node.entry is None and not node.children:
            parent = node.parent
            del parent.children[node.edge[0]]
            node = parent
        if node.parent is not None and node.entry is None and len(node.children) == 1:
            (child,) = node.children.values()
            child.edge = node.edge + child.edge
            child.ids = None if node.ids is None or child.ids is None else node.ids + child.ids
            child.parent = node.parent
            node.parent.children[node.edge[0]] = child

    def _drop_resident(self, entry: _Entry[R, P]) -> None:
        value = entry.resident
        assert value is not None
        entry.resident = None
        del self._held[id(value)]
        self._bump(entry, -1, 0)
        if entry.parked is None:
            entry.node.entry = None
            self._prune(entry.node)
        value.release()

    def _drop_parked(self, entry: _Entry[R, P]) -> None:
        value = entry.parked
        assert value is not None
        entry.parked = None
        del self._held[id(value)]
        self._bump(entry, 0, -1)
        if entry.resident is None:
            entry.node.entry = None
            self._prune(entry.node)
        value.release()

    # ---- insert --------------------------------------------------------------------------

    def insert(self, key: Sequence[int], value: R) -> bool:
        """Keep `value` under `key` (its first `value.length` tokens); the index owns it now.

        If a resident entry already has these tokens, it is re-stamped and `value` released;
        a parked-only entry becomes resident too. A stateless entry one page longer than a
        resident-only stateless entry on its path replaces that entry. Returns True when kept.
        Inserting the value the index already holds under `key` re-stamps it and returns False
        (nothing is released).

        Raises:
            ApiError: a key that is not token ids, an empty key, a value without length / stateful
                / release() or released, a length other than the key's, a statefulness other than
                the entry's, or a value the index already holds under another key or as a parked
                value (insert a clone). Nothing changes.
        """
        tokens = tuple(_tokens("key", key))
        ids = _ids("key", tokens)
        _check_kept("value", value)
        if not tokens or value.length != len(tokens):
            raise ApiError(f"key of {len(tokens)} tokens must be non-empty and equal the value's length {value.length}")
        holder = self._held.get(id(value))
        if holder is not None:
            if holder.resident is value and holder.key == tokens:
                self._stamp_path(holder.node)
                return False
            raise ApiError(
                f"value is already held by the index (under a key of {len(holder.key)} tokens); insert a clone"
            )
        found = self._find(tokens, ids)
        old = found.entry if found is not None and found.depth == len(tokens) else None
        if old is not None and old.stateful != value.stateful:
            raise ApiError("an entry with these tokens exists with a different statefulness")
        if old is not None and old.resident is not None:
            self._stamp_path(old.node)
            value.release()
            return False
        node = self._make(tokens, ids)
        entry = node.entry
        if entry is None:
            entry = _Entry(tokens, node, value.stateful)
            node.entry = entry
        entry.resident = value
        self._held[id(value)] = entry
        self._bump(entry, 1, 0)
        self._stamp_path(node)
        self._replace_shorter(entry, ids)
        return True

    def _replace_shorter(self, entry: _Entry[R, P], ids: _Ids | None) -> None:
        if entry.stateful or len(entry.key) <= self.unit:
            return
        shorter = self._find(entry.key[: -self.unit], None if ids is None else ids[: -self.unit])
        old = shorter.entry if shorter is not None else None
        if old is not None and not old.stateful and old.resident is not None and old.parked is None:
            self._drop_resident(old)

    # ---- lookup --------------------------------------------------------------------------

    def lookup(self, prompt: Sequence[int]) -> Hit[R, P] | None:
        """The longest usable entry covering a strict prefix of `prompt` (never its last token).

        A stateful entry is usable only at its exact length; a stateless one at its length, or
        at the whole pages it shares with the prompt. Longest wins; at equal length resident
        beats parked. A hit re-stamps the entries on its path (the root gets the newest tick).

        Raises:
            ApiError: `prompt` is not a sequence of token ids (ints >= 0).
        """
        tokens = _tokens("prompt", prompt)
        ids = _ids("prompt", tokens)
        best: tuple[int, int] = (0, -1)
        pick: _Candidate[R, P] | None = None
        # NOTE: with ids, the prompt is matched on them alone (no tuple made, no tokens sliced)
        qi = None if ids is None else ids[:-1]
        q: Sequence[int] = tokens[:-1] if qi is None else qi
        for cand in self._candidates(q, qi):
            if (cand[0], cand[1]) > best:
                best, pick = (cand[0], cand[1]), cand
        if pick is None:
            return None
        resident = best[1] == 1
        entry = pick[2]
        if entry is None:
            assert pick[3] is not None
            entry = self._witness(pick[3], resident)
        self._stamp_path(entry.node)
        res = entry.resident if resident else None
        return Hit(best[0], entry.key, res, None if resident else entry.parked)

    def _candidates(self, q: Sequence[int], qi: _Ids | None) -> Iterator[_Candidate[R, P]]:
        """Yield (length, rank, entry, region): entries on the path deepest first, then regions
        (`qi`: the ids of `q`, or None)."""
        node, d = self._root, 0
        regions: list[tuple[int, _Region[R, P]]] = []
        full: list[_Entry[R, P]] = []
        while True:
            if node.entry is not None:
                full.append(node.entry)
            child = node.children.get(q[d]) if d < len(q) else None
            if child is None:
                regions.append((d, (node, None, None)))
                break
            m = _matched(child, q, qi, d)
            regions.append((d, (node, child, None)))
            if m < len(child.edge):
                regions.append((d + m, (node, None, child)))
                break
            node, d = child, d + m
        for entry in reversed(full):
            yield len(entry.key), 1 if entry.resident is not None else 0, entry, None
        for m, region in reversed(regions):
            length = m // self.unit * self.unit
            if length == 0:
                continue
            res, park = _region_counts(region)
            if res or park:
                yield length, 1 if res else 0, None, region

    def _witness(self, region: _Region[R, P], resident: bool) -> _Entry[R, P]:
        owner, exclude, only = region
        roots = [only] if only is not None else [owner.children[t] for t in sorted(owner.children)]
        for root in roots:
            node = root
            while root is not exclude and (node.res_sl if resident else node.park_sl) > 0:
                e = node.entry
                if e is not None and not e.stateful and (e.resident if resident else e.parked) is not None:
                    return e
                node = next(
                    node.children[t]
                    for t in sorted(node.children)
                    if (node.children[t].res_sl if resident else node.children[t].park_sl) > 0
                )
        raise AssertionError("region counts promised a stateless entry")

    # ---- evict ---------------------------------------------------------------------------

    def _coldest(self, heap: list[tuple[int, int, _Entry[R, P]]], resident: bool) -> _Entry[R, P] | None:
        while heap:
            stamp, _, e = heap[0]
            if (e.resident if resident else e.parked) is not None and e.stamp == stamp and e.node.entry is e:
                # NOTE: every stamp walks from an entry up to the root, so an entry is always older
                # than the entries above it: the coldest entry of a tier is a leaf of that tier.
                assert (e.node.res if resident else e.node.park) == 1
                return e
            heapq.heappop(heap)
        return None

    def evict(self, park: Callable[[R], P | None] | None) -> Evicted[R, P] | None:
        """Park or drop the least recently hit resident leaf; None when nothing is resident.

        `park(value)` copies the value to the host and returns the parked value, or None when
        the host is full; it must not release `value` (the index releases it once parked).
        On None the coldest parked leaf is dropped and the park retried; with no host
        (`park` is None) or nothing parked left, the entry is dropped. An entry already parked
        just lets its resident copy go. If `park` raises, the entry is dropped and the error
        propagates; a `park` that returns something the index cannot keep (no length /
        stateful / release(), another length or statefulness, a value the index already holds)
        is such an error too: the entry is dropped and ApiError raised.

        Raises:
            ApiError: `park` is neither None nor callable (nothing changes), or it returned a
                value the index cannot keep (the entry is dropped).
        """
        if park is not None and not callable(park):
            raise ApiError(f"park must be a callable or None, got {type(park).__name__}")
        entry = self._coldest(self._heap_r, True)
        if entry is None:
            return None
        value = entry.resident
        assert value is not None
        if entry.parked is not None or park is None:
            had = entry.parked
            self._drop_resident(entry)
            return Evicted(entry.key, had, (), value, entry.stateful, False, ())
        dropped: list[_Entry[R, P]] = []
        gone: list[P] = []
        while True:
            try:
                parked = park(value)
                if parked is not None:
                    self._check_parked(entry, parked)
            except BaseException:
                self._drop_resident(entry)
                raise
            if parked is not None:
                entry.parked = parked
                self._held[id(parked)] = entry
                self._bump(entry, 0, 1)
                self._push += 1
                heapq.heappush(self._heap_p, (entry.stamp, self._push, entry))
                self._drop_resident(entry)
                return Evicted(entry.key, parked, tuple(e.key for e in dropped), value, entry.stateful, True, tuple(gone))
            victim = self._coldest(self._heap_p, False)
            if victim is None:
                self._drop_resident(entry)
                return Evicted(entry.key, None, tuple(e.key for e in dropped), value, entry.stateful, False, tuple(gone))
            dropped.append(victim)
            assert victim.parked is not None
            gone.append(victim.parked)
            self._drop_parked(victim)

    def _check_parked(self, entry: _Entry[R, P], parked: P) -> None:
        _check_kept("park's result", parked)
        if parked.length != len(entry.key) or parked.stateful != entry.stateful:
            raise ApiError(
                f"park returned a value of {parked.length} tokens (stateful {parked.stateful}) for an entry of "
                f"{len(entry.key)} (stateful {entry.stateful})"
            )
        if id(parked) in self._held:
            raise ApiError("park returned a value the index already holds; return a new parked value")

    # ---- views ---------------------------------------------------------------------------

    def count(self, tier: Tier) -> int:
        """Entries with a value in `tier`.

        Raises:
            ApiError: `tier` is not a Tier.
        """
        if not isinstance(tier, Tier):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"tier must be a Tier (RESIDENT or PARKED), got {tier!r}")
        return self._root.res if tier is Tier.RESIDENT else self._root.park

    def entries(self) -> list[tuple[tuple[int, ...], bool, bool]]:
        """(key, resident?, parked?) for every entry, in key order."""
        out: list[tuple[tuple[int, ...], bool, bool]] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.entry is not None:
                e = node.entry
                out.append((e.key, e.resident is not None, e.parked is not None))
            stack.extend(node.children[t] for t in sorted(node.children, reverse=True))
        return out

    def clear(self) -> None:
        """Release every value (in key order) and empty the index."""
        for key, res, park in self.entries():
            node = self._find(key, None)
            assert node is not None and node.entry is not None
            entry = node.entry
            if res:
                self._drop_resident(entry)
            if park:
                self._drop_parked(entry)
        self._heap_r.clear()
        self._heap_p.clear()
