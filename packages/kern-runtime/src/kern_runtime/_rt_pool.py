"""`Runtime`'s sequence memory: kern_pool's decisions (pages, slots, checkpoints, the host tier)
carried out on its VMM arenas by its `Sequences`, and the bytes of its states."""

from __future__ import annotations

from typing import overload

import numpy as np
import numpy.typing as npt

import kern_pool

from ._hosttier import Waking
from ._rt_memory import Memory
from .sequences import Sequences

__all__ = ["SequenceMethods"]


class SequenceMethods:
    """The base of `Runtime`: its methods over the sequence pool, each checking the runtime is
    open and has a pool, then handing over to its `Sequences`."""

    _memory: Memory

    def _pool(self) -> Sequences:
        return self._memory.pool()

    @property
    def pool(self) -> kern_pool.Pool:
        """The kern_pool Pool deciding pages and slots (for schedulers that read its counts)."""
        return self._pool().pool

    def lease(self, tokens: int, *, wait: bool = True) -> kern_pool.Lease:
        """Fresh pages for `tokens` tokens plus a slot per per-seq state, zeroed on the stream.

        A remap the request needs runs on a background thread; `wait` (the default) blocks until
        it landed, `wait=False` raises `kern_pool.Remapping` instead (ask again later).

        Raises:
            ApiError: no pool, or bad tokens. kern_pool.Denied (ExceedsRow, ExceedsPool, Busy,
                Remapping without wait): nothing fits now.
        """
        return self._pool().lease(tokens, wait)

    def lease_slot(self, *, wait: bool = True) -> kern_pool.Lease:
        """A slot-only lease (a peer rank's share of a row): a slot per per-seq state, no pages,
        zeroed on the stream.

        Raises:
            ApiError: no pool, or a pool without per-seq states. kern_pool.Denied: no slot now.
        """
        return self._pool().lease_slot(wait)

    def retire(self, lease: kern_pool.Lease, length: int) -> kern_pool.Checkpoint:
        """Ends `lease` and keeps its first `length` tokens where they are (no copy): the cheap
        checkpoint of a sequence that will not go on.

        Raises:
            ApiError: no pool, a released / foreign lease, or length not in [1, lease.tokens].
        """
        return self._pool().retire(lease, length)

    def checkpoint(self, lease: kern_pool.Lease, length: int, *, wait: bool = True) -> kern_pool.Checkpoint:
        """Keeps `lease`'s first `length` tokens; the partial page and slot are copied on the stream."""
        return self._pool().checkpoint(lease, length, wait)

    def restore(
        self, checkpoint: kern_pool.Checkpoint, length: int, tokens: int, *, wait: bool = True
    ) -> kern_pool.Lease:
        """A new lease starting from `checkpoint`'s first `length` tokens, with room for `tokens`."""
        return self._pool().restore(checkpoint, length, tokens, wait)

    lease_from = restore

    def fork(self, parent: kern_pool.Lease, length: int, tokens: int, *, wait: bool = True) -> kern_pool.Lease:
        """A new lease sharing `parent`'s first `length` tokens (partial page and slot copied)."""
        return self._pool().fork(parent, length, tokens, wait)

    @property
    def remapping(self) -> bool:
        """True while a remap plan is in flight (made, not yet collected)."""
        return self._pool().remapping

    def settle(self) -> None:
        """Blocks until the remap plan in flight, if any, has landed and its new pages and slots
        are zeroed and leasable."""
        self._pool().settle()

    def reserve_host(self, pages: int, slots: int) -> kern_pool.Host:
        """The host tier: one pinned block (`cuMemHostAlloc`, on the GPU's NUMA node) for `pages`
        parked pages and `slots` parked slots; once per runtime.

        Raises:
            ApiError: no pool, already reserved, or counts holding nothing.
        """
        return self._pool().reserve_host(pages, slots)

    def enable_host_tier(self, nbytes: int) -> kern_pool.Host:
        """The host tier in at most `nbytes` of pinned memory (whole units); once.

        Raises:
            ApiError: no pool, already enabled, or too few bytes for one page or slot.
        """
        return self._pool().enable_host(nbytes)

    @property
    def host(self) -> kern_pool.Host:
        """The host tier's kern_pool planner (counts, free runs).

        Raises:
            ApiError: no pool, or the host tier is not enabled.
        """
        return self._pool().host

    def room(self, checkpoint: kern_pool.Checkpoint) -> kern_pool.Room | kern_pool.Checkpoint:
        """Host units for parking `checkpoint` (the Room holds it until `park(room)`), or the
        checkpoint itself back when the host block cannot hold it (evict a parked entry, retry).

        Raises:
            ApiError: no host tier, or a released / foreign checkpoint.
        """
        return self._pool().room(checkpoint)

    def park(self, checkpoint: kern_pool.Checkpoint | kern_pool.Room) -> kern_pool.Parked:
        """Parks on the host tier (`checkpoint` is a Checkpoint, or a Room from `room`).

        A Room: copies on the transfer stream, which starts after everything queued
        on the compute stream and never holds it up; the room's checkpoint is kept until the copies
        landed, then released. A Checkpoint: copies on the compute stream, and the checkpoint stays
        valid (release it when the device copy is no longer wanted). Pages an earlier park of the
        chain left on the host are not copied again.

        Raises:
            ApiError: no host tier, or a released / foreign handle. kern_pool.HostFull: a
                Checkpoint the block cannot hold; nothing was kept.
        """
        seqs = self._pool()
        if isinstance(checkpoint, kern_pool.Room):
            return seqs.park_room(checkpoint)
        return seqs.park(checkpoint)

    def park_now(self, checkpoint: kern_pool.Checkpoint) -> kern_pool.Parked:
        """Parks on the compute stream and lets the checkpoint go at once (what reuses its pages
        is ordered after the copies).

        Raises:
            ApiError: no host tier, or a released / foreign checkpoint. kern_pool.HostFull: the
                block cannot hold it; nothing was kept, the checkpoint is still the caller's.
        """
        return self._pool().park_now(checkpoint)

    @overload
    def wake(self, parked: kern_pool.Parked, length: int) -> kern_pool.Checkpoint: ...

    @overload
    def wake(self, parked: kern_pool.Parked, length: int, tokens: int, *, wait: bool = True) -> Waking: ...

    def wake(
        self, parked: kern_pool.Parked, length: int, tokens: int | None = None, *, wait: bool = True
    ) -> kern_pool.Checkpoint | Waking:
        """Wakes a parked copy's first `length` tokens; `parked` stays valid.

        With `tokens`: a `Waking` whose lease (room for `tokens`) is filled on the transfer
        stream; `awake` hands the lease over once the copies landed. Without: a device
        Checkpoint filled on the compute stream (`restore` it to continue).

        Raises:
            ApiError: no host tier, a released / foreign Parked, or a bad length or tokens.
                kern_pool.Denied: the pool cannot give the pages or slot now.
        """
        seqs = self._pool()
        if tokens is None:
            return seqs.wake(parked, length)
        return seqs.wake_async(parked, length, tokens, wait)

    def wake_now(self, parked: kern_pool.Parked, length: int, tokens: int, *, wait: bool = True) -> kern_pool.Lease:
        """A lease of `tokens` from a parked copy's first `length` tokens, usable at once; `parked`
        stays valid. The copies are staged on the transfer stream slice by slice (the manifest's
        `slices` of a paged state, else whole pages): until they landed, each eager call waits
        only for the slices its state args touch, so a prefill's first layers run while the last
        layers' pages are still copied; a graph, a capture and pool work on the compute stream
        wait for every slice.

        Raises:
            ApiError: as `wake`. kern_pool.Denied: the pool cannot give the pages or slot now.
        """
        return self._pool().wake_now(parked, length, tokens, wait)

    def awake(self, waking: Waking) -> kern_pool.Lease | Waking:
        """The woken lease once its copies landed, else `waking` itself; never blocks.

        Raises:
            ApiError: a Waking of another runtime, or one already awake or released.
        """
        return self._pool().awake(waking)

    def landed(self, waking: Waking) -> bool:
        """Whether a Waking's copies landed (it stays a Waking); never blocks."""
        return self._pool().landed(waking)

    def copy_out(self, copies: kern_pool.ParkCopies) -> None:
        """Performs a park decision made for the same ids elsewhere (a tray's head) on the
        compute stream: device pages and slot to host units.

        Raises:
            ApiError: no host tier, or an id outside this pool or host block.
        """
        self._pool().copy_out(copies)

    def copy_in(self, copies: kern_pool.WakeCopies) -> None:
        """Performs a wake decision made for the same ids elsewhere on the compute stream.

        Raises:
            ApiError: no host tier, or an id outside this pool or host block.
        """
        self._pool().copy_in(copies)

    def read_state(self, name: str, start: int, nbytes: int) -> npt.NDArray[np.uint8]:
        """`nbytes` of state `name` from byte `start` (mapped memory only); synchronizes."""
        return self._memory.read_state(name, start, nbytes)

    def write_state(self, name: str, start: int, data: npt.ArrayLike) -> None:
        """Writes bytes into state `name` at byte `start` (mapped memory only); synchronizes."""
        self._memory.write_state(name, start, data)

    def zero_state(self, name: str, start: int, nbytes: int) -> None:
        """Zeroes `nbytes` of state `name` from byte `start` on the device (mapped memory only);
        synchronizes."""
        self._memory.zero_state(name, start, nbytes)
