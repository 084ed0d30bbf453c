"""Object tables for one kind (pages or slots): status per id, a lowest-first free set, tallies."""

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


_FREE = int(Status.FREE)
_HELD = int(Status.HELD)


_BITS = 64
"""Ids per block of the free set: one Python int bit mask per block."""
_FULL = (1 << _BITS) - 1
_HELD_BLOCK = bytes([_HELD]) * _BITS


class Kind:
    """Pages or slots: ids 0..limit-1, the arenas they span, and running tallies (no scans).

    The free set is a bit mask per block of 64 ids (bit set exactly when the id is FREE) plus a
    heap of the blocks that hold free ids, so taking the lowest-numbered free ids costs one heap
    step per block, and a whole free block is taken with two slice operations.
    """

    __slots__ = ("arenas", "blocks", "free", "held", "limit", "masks", "queued", "state")

    def __init__(self, arenas: range, limit: int) -> None:
        self.arenas = arenas
        self.limit = limit
        # NOTE: one byte per id (a Status value): runs change with one slice store.
        self.state = bytearray(limit)
        nblocks = -(-limit // _BITS)
        self.masks: list[int] = [0] * nblocks
        self.blocks: list[int] = []
        self.queued = bytearray(nblocks)
        self.free = 0
        self.held = 0

    def take(self, n: int) -> list[int]:
        """Hold the `n` lowest-numbered free objects (the caller checked `free`)."""
        state, masks, blocks, held = self.state, self.masks, self.blocks, _HELD
        out: list[int] = []
        need = n
        while need:
            b = blocks[0]
            m = masks[b]
            base = b * _BITS
            if m == _FULL and need >= _BITS:
                out += range(base, base + _BITS)
                state[base : base + _BITS] = _HELD_BLOCK
                need -= _BITS
                m = 0
            else:
                while m and need:
                    low = m & -m
                    m ^= low
                    i = base + low.bit_length() - 1
                    state[i] = held
                    out.append(i)
                    need -= 1
            masks[b] = m
            if not m:
                heapq.heappop(blocks)
                self.queued[b] = 0
        self.free -= n
        self.held += n
        return out

    def _set(self, b: int, bits: int) -> None:
        self.masks[b] |= bits
        if not self.queued[b]:
            self.queued[b] = 1
            heapq.heappush(self.blocks, b)

    def give(self, ids: Sequence[int]) -> None:
        """Return held objects (distinct ids); they stay of this kind."""
        n = len(ids)
        if n == 1:
            i = ids[0]
            self.state[i] = _FREE
            self._set(i // _BITS, 1 << (i % _BITS))
        elif n and max(ids) - (lo := min(ids)) == n - 1:
            self._give_run(lo, lo + n)  # NOTE: n distinct ids within n consecutive: exactly that run
        elif n:
            self._give_each(ids)
        self.free += n
        self.held -= n

    def give_ascending(self, ids: Sequence[int]) -> None:
        """`give` for ids in ascending order: a run is seen from its ends, without a scan."""
        n = len(ids)
        if n > 1 and ids[-1] - ids[0] == n - 1:
            self._give_run(ids[0], ids[0] + n)
            self.free += n
            self.held -= n
        else:
            self.give(ids)

    def _give_run(self, start: int, stop: int) -> None:
        """Free the run [start, stop): one slice store, one mask update per block."""
        self.state[start:stop] = bytes([_FREE]) * (stop - start)
        b = start // _BITS
        while start < stop:
            end = min(stop, (b + 1) * _BITS)
            self._set(b, ((1 << (end - start)) - 1) << (start - b * _BITS))
            start, b = end, b + 1

    def _give_each(self, ids: Sequence[int]) -> None:
        state, free = self.state, _FREE
        block, bits = -1, 0
        for i in ids:
            state[i] = free
            b = i // _BITS
            if b != block:
                if bits:
                    self._set(block, bits)
                block, bits = b, 0
            bits |= 1 << (i % _BITS)
        if bits:
            self._set(block, bits)

    def arrive(self, i: int) -> None:
        """A made object landed (or was made at creation): it becomes free."""
        self.state[i] = _FREE
        self._set(i // _BITS, 1 << (i % _BITS))
        self.free += 1

    def retire(self, i: int) -> None:
        """A free object starts leaving this kind (its memory is unmapped by a remap plan)."""
        self.state[i] = Status.LEAVING.value
        self.masks[i // _BITS] &= ~(1 << (i % _BITS))
        self.free -= 1

    def highest_free(self, keep: int) -> list[int]:
        """Free ids, highest first, leaving the `keep` lowest free ones out."""
        ids = [i for i in range(self.limit - 1, -1, -1) if self.state[i] == _FREE]
        return ids[: max(0, len(ids) - keep)]

    def absent(self) -> list[int]:
        """Absent ids, lowest first."""
        absent = Status.ABSENT.value
        return [i for i in range(self.limit) if self.state[i] == absent]
