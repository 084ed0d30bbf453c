"""Object tables for one kind (pages or slots): status per id, a lowest-first free heap, tallies."""

from __future__ import annotations

import heapq
from enum import IntEnum

__all__ = ["Kind", "Status"]


class Status(IntEnum):
    """Where one page or slot stands."""

    ABSENT = 0
    FREE = 1
    HELD = 2
    ARRIVING = 3
    LEAVING = 4


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

    def take(self) -> int:
        """Hold the lowest-numbered free object (the caller checked `free`)."""
        while True:
            i = heapq.heappop(self.heap)
            if self.state[i] is Status.FREE:
                self.state[i] = Status.HELD
                self.free -= 1
                self.held += 1
                return i

    def give(self, i: int) -> None:
        """Return a held object; it stays of this kind."""
        assert self.state[i] is Status.HELD
        self.state[i] = Status.FREE
        heapq.heappush(self.heap, i)
        self.free += 1
        self.held -= 1

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
