"""The KV-cache manager: the one owner of what a prompt's KV is reused from and of what is given
up to make room.

`KVCache` holds the prefix index (resident checkpoints and parked copies), decides where a new
prompt's cached prefix comes from (`decide`: the index, a live sequence, or the sequence's own
lease), acquires the lease that decision needs (a fresh lease, a fork, a restore, a wake straight
into the lease), keeps a woken prefix in the index as resident again, retires finished turns into
the index, and answers a busy pool by evicting the coldest resident entry (parked on the host tier
when there is one and it has room, else dropped). It drives the device through `CacheDevice`,
the memory half of an engine's backend; `PoolDevice` is that protocol over a bare `Pool` and
`Host` (decisions only, no bytes), for simulators and tests. The runtime's engine, kern-pool-sim
and the property tests all run this one manager, so a policy change is made here once.

A prompt's KV can come from three places: the index (a resident checkpoint: `restore`, or a
parked copy: `wake_now` into the lease), or a live sequence sharing its first tokens (`fork`).
The longest wins; at equal length a resident entry beats a live sequence (neither costs more than
a partial page, the index keeps its own stamps), and both beat a parked copy (host-to-device).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, TypeVar

from kern_pool.errors import Busy, Denied, HostFull, Remapping
from kern_pool.host import Host, Parked
from kern_pool.pages import Checkpoint, Lease, Pool
from kern_pool.prefix import Evicted, Hit, Prefix, Tier, common_prefix

__all__ = [
    "CacheCounters",
    "CacheDevice",
    "CacheFull",
    "KVCache",
    "PoolDevice",
    "Reuse",
    "Source",
    "lease_tokens",
    "pick_reuse",
    "shared_prefix",
]

T = TypeVar("T")


class Source(Enum):
    """Where a prompt's reused KV comes from."""

    FRESH = "fresh"
    """Nothing reused: a fresh lease, the whole prompt prefilled."""
    RESIDENT = "resident"
    """A resident checkpoint of the prefix index: `restore` (lease_from) at the hit's length."""
    PARKED = "parked"
    """A parked copy of the prefix index: woken straight into the lease at the hit's length."""
    FORK = "fork"
    """A live sequence: `fork` its lease at the shared length."""
    CONTINUE = "continue"
    """The sequence's own live lease holds the prefix and has room: prefill the rest in place."""


@dataclass(frozen=True, slots=True)
class Reuse:
    """A decision: reuse the first `length` tokens from `source` (`live`: the live sequence's id
    for FORK and CONTINUE)."""

    source: Source
    length: int
    live: int | None = None


def shared_prefix(kept: Sequence[int], prompt: Sequence[int], stateful: bool) -> int:
    """Tokens of `kept` (a live sequence's tokens with KV) that `prompt` can reuse: the common
    prefix with every prompt token but the last; a stateful sequence only as a whole (its state is
    the state at its end)."""
    n = min(common_prefix(kept, prompt), max(len(prompt) - 1, 0))
    if stateful and n != len(kept):
        return 0
    return n


def pick_reuse(hit: tuple[int, Tier] | None, live: Sequence[tuple[int, int]],
               own: tuple[int, int] | None = None) -> Reuse:
    """The reuse for a prompt.

    Args:
        hit: the prefix index's hit as (length, tier), or None.
        live: (sequence id, shared length) of live sequences that could be forked.
        own: (sequence id, shared length) when the prompt's own sequence holds a live lease with
            room for it; continuing in place wins whenever it covers at least as much.
    """
    best = Reuse(Source.FRESH, 0)
    if hit is not None and hit[0] > 0:
        best = Reuse(Source.RESIDENT if hit[1] is Tier.RESIDENT else Source.PARKED, hit[0])
    for seq, length in live:
        if length > best.length or (length == best.length and length > 0 and best.source is Source.PARKED):
            best = Reuse(Source.FORK, length, seq)
    if own is not None and own[1] > 0 and own[1] >= best.length:
        best = Reuse(Source.CONTINUE, own[1], own[0])
    return best


