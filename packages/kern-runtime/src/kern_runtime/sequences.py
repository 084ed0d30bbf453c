"""Sequence memory: kern_pool's decisions executed on VMM arenas.

Every paged and per-seq state is one arena: an address range reserved once (never moved) whose
chunk positions are mapped to physical chunks as kern_pool's `Remap` plans say. Page p of a paged
state lives at `base + p * page_bytes`, slot s of a per-seq state at `base + s * slot_bytes`, so
programs address states by their base and the graphs captured at load stay valid across remaps.
Plans run synchronously here (the stream is drained first); made objects are zeroed before use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import kern_pool
from kern_manifest import Manifest
from kern_pool import Checkpoint, DeviceCopies, Lease, Pool, PoolConfig, Remap

from . import _driver as drv
from .errors import ApiError

__all__ = ["Arena", "Sequences", "pool_layout"]


@dataclass(slots=True)
class Arena:
    """One pooled state's reserved range: base, reserved bytes, object size, mapped positions."""

    name: str
    base: int
    reserved: int
    object_bytes: int
    mapped: set[int] = field(default_factory=set)


def _index_buffers(manifest: Manifest, state: str) -> list[tuple[int, int]]:
    """(stride, last-dim size at the var maxima) of every buffer whose domain indexes `state`."""
    out: list[tuple[int, int]] = []
    env = manifest.var_max
    for b in manifest.buffers.values():
        if b.domain is not None and b.domain.index_into == state:
            out.append((b.domain.stride or 1, b.shape[-1].eval(env) if b.shape else 1))
    return out


def pool_layout(manifest: Manifest) -> tuple[tuple[kern_pool.PagedState, ...], tuple[kern_pool.SeqState, ...], int, int]:
    """(paged states, per-seq states, tokens per page, pages per table row) from the manifest."""
    paged = tuple(kern_pool.PagedState(n, s.bytes_per_token) for n, s in manifest.states.items() if s.bytes_per_token)
    per_seq = tuple(kern_pool.SeqState(n, s.bytes_per_seq) for n, s in manifest.states.items() if s.bytes_per_seq)
    tables = [t for p in paged for t in _index_buffers(manifest, p.name)]
    unit = math.lcm(*[s for s, _ in tables]) if tables else 1
    row = max((w for s, w in tables if s > 1), default=0)
    return paged, per_seq, unit, row


