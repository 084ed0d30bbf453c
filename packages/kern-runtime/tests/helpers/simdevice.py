"""A simulated device for kern_runtime's driver shell on the CPU: the calls `Sequences` makes
(VMM reservations, chunks mapped and granted, streams, events, async copies and memsets, pinned
host blocks), executed on numpy bytes.

Streams are queues that run out of order with each other: every driver call runs a seeded random
number of the ops that may run (a stream's head, unless it waits for an event not yet passed), so
work on two streams interleaves as the seed says, and a missing wait shows up as wrong bytes. A
copy resolves its addresses when it runs: touching memory that is not mapped and granted then is
a `SimFault`. Calls from the remap thread are serialised with the caller's by one lock.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["SimDevice", "SimFault"]

DEVICE_BASE = 1 << 40
HOST_BASE = 1 << 50
GRANULARITY = 2 << 20


class SimFault(AssertionError):
    """Memory touched while not mapped and granted, or an op that can never run."""


@dataclass
class _Stream:
    name: str
    ops: deque[tuple[str, Any]] = field(default_factory=deque[tuple[str, Any]])
    done: int = 0
    """Ops run so far (an event recorded after op n has passed once done >= n)."""
    queued: int = 0


@dataclass
class _Event:
    stream: _Stream | None = None
    at: int = 0


class SimDevice:
    """The driver shell's functions (the names `kern_runtime._driver` exports) over numpy memory."""

    def __init__(self, seed: int, eager: float = 0.5) -> None:
        self._rng = random.Random(seed)
        self._eager = eager
        self._lock = threading.RLock()
        self._next = DEVICE_BASE
        self._handles: list[np.ndarray] = []
        self._mapped: dict[int, tuple[int, int, bool]] = {}
        """Granule address -> (handle, offset in it, granted)."""
        self._host: dict[int, np.ndarray] = {}
        self._next_host = HOST_BASE
        self._streams: list[_Stream] = []

    # ---- memory ------------------------------------------------------------------------------

    def vmm_granularity(self, dev: Any) -> int:
        return GRANULARITY

    def vmm_reserve(self, nbytes: int, align: int) -> int:
        with self._lock:
            base = self._next
            self._next += -(-nbytes // GRANULARITY) * GRANULARITY + GRANULARITY
            return base

    def vmm_free_address(self, base: int, nbytes: int) -> None:
        pass

    def vmm_create(self, nbytes: int, dev: Any) -> int:
        with self._lock:
            assert nbytes % GRANULARITY == 0
            self._handles.append(np.full(nbytes, 0xA5, np.uint8))  # NOTE: never zero: zeroing is the pool's
            return len(self._handles) - 1

    def vmm_release(self, handle: int) -> None:
        pass

    def vmm_map(self, ptr: int, nbytes: int, handle: int) -> None:
        with self._lock:
            assert self._handles[handle].nbytes == nbytes
            for g in range(0, nbytes, GRANULARITY):
                if ptr + g in self._mapped:
                    raise SimFault(f"map over a mapped range at {ptr + g:#x}")
                self._mapped[ptr + g] = (handle, g, False)

    def vmm_unmap(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            for g in range(0, nbytes, GRANULARITY):
                if self._mapped.pop(ptr + g, None) is None:
                    raise SimFault(f"unmap of an unmapped range at {ptr + g:#x}")

    def vmm_set_access(self, ptr: int, nbytes: int, dev: Any) -> None:
        with self._lock:
            for g in range(0, nbytes, GRANULARITY):
                handle, off, _ = self._mapped[ptr + g]
                self._mapped[ptr + g] = (handle, off, True)

    def host_alloc(self, nbytes: int) -> int:
        with self._lock:
            ptr = self._next_host
            self._host[ptr] = np.full(nbytes, 0x5A, np.uint8)
            self._next_host += nbytes + (1 << 30)
            return ptr

    def host_free(self, ptr: int) -> None:
        with self._lock:
            del self._host[ptr]

    def device_pci_bus_id(self, dev: Any) -> str:
        return "ffff:ff:ff.f"  # NOTE: no such sysfs entry: no NUMA preference

    def set_current(self, ctx: Any) -> None:
        pass

    def _pieces(self, ptr: int, nbytes: int) -> Iterator[np.ndarray]:
        """Views of the device bytes [ptr, ptr + nbytes), mapped and granted now."""
        if ptr >= HOST_BASE:
            yield self._host_view(ptr, nbytes)
            return
        end = ptr + nbytes
        while ptr < end:
            granule = ptr - (ptr - DEVICE_BASE) % GRANULARITY
            got = self._mapped.get(granule)
            if got is None or not got[2]:
                raise SimFault(f"device address {ptr:#x} is {'not granted' if got else 'not mapped'}")
            handle, off, _ = got
            at = off + ptr - granule
            n = min(end - ptr, granule + GRANULARITY - ptr)
            yield self._handles[handle][at:at + n]
            ptr += n

    def _host_view(self, ptr: int, nbytes: int) -> np.ndarray:
        for base, block in self._host.items():
            if base <= ptr and ptr + nbytes <= base + block.nbytes:
                return block[ptr - base:ptr - base + nbytes]
        raise SimFault(f"host address {ptr:#x} (+{nbytes}) is outside every pinned block")

    def read(self, ptr: int, nbytes: int) -> np.ndarray:
        """The bytes at `ptr` now (device or pinned host), as a copy."""
        with self._lock:
            return np.concatenate(list(self._pieces(ptr, nbytes))) if nbytes else np.empty(0, np.uint8)

    def write(self, ptr: int, data: np.ndarray) -> None:
        """Writes bytes at `ptr` now."""
        with self._lock:
            at = 0
            for p in self._pieces(ptr, data.nbytes):
                p[:] = data[at:at + p.nbytes]
                at += p.nbytes

    # ---- streams and events ------------------------------------------------------------------

    def stream_create(self) -> _Stream:
        with self._lock:
            s = _Stream(f"stream{len(self._streams)}")
            self._streams.append(s)
            return s

    def stream_destroy(self, stream: _Stream) -> None:
        self.stream_synchronize(stream)

    def event_create(self, timing: bool = True) -> _Event:
        return _Event()

    def event_destroy(self, event: _Event) -> None:
        pass

    def event_record(self, event: _Event, stream: _Stream) -> None:
        with self._lock:
            event.stream, event.at = stream, stream.queued
            self._advance()

    def stream_wait_event(self, stream: _Stream, event: _Event) -> None:
        with self._lock:
            self._enqueue(stream, "wait", (event.stream, event.at))

    def event_query(self, event: _Event) -> bool:
        with self._lock:
            self._advance()
            return self._passed(event.stream, event.at)

    def event_synchronize(self, event: _Event) -> None:
        with self._lock:
            while not self._passed(event.stream, event.at):
                self._step()

    def stream_synchronize(self, stream: _Stream) -> None:
        with self._lock:
            while stream.ops:
                self._step()

    @staticmethod
    def _passed(stream: _Stream | None, at: int) -> bool:
        return stream is None or stream.done >= at

    def _enqueue(self, stream: _Stream, kind: str, op: Any) -> None:
        stream.ops.append((kind, op))
        stream.queued += 1
        self._advance()

    def _runnable(self) -> list[_Stream]:
        return [s for s in self._streams if s.ops and (s.ops[0][0] != "wait" or self._passed(*s.ops[0][1]))]

    def _step(self) -> None:
        ready = self._runnable()
        if not ready:
            raise SimFault("queued ops wait for events that never pass")
        stream = self._rng.choice(ready)
        kind, op = stream.ops.popleft()
        if kind == "run":
            op()
        stream.done += 1

    def _advance(self) -> None:
        """Runs a random number of runnable ops (none about half the time)."""
        while self._rng.random() < self._eager and self._runnable():
            self._step()

    # ---- async work --------------------------------------------------------------------------

    def enqueue(self, stream: _Stream, fn: Callable[[], None]) -> None:
        """Queues `fn` on `stream` (a kernel's work: it runs in stream order)."""
        with self._lock:
            self._enqueue(stream, "run", fn)

    def memset_async(self, ptr: int, nbytes: int, stream: _Stream) -> None:
        self.enqueue(stream, lambda: self.write(ptr, np.zeros(nbytes, np.uint8)))

    def _copy(self, dst: int, src: int, nbytes: int, stream: _Stream) -> None:
        self.enqueue(stream, lambda: self.write(dst, self.read(src, nbytes)))

    copy_dtod_async = _copy
    copy_htod_async = _copy
    copy_dtoh_async = _copy

    def copy_2d_async(self, dst: int, dst_pitch: int, dst_device: bool, src: int, src_pitch: int, src_device: bool,
                      width: int, height: int, stream: _Stream) -> None:
        for ptr, device in ((dst, dst_device), (src, src_device)):
            if (ptr < HOST_BASE) != device:
                raise SimFault(f"{ptr:#x} is {'host' if device else 'device'} memory, named the other")

        def rows() -> None:
            for r in range(height):
                self.write(dst + r * dst_pitch, self.read(src + r * src_pitch, width))

        self.enqueue(stream, rows)