def lease_tokens(prompt: int, room: int) -> int:
    """Tokens a turn's lease holds: the prompt, then `room` decode steps, the first of which
    computes the last prompt token (so `prompt + room - 1`, at least the prompt)."""
    return max(prompt, prompt + room - 1)


class CacheFull(Denied):
    """The pool is busy and the index holds nothing left to evict: live leases hold every page."""


class CacheDevice(Protocol):
    """The memory half of an engine's backend: kern_pool's decisions, executed."""

    @property
    def pool(self) -> Pool: ...

    def lease(self, tokens: int) -> Lease: ...

    def restore(self, checkpoint: Checkpoint, length: int, tokens: int) -> Lease: ...

    def fork(self, parent: Lease, length: int, tokens: int) -> Lease: ...

    def checkpoint(self, lease: Lease, length: int) -> Checkpoint: ...

    def retire(self, lease: Lease, length: int) -> Checkpoint: ...

    def park(self, checkpoint: Checkpoint) -> Parked: ...

    def wake_now(self, parked: Parked, length: int, tokens: int) -> Lease: ...

    def settle(self) -> None: ...


@dataclass(slots=True)
class CacheCounters:
    """What the manager did for room and reuse."""

    parks: int = 0
    wakes: int = 0
    evictions: int = 0
    dropped: int = 0


class KVCache:
    """The prefix index and the reuse / eviction policy over one `CacheDevice`.

    `park`: evicted entries go to the device's host tier (else they are dropped).
    """

    def __init__(self, device: CacheDevice, *, park: bool = False, counters: CacheCounters | None = None,
                 on_evict: Callable[[Evicted[Checkpoint, Parked]], None] | None = None) -> None:
        self.device = device
        self.park = park
        self.prefix: Prefix[Checkpoint, Parked] = Prefix(device.pool.unit)
        self.counters = counters if counters is not None else CacheCounters()
        self.on_evict = on_evict
        """Called with every eviction's record (reports, tests)."""

    # ---- decisions ---------------------------------------------------------------------------

    def decide(self, prompt: Sequence[int], live: Iterable[tuple[int, Sequence[int]]],
               own: tuple[int, Sequence[int]] | None = None) -> tuple[Reuse, Hit[Checkpoint, Parked] | None]:
        """Where `prompt`'s cached prefix comes from: the index's hit, a live sequence ((id, its
        tokens with KV) each), or `own` ((id, tokens with KV) of the prompt's own sequence, given
        when its live lease has room for the prompt: it continues in place when the prompt starts
        with all of them). The hit is borrowed from the index."""
        stateful = self.device.pool.has_slots
        hit = self.prefix.lookup(prompt)
        shared = [(i, shared_prefix(kept, prompt, stateful)) for i, kept in live]
        mine = None
        if own is not None:
            n = shared_prefix(own[1], prompt, stateful)
            mine = (own[0], n) if n == len(own[1]) else None
        return pick_reuse(None if hit is None else (hit.length, hit.tier), shared, mine), hit

    def cached(self, prompt: Sequence[int], live: Iterable[Sequence[int]]) -> int:
        """The prompt tokens reusable now (the index's hit or a live sequence's shared prefix),
        as `decide` would find them; for schedulers that size a turn before it runs."""
        reuse, _ = self.decide(prompt, enumerate(live))
        return reuse.length

    # ---- leases ------------------------------------------------------------------------------

    def acquire(self, d: Reuse, hit: Hit[Checkpoint, Parked] | None, need: int, parent: Lease | None = None) -> Lease:
        """The lease of `need` tokens a decision asks for (`parent`: the live lease of a FORK),
        making room as it must. Raises CacheFull, or ExceedsPool / ExceedsRow from the pool."""
        if d.source is Source.FRESH:
            return self.room(lambda: self.device.lease(need))
        if d.source is Source.FORK:
            assert parent is not None
            return self.room(lambda: self.device.fork(parent, d.length, need))
        # NOTE: the hit is borrowed from the index; it is cloned before anything may evict.
        assert hit is not None and hit.length == d.length and d.source is not Source.CONTINUE
        if hit.resident is not None:
            cp = hit.resident.clone()
            try:
                return self.room(lambda: self.device.restore(cp, d.length, need))
            finally:
                cp.release()
        assert hit.parked is not None
        held = hit.parked.clone()
        try:
            lease = self.room(lambda: self.device.wake_now(held, d.length, need))
        finally:
            held.release()
        self.counters.wakes += 1
        return lease

    def keep_woken(self, lease: Lease, key: Sequence[int]) -> Checkpoint | None:
        """A woken prefix (`key`, the lease's first tokens) back in the index as resident, beside
        its parked copy: a checkpoint of the lease (taken once the chunk that waited for the wake
        was queued), returned as offered to the index (released when the index had it already).
        None when live leases hold every page: the parked copy stays."""
        try:
            cp = self.room(lambda: self.device.checkpoint(lease, len(key)))
        except CacheFull:
            return None
        self.prefix.insert(key, cp)
        return cp

    def retire(self, lease: Lease, key: Sequence[int]) -> None:
        """Ends a turn's lease; its first `len(key)` tokens (`key`) go into the index in place
        (nothing kept when `key` is empty)."""
        if not key:
            lease.release()
            return
        self.prefix.insert(key, self.device.retire(lease, len(key)))

    # ---- room --------------------------------------------------------------------------------

    def room(self, ask: Callable[[], T]) -> T:
        """`ask` until the pool grants it: a remap in flight is settled, a busy pool evicts the
        coldest index entry. Raises CacheFull when nothing is left to evict; ExceedsPool and
        ExceedsRow pass through (never grantable)."""
        while True:
            try:
                return ask()
            except Remapping:
                self.device.settle()
            except Busy as busy:
                if not self.evict():
                    raise CacheFull(str(busy)) from None

    def evict(self) -> bool:
        """Park (or drop) the coldest resident entry; False when nothing is resident."""
        evicted = self.prefix.evict(self._park if self.park else None)
        if evicted is None:
            return False
        self.counters.evictions += 1
        self.counters.dropped += len(evicted.dropped) + (not evicted.parked)
        if self.on_evict is not None:
            self.on_evict(evicted)
        return True

    def _park(self, checkpoint: Checkpoint) -> Parked | None:
        try:
            parked = self.device.park(checkpoint)
        except HostFull:
            return None
        self.counters.parks += 1
        return parked

    def clear(self) -> None:
        """Releases every index entry."""
        self.prefix.clear()


