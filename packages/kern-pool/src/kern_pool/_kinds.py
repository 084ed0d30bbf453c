"""Object tables for one kind (pages or slots): status per id, a lowest-first free heap, tallies."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from enum import IntEnum

__all__ = ["Kind", "Status"]


class Status(IntEnum):
    """Where one page or slot stands."""

    ABSENT = 0
    FREE = 1
    HELD = 2
    ARRIVING = 3
    LEAVING = 4


_FREE = Status.FREE
_HELD = Status.HELD


class Kind:
    """Pages or slots: ids 0..limit-1, the arenas they span, and running tallies (no scans)."""

    __slots__ = ("arenas", "free", "heap", "held", "limit", "state")

    def __init__(self, arenas: range, limit: int) -> None:
        self.arenas = arenas
        self.limit = limit
        self.state: list[Status] = [Status.ABSENT] * limit
        # NOTE: lazy heap: an entry is valid only while its id is FREE; `free` is the true count.
        self.heap: list[int] = []
        self.free = 0
        self.held = 0

    def take(self, n: int) -> list[int]:
        """Hold the `n` lowest-numbered free objects (the caller checked `free`)."""
        heap, state, pop, free, held = self.heap, self.state, heapq.heappop, _FREE, _HELD
        out: list[int] = []
        need = n
        while need:
            i = pop(heap)
            if state[i] is free:
                state[i] = held
                out.append(i)
                need -= 1
        self.free -= n
        self.held += n
        return out

    def give(self, ids: Sequence[int]) -> None:
        """Return held objects; they stay of this kind."""
        heap, state, push, free = self.heap, self.state, heapq.heappush, _FREE
        for i in ids:
            state[i] = free
            push(heap, i)
        self.free += len(ids)
        self.held -= len(ids)

    def arrive(self, i: int) -> None:
        """A made object landed (or was made at creation): it becomes free."""
        self.state[i] = Status.FREE
        heapq.heappush(self.heap, i)
        self.free += 1

    def highest_free(self, keep: int) -> list[int]:
        """Free ids, highest first, leaving the `keep` lowest free ones out."""
        ids = [i for i in range(self.limit - 1, -1, -1) if self.state[i] is Status.FREE]
        return ids[: max(0, len(ids) - keep)]

    def absent(self) -> list[int]:
        """Absent ids, lowest first."""
        return [i for i in range(self.limit) if self.state[i] is Status.ABSENT]
