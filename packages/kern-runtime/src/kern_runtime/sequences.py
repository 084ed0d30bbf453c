"""Sequence memory: kern_pool's decisions executed on VMM arenas.

Every paged and per-seq state is one arena: an address range reserved once (never moved) whose
chunk positions are mapped to physical chunks as kern_pool's `Remap` plans say. Page p of a paged
state lives at `base + p * page_bytes`, slot s of a per-seq state at `base + s * slot_bytes`, so
programs address states by their base and the graphs captured at load stay valid across remaps.
Plans run synchronously here (the stream is drained first); made objects are zeroed before use.

The host tier (optional, `enable_host`) is one pinned host block under kern_pool's `Host`: a host
unit is the gcd of one page of every paged state end to end and one slot of every per-seq state;
a parked page is its paged states' pages side by side in `page_units` units, a parked slot its
per-seq states' slots side by side. Park and wake are copies on the stream, ordered with every
kernel and memset that touches the same pages.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
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
        self._host: kern_pool.Host | None = None
        self._host_base = 0
        self._host_unit = 0
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

    def lease_slot(self) -> Lease:
        """A slot-only lease (a peer rank's share of a row): one fresh slot, zeroed on the stream."""
        lease: Lease = self._retry(self.pool.lease_slot)
        if lease.state_slot is not None:
            self._zero_slot(lease.state_slot)
        return lease

    def retire(self, lease: Lease, length: int) -> Checkpoint:
        """Ends the lease and keeps its first `length` tokens in place: no copy, no device work
        (the partial page and the slot change owner; pages past `length` go back to the pool)."""
        return self.pool.retire(lease, length)

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

    # ---- host tier -------------------------------------------------------------------------

    def enable_host(self, nbytes: int) -> kern_pool.Host:
        """Allocates a pinned host block of the largest whole number of units within `nbytes` and
        puts kern_pool's host tier over it (once per runtime).

        Raises:
            ApiError: already enabled, or `nbytes` holds no page or slot.
        """
        if self._host is not None:
            raise ApiError(f"the host tier is already enabled ({self._host.units} units of {self._host_unit} bytes)")
        page = sum(self.config.page_bytes)
        slot = sum(self.config.slot_bytes)
        unit = math.gcd(page, slot)
        need = min(b for b in (page, slot) if b)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < need:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ApiError(f"a host tier of {nbytes!r} bytes holds no page or slot: give at least {need} bytes")
        units = nbytes // unit
        base = drv.host_alloc(units * unit)
        self._stack.callback(drv.host_free, base)
        self._host = kern_pool.Host(self.pool, units, page_units=max(page // unit, 1), slot_units=max(slot // unit, 1))
        self._host_base, self._host_unit = base, unit
        return self._host

    @property
    def host(self) -> kern_pool.Host:
        """The host tier's planner (for schedulers that read its counts).

        Raises:
            ApiError: the host tier is not enabled.
        """
        if self._host is None:
            raise ApiError("no host tier: enable it first (Runtime.enable_host_tier)")
        return self._host

    def _host_copies(self, pairs: Iterable[tuple[int, int]], arenas: list[Arena], to_host: bool) -> None:
        """(device object, host unit) pairs: each arena's object, side by side in the unit, copied
        device-to-host (`to_host`) or back, on the stream."""
        for obj, unit in pairs:
            at = self._host_base + unit * self._host_unit
            for a in arenas:
                dev = a.base + obj * a.object_bytes
                if to_host:
                    drv.copy_dtoh_async(at, dev, a.object_bytes, self._stream)
                else:
                    drv.copy_htod_async(dev, at, a.object_bytes, self._stream)
                at += a.object_bytes

    def park(self, checkpoint: Checkpoint) -> kern_pool.Parked:
        """Copies a checkpoint to the host tier (pages an earlier park of the chain left there are
        not copied again); the checkpoint stays valid. Device-to-host copies on the stream.

        Raises:
            ApiError: no host tier, or a released / foreign checkpoint. kern_pool.HostFull: the host
                block cannot hold it; nothing was kept.
        """
        parked, copies = self.host.park(checkpoint)
        self._host_copies(copies.pages, self._paged(), to_host=True)
        self._host_copies([copies.slot] if copies.slot is not None else [], self._seq(), to_host=True)
        return parked

    def wake(self, parked: kern_pool.Parked, length: int) -> Checkpoint:
        """A device checkpoint of a parked copy's first `length` tokens: fresh pages and slot,
        filled by host-to-device copies on the stream.

        Raises:
            ApiError: no host tier, a released / foreign Parked, or a bad length. kern_pool.Denied:
                the pool cannot give the pages or slot now.
        """
        host = self.host
        checkpoint, copies = self._retry(lambda: host.wake(parked, length))
        self._host_copies([(page, unit) for unit, page in copies.pages], self._paged(), to_host=False)
        slot = [(copies.slot[1], copies.slot[0])] if copies.slot is not None else []
        self._host_copies(slot, self._seq(), to_host=False)
        return checkpoint

    def _zero_owned(self, lease: Lease) -> None:
        for p in lease.pages[lease.sealed :] if lease.paged else ():
            self._zero_page(p)