class Sequences:
    """The pool of one runtime: arenas, physical chunks, and the executed plans."""

    def __init__(self, stack: ExitStack, dev: Any, stream: Any, config: PoolConfig) -> None:
        self._stack = stack
        self._dev = dev
        self._stream = stream
        self.config = config
        gran = drv.vmm_granularity(dev)
        if config.chunk % gran:
            raise ApiError(f"pool chunk {config.chunk} is not a multiple of the device granularity {gran}")
        self.pool, plan = Pool.create(config)
        sizes = config.page_bytes + config.slot_bytes
        counts = [config.pages_max] * len(config.paged) + [config.slots_max] * len(config.per_seq)
        self.arenas: dict[str, Arena] = {}
        for name, size, count in zip(config.arenas, sizes, counts, strict=True):
            reserved = max(1, -(-count * size // config.chunk)) * config.chunk
            base = drv.vmm_reserve(reserved, gran)
            stack.callback(drv.vmm_free_address, base, reserved)
            arena = Arena(name, base, reserved, size)
            stack.callback(self._unmap_all, arena)
            self.arenas[name] = arena
        self._handles: list[Any] = []
        for _ in range(config.chunks):
            handle = drv.vmm_create(config.chunk, dev)
            stack.callback(drv.vmm_release, handle)
            self._handles.append(handle)
        self._execute(plan)  # NOTE: the initial plan counts as landed; the pool expects no complete()
        for arena in self.arenas.values():
            for pos in sorted(arena.mapped):
                drv.memset_async(arena.base + pos * config.chunk, config.chunk, stream)

    def _unmap_all(self, arena: Arena) -> None:
        for pos in sorted(arena.mapped):
            drv.vmm_unmap(arena.base + pos * self.config.chunk, self.config.chunk)
        arena.mapped.clear()

    def _execute(self, plan: Remap) -> None:
        chunk = self.config.chunk
        for u in plan.unmaps:
            arena = self.arenas[u.arena]
            drv.vmm_unmap(arena.base + u.pos * chunk, chunk)
            arena.mapped.discard(u.pos)
        for m in plan.maps:
            arena = self.arenas[m.arena]
            drv.vmm_map(arena.base + m.pos * chunk, chunk, self._handles[m.chunk])
            arena.mapped.add(m.pos)
        for g in plan.grants:
            arena = self.arenas[g.arena]
            drv.vmm_set_access(arena.base + g.start * chunk, (g.stop - g.start) * chunk, self._dev)

    @property
    def spans(self) -> Mapping[str, tuple[int, int]]:
        """Each pooled state's (base, reserved bytes): what programs address."""
        return {n: (a.base, a.reserved) for n, a in self.arenas.items()}

    def settle(self) -> None:
        """Lands the pool's pending plan, if any (the stream is drained first); zeroes what it made."""
        plan = self.pool.pending
        if plan is None:
            return
        drv.stream_synchronize(self._stream)
        self._execute(plan)
        for p in plan.made_pages:
            self._zero_page(p)
        for s in plan.made_slots:
            self._zero_slot(s)
        self.pool.complete(plan)

    def _paged(self) -> list[Arena]:
        return [self.arenas[s.name] for s in self.config.paged]

    def _seq(self) -> list[Arena]:
        return [self.arenas[s.name] for s in self.config.per_seq]

    def _zero_page(self, page: int) -> None:
        for a in self._paged():
            drv.memset_async(a.base + page * a.object_bytes, a.object_bytes, self._stream)

    def _zero_slot(self, slot: int) -> None:
        for a in self._seq():
            drv.memset_async(a.base + slot * a.object_bytes, a.object_bytes, self._stream)

    def _retry(self, ask: Any) -> Any:
        try:
            return ask()
        except kern_pool.Remapping:
            self.settle()
            return ask()

    def lease(self, tokens: int) -> Lease:
        """Fresh pages for `tokens` (and a slot), zeroed on the stream before anything reads them."""
        lease: Lease = self._retry(lambda: self.pool.lease(tokens))
        for p in lease.pages:
            self._zero_page(p)
        if lease.state_slot is not None:
            self._zero_slot(lease.state_slot)
        return lease

    def copy(self, copies: DeviceCopies) -> None:
        """Performs a pool decision's page and slot copies on the stream, in order."""
        for src, dst in copies.pages:
            for a in self._paged():
                drv.copy_dtod_async(a.base + dst * a.object_bytes, a.base + src * a.object_bytes, a.object_bytes, self._stream)
        if copies.slot is not None:
            src, dst = copies.slot
            for a in self._seq():
                drv.copy_dtod_async(a.base + dst * a.object_bytes, a.base + src * a.object_bytes, a.object_bytes, self._stream)

    def checkpoint(self, lease: Lease, length: int) -> Checkpoint:
        """Keeps the lease's first `length` tokens (partial page and slot copied on the stream)."""
        cp, copies = self._retry(lambda: self.pool.checkpoint(lease, length))
        self.copy(copies)
        return cp

    def restore(self, checkpoint: Checkpoint, length: int, tokens: int) -> Lease:
        """A new lease from a checkpoint's first `length` tokens, with room for `tokens`."""
        lease, copies = self._retry(lambda: self.pool.restore(checkpoint, length, tokens))
        self._zero_owned(lease)
        self.copy(copies)
        return lease

    def fork(self, parent: Lease, length: int, tokens: int) -> Lease:
        """A new lease sharing the parent's first `length` tokens."""
        lease, copies = self._retry(lambda: self.pool.fork(parent, length, tokens))
        self._zero_owned(lease)
        self.copy(copies)
        return lease

    def _zero_owned(self, lease: Lease) -> None:
        for p in lease.pages[lease.sealed :] if lease.paged else ():
            self._zero_page(p)
