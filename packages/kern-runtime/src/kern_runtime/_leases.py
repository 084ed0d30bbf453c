"""An engine's open sequences and their leases: the `Sequence` record, and `Leases`, which keeps
the open ones and asks the engine's `kern_pool.KVCache` for each new turn's reuse decision and the
lease it needs, and gives a finished turn's lease back to it."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import kern_pool
from kern_pool import Checkpoint, Hit, Lease, Parked
from kern_pool.cache import CacheFull, KVCache, Reuse, Source, lease_tokens

from .errors import EngineError
from .inputs import check_prompt
from .roles import ServingRoles

if TYPE_CHECKING:
    from ._seats import Seats

__all__ = ["Leases", "Sequence"]

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Sequence:
    """One conversation's row. Made by `Engine.sequence` / `Engine.branch`.

    Attributes:
        id: the engine's number for it.
        tokens: the conversation so far: the tokens with KV, then (after a step) the pending one.
        kv: tokens whose KV the live lease holds (0 without one).
        lease: the live lease while a turn runs, else None.
    """

    id: int
    tokens: list[int] = field(default_factory=list[int])
    kv: int = 0
    lease: Lease | None = None
    room: int = 0
    """Positions the live lease may write (its tokens), 0 without one."""


class Leases:
    """The engine's open sequences, each new turn's lease through the cache manager (the reuse
    decision, the lease it needs, its refusals in the engine's words) and each finished turn's
    lease back into the index."""

    def __init__(self, cache: KVCache, roles: ServingRoles, seats: Seats, reach: int) -> None:
        self.cache = cache
        self.roles = roles
        self.seats = seats
        self.reach = reach
        self.seqs: dict[int, Sequence] = {}
        """The open sequences by id, oldest first."""
        self._next = 0
        self.closed = False

    def open(self, tokens: Seq[int]) -> Sequence:
        """A new sequence of `tokens` (no KV yet), open from now on."""
        self.live()
        seq = Sequence(self._next, list(tokens))
        self._next += 1
        self.seqs[seq.id] = seq
        return seq

    def live(self) -> None:
        if self.closed:
            raise EngineError("this engine is closed")

    def mine(self, seq: Sequence) -> None:
        self.live()
        if self.seqs.get(seq.id) is not seq:
            raise EngineError(f"sequence {seq.id} is not open in this engine (released, or another engine's)")

    def need(self, prompt: list[int], room: int) -> int:
        """The lease tokens of `prompt` and `room` steps, checked against what one sequence holds."""
        check_prompt(self.roles, len(prompt), prompt)
        if isinstance(room, bool) or not isinstance(room, int) or room < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise EngineError(f"room must be at least 1 decode step, got {room!r}")
        need = lease_tokens(len(prompt), room)
        if need > self.reach:
            raise EngineError(f"the prompt ({len(prompt)} tokens) and {room} steps need {need} positions; one "
                              f"sequence holds at most {self.reach} here")
        return need

    def reuse(self, seq: Sequence, prompt: list[int], need: int) -> Reuse:
        """The reuse decision over `prompt`'s longest cached proper prefix and, unless the live
        lease continues, a lease of `need` tokens for it (seq.lease, kv and room set). Nothing
        changes when it fails but what eviction parked or dropped."""
        decision, hit = self._decide(seq, prompt, self._own(seq, need))
        if decision.source is not Source.CONTINUE and seq.lease is not None:
            # NOTE: the live lease goes into the index first (its KV stays reusable); the index
            # changed, so the decision is made again
            self.retire(seq)
            decision, hit = self._decide(seq, prompt, None)
        if decision.source is not Source.CONTINUE:
            lease = self._acquire(decision, hit, need)
            seq.lease, seq.kv, seq.room = lease, decision.length, need
            self.seats.vacate()
        return decision

    def _own(self, seq: Sequence, need: int) -> tuple[int, list[int]] | None:
        """(seq id, its tokens with KV) when `seq`'s live lease has room for `need` tokens (the
        cache manager decides whether the prompt continues it)."""
        if seq.lease is None or need > seq.room:
            return None
        return seq.id, seq.tokens[: seq.kv]

    def _decide(self, seq: Sequence, prompt: list[int],
                own: tuple[int, list[int]] | None) -> tuple[Reuse, Hit[Checkpoint, Parked] | None]:
        live = [(o.id, o.tokens[: o.kv]) for o in self.seqs.values() if o.lease is not None and o is not seq]
        return self.cache.decide(prompt, live, own)

    def _acquire(self, d: Reuse, hit: Hit[Checkpoint, Parked] | None, need: int) -> Lease:
        parent = self.seqs[d.live].lease if d.source is Source.FORK and d.live is not None else None
        return self._granted(lambda: self.cache.acquire(d, hit, need, parent))

    def keep_woken(self, seq: Sequence, length: int) -> None:
        """The woken prefix kept in the index as resident again, beside its parked copy, once the
        chunk that waited for the staged copies was queued (`KVCache.keep_woken`)."""
        assert seq.lease is not None
        self.cache.keep_woken(seq.lease, seq.tokens[:length])

    def room(self, ask: Callable[[], T]) -> T:
        """`ask` through the cache manager's room (remaps settled, the coldest entries evicted)."""
        return self._granted(lambda: self.cache.room(ask))

    def _granted(self, call: Callable[[], T]) -> T:
        """`call` (one that makes room through the cache manager), its refusals as the engine's
        one line."""
        try:
            return call()
        except CacheFull as full:
            raise EngineError(f"no memory for this sequence ({full}) and nothing left to evict: "
                              f"{sum(s.lease is not None for s in self.seqs.values())} live "
                              "sequence(s) hold the pool; finish or release some") from None
        except kern_pool.ExceedsPool as exc:
            raise EngineError(f"the sequence can never fit this pool: {exc}") from None

    def retire(self, seq: Sequence) -> None:
        """`seq`'s live lease (if any) into the index under the tokens it holds KV for."""
        lease = seq.lease
        if lease is None:
            return
        seq.lease, seq.room = None, 0
        self.seats.unseat(seq)
        self.cache.retire(lease, seq.tokens[: seq.kv])
        seq.kv = 0

    def drop(self, seq: Sequence) -> None:
        """`seq`'s live lease (if any) given back, nothing kept."""
        if seq.lease is not None:
            seq.lease.release()
            seq.lease, seq.kv, seq.room = None, 0, 0
        self.seats.unseat(seq)

    def release(self, seq: Sequence) -> None:
        """`seq` forgotten, its live lease given back."""
        self.drop(seq)
        del self.seqs[seq.id]

    def close(self) -> None:
        """No sequence opens from now on; every live lease goes back."""
        self.closed = True
        for seq in list(self.seqs.values()):
            self.drop(seq)
        self.seqs.clear()