class PoolDevice:
    """`CacheDevice` over a bare Pool (and Host): the decisions, no bytes moved (simulators and
    property tests). A remap plan lands at `settle`."""

    def __init__(self, pool: Pool, host: Host | None = None) -> None:
        self._pool = pool
        self.host = host

    @property
    def pool(self) -> Pool:
        return self._pool

    def lease(self, tokens: int) -> Lease:
        return self._pool.lease(tokens)

    def restore(self, checkpoint: Checkpoint, length: int, tokens: int) -> Lease:
        return self._pool.restore(checkpoint, length, tokens)[0]

    def fork(self, parent: Lease, length: int, tokens: int) -> Lease:
        return self._pool.fork(parent, length, tokens)[0]

    def checkpoint(self, lease: Lease, length: int) -> Checkpoint:
        return self._pool.checkpoint(lease, length)[0]

    def retire(self, lease: Lease, length: int) -> Checkpoint:
        return self._pool.retire(lease, length)

    def park(self, checkpoint: Checkpoint) -> Parked:
        if self.host is None:
            raise HostFull(0, 0)
        return self.host.park(checkpoint)[0]

    def wake_now(self, parked: Parked, length: int, tokens: int) -> Lease:
        assert self.host is not None, "a parked copy without a host tier"
        return self.host.restore(parked, length, tokens)[0]

    def settle(self) -> None:
        plan = self._pool.pending
        if plan is not None:
            self._pool.complete(plan)
