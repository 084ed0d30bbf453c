"""The memory fuzz: a seeded random sequence of sequence-memory operations (leases written token by
token, checkpoint, retire, restore and lease_from at whole pages, fork inside a page, park through
a room on the transfer stream and on the compute stream, wake as a checkpoint and staged into a
lease, settle, leases under pressure until the pool remaps or is busy, release) on anything with
`kern_runtime.Runtime`'s memory methods: the runtime on a GPU, or `SimRuntime` (the real
`Sequences` on `simdevice.SimDevice`) on the CPU.

Every token a lease writes is stamped in every paged state: a page is laid out [layer][token][cell]
(as the manifests' `slices` cut it), each cell u32 words (writer, position, state x 256 + layer,
a word mixing all three with its index). A per-seq state's slot is stamped (version, state, ...)
each time its lease writes. A host-side shadow keeps each live object's writers per position and
slot version; after every operation the device arenas are read whole and every live lease and
checkpoint must hold exactly its stamps (positions below its length, and zeros in the pages past
what its lease wrote). At the end everything is released and pages, slots and host units are 0.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Generator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kern_pool
from kern_manifest import parse_manifest
from kern_manifest.verify import load_manifest
from kern_runtime import _hosttier, memory, sequences  # pyright: ignore[reportPrivateUsage]
from kern_runtime.sequences import Sequences, pool_layout

from .simdevice import SimDevice

__all__ = ["Layout", "MemoryFuzz", "SimRuntime", "layout_of", "sim_runtime"]

MAGIC = np.uint32(0x9E3779B1)


@dataclass(frozen=True)
class Layout:
    """What the stamps need of a manifest's pooled states."""

    unit: int
    paged: tuple[tuple[str, int, int], ...]
    """(name, bytes per token, layers: the page's slices)."""
    per_seq: tuple[tuple[str, int], ...]
    """(name, bytes per slot)."""


def layout_of(doc: Mapping[str, Any]) -> Layout:
    m = parse_manifest(json.dumps(doc))
    paged, per_seq, unit, _ = pool_layout(m)
    return Layout(unit, tuple((p.name, p.bytes_per_token, m.states[p.name].slices or 1) for p in paged),
                  tuple((s.name, s.bytes_per_seq) for s in per_seq))


# --------------------------------------------------------------------------------------------
# The CPU target: the real Sequences on a simulated device.


class SimRuntime:
    """`Runtime`'s memory methods over `Sequences` on a `SimDevice` (no kernels, no weights)."""

    def __init__(self, dev: SimDevice, doc: Mapping[str, Any], capacity: kern_pool.Capacity) -> None:
        m = load_manifest(json.dumps(doc))  # NOTE: verified, as Runtime.load does
        paged, per_seq, unit, row = pool_layout(m)
        config = kern_pool.pool_config(paged, per_seq, unit=unit, row_pages=row or 1 << 20, capacity=capacity)
        self.dev = dev
        self._stack = ExitStack()
        self._stream = dev.stream_create()
        slices = {n: s.slices for n, s in m.states.items() if s.slices is not None}
        self._seqs = Sequences(self._stack, "dev", self._stream, config, None, slices)

    pool = property(lambda self: self._seqs.pool)
    host = property(lambda self: self._seqs.host)

    def reserve_host(self, pages: int, slots: int) -> kern_pool.Host:
        return self._seqs.reserve_host(pages, slots)

    def lease(self, tokens: int, *, wait: bool = True) -> kern_pool.Lease:
        return self._seqs.lease(tokens, wait)

    def retire(self, lease: kern_pool.Lease, length: int) -> kern_pool.Checkpoint:
        return self._seqs.retire(lease, length)

    def checkpoint(self, lease: kern_pool.Lease, length: int) -> kern_pool.Checkpoint:
        return self._seqs.checkpoint(lease, length)

    def restore(self, cp: kern_pool.Checkpoint, length: int, tokens: int) -> kern_pool.Lease:
        return self._seqs.restore(cp, length, tokens)

    def fork(self, parent: kern_pool.Lease, length: int, tokens: int) -> kern_pool.Lease:
        return self._seqs.fork(parent, length, tokens)

    def settle(self) -> None:
        self._seqs.settle()

    def room(self, cp: kern_pool.Checkpoint) -> kern_pool.Room | kern_pool.Checkpoint:
        return self._seqs.room(cp)

    def park(self, what: kern_pool.Checkpoint | kern_pool.Room) -> kern_pool.Parked:
        if isinstance(what, kern_pool.Room):
            return self._seqs.park_room(what)
        return self._seqs.park(what)

    def park_now(self, cp: kern_pool.Checkpoint) -> kern_pool.Parked:
        return self._seqs.park_now(cp)

    def wake(self, parked: kern_pool.Parked, length: int) -> kern_pool.Checkpoint:
        return self._seqs.wake(parked, length)

    def wake_now(self, parked: kern_pool.Parked, length: int, tokens: int) -> kern_pool.Lease:
        return self._seqs.wake_now(parked, length, tokens)

    def synchronize(self) -> None:
        self.dev.stream_synchronize(self._stream)
        self._seqs.synchronize_transfers()

    def read_state(self, name: str, start: int, nbytes: int) -> np.ndarray:
        self.synchronize()
        return self.dev.read(self._seqs.arenas[name].base + start, nbytes)

    def write_state(self, name: str, start: int, data: np.ndarray) -> None:
        """Queues the write on the compute stream, as a kernel writing the state would (the
        runtime's own write_state synchronizes first: this is the harder test)."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8).copy()
        arena = self._seqs.arenas[name]
        at = arena.base + start
        # NOTE: as an eager call does: wait for a staged wake's slice that the bytes land in
        self._seqs.await_slices(self._seqs.touched(name, start % arena.object_bytes))
        self.dev.enqueue(self._stream, lambda: self.dev.write(at, raw))

    def close(self) -> None:
        self.synchronize()
        self._stack.close()


@contextmanager
def sim_runtime(doc: Mapping[str, Any], capacity: kern_pool.Capacity, seed: int) -> Generator[SimRuntime]:
    """A SimRuntime whose Sequences (and pinned host block) run on a fresh SimDevice."""
    dev = SimDevice(seed, eager=0.2)
    modules = (sequences, _hosttier, memory)
    saved = [m.drv for m in modules]
    for m in modules:
        m.drv = dev  # type: ignore[assignment]
    try:
        rt = SimRuntime(dev, doc, capacity)
        try:
            yield rt
        finally:
            rt.close()
    finally:
        for m, drv in zip(modules, saved, strict=True):
            m.drv = drv


# --------------------------------------------------------------------------------------------
# The shadow and the operations.


@dataclass
class _Obj:
    """A live lease or checkpoint (or parked copy) and what it must hold."""

    handle: Any
    writers: list[int]
    """Writer id of each position below the object's length."""
    slot: int
    """The slot's stamp version (0: zeroed, never written)."""
    kind: str
    zero_from: int = 1 << 62
    """A lease: positions from this one on were never written nor copied (they read as zeros)."""
    want: dict[int, np.ndarray] = field(default_factory=dict[int, np.ndarray])
    """Paged state index -> the stamps of `writers` (made once per length)."""


@dataclass
class Stats:
    ops: dict[str, int] = field(default_factory=dict[str, int])

    def count(self, name: str) -> None:
        self.ops[name] = self.ops.get(name, 0) + 1


class MemoryFuzz:
    """`ops` random operations on `rt` (a Runtime or SimRuntime with a reserved host tier)."""

    def __init__(self, rt: Any, layout: Layout, seed: int, *, max_tokens: int = 200, max_live: int = 16) -> None:
        self.rt = rt
        self.max_live = max_live
        self.lay = layout
        self.rng = random.Random(seed)
        self.max_tokens = max_tokens
        self.leases: list[_Obj] = []
        self.cps: list[_Obj] = []
        self.parked: list[_Obj] = []
        self.stats = Stats()
        self._writer = 0
        self.stateful = bool(layout.per_seq)

    # ---- stamps ------------------------------------------------------------------------------

    def _cells(self, writers: np.ndarray, pos: np.ndarray, state: int, layers: int, words: int) -> np.ndarray:
        """[n, layers, words] u32 stamps of positions `pos` written by `writers`."""
        n = len(pos)
        out = np.empty((n, layers, words), np.uint32)
        layer = np.arange(layers, dtype=np.uint32)[None, :]
        out[:, :, 0] = writers[:, None]
        out[:, :, 1] = pos[:, None]
        out[:, :, 2] = state * 256 + layer
        mix = (writers.astype(np.uint32)[:, None] * MAGIC) ^ (pos.astype(np.uint32)[:, None] << 8) ^ (layer << 2)
        out[:, :, 3:] = mix[:, :, None] + np.arange(3, words, dtype=np.uint32)[None, None, :] * np.uint32(2654435761)
        return out

    def _slot_stamp(self, version: int, state: int, nbytes: int) -> np.ndarray:
        words = np.arange(nbytes // 4, dtype=np.uint32) * np.uint32(40503) + np.uint32((version * int(MAGIC)) & 0xFFFFFFFF)
        words[0], words[1] = version, state
        return words

    def _write(self, obj: _Obj, upto: int) -> None:
        """Writes positions [len(obj.writers), upto) of a lease as a new writer, and its slot."""
        lease = obj.handle
        start = len(obj.writers)
        if upto <= start:
            return
        self._writer += 1
        w = self._writer
        lease.kv_index(upto - 1)
        unit = self.lay.unit
        t = start
        while t < upto:
            end = min(upto, (t // unit + 1) * unit)
            self._stamp_page(lease.pages[t // unit], t, end, w)
            t = end
        obj.writers.extend([w] * (upto - start))
        obj.zero_from = max(obj.zero_from, upto)
        if self.lay.per_seq and lease.state_slot is not None:
            obj.slot = w
            for si, (name, nbytes) in enumerate(self.lay.per_seq):
                self.rt.write_state(name, lease.state_slot * nbytes, self._slot_stamp(w, si, nbytes))

    def _stamp_page(self, page: int, t: int, end: int, w: int) -> None:
        """Positions [t, end) of one page stamped by writer `w` in every paged state, a write per
        layer (a page is [layer][token][cell])."""
        unit = self.lay.unit
        pos = np.arange(t, end, dtype=np.uint32)
        for si, (name, bpt, layers) in enumerate(self.lay.paged):
            cell = bpt // layers
            cells = self._cells(np.full(len(pos), w, np.uint32), pos, si, layers, cell // 4)
            for layer in range(layers):
                at = page * bpt * unit + layer * unit * cell + (t % unit) * cell
                self.rt.write_state(name, at, cells[:, layer, :])

    # ---- the check ---------------------------------------------------------------------------

    def _arena(self, name: str, page_bytes: int, pages: set[int]) -> dict[int, np.ndarray]:
        """The bytes of `pages` of a paged state, read a run of consecutive pages at a time (only
        pages that live objects hold are sure to be mapped)."""
        out: dict[int, np.ndarray] = {}
        for run in kern_pool.fold(((p, p) for p in sorted(pages)), 1, 1):
            raw = self.rt.read_state(name, run.src * page_bytes, run.count * page_bytes)
            for i in range(run.count):
                out[run.src + i] = raw[i * page_bytes:(i + 1) * page_bytes]
        return out

    def check(self) -> None:
        """Every live lease and checkpoint holds its stamps; a lease's unwritten pages are zero."""
        unit = self.lay.unit
        live = [*self.leases, *self.cps]
        held = {p for o in live for p in o.handle.pages}
        for si, (name, bpt, layers) in enumerate(self.lay.paged):
            words = bpt // layers // 4
            pages = self._arena(name, bpt * unit, held)
            for o in live:
                self._check_pages(o, name, si, layers, words, pages)
        for si, (name, nbytes) in enumerate(self.lay.per_seq):
            for o in live:
                slot = o.handle.state_slot
                if slot is None:
                    continue
                got = self.rt.read_state(name, slot * nbytes, nbytes).view(np.uint32)
                want = self._slot_stamp(o.slot, si, nbytes) if o.slot else np.zeros(nbytes // 4, np.uint32)
                assert np.array_equal(got, want), f"{o.kind} {name} slot {slot}: version {got[0]}, want {o.slot}"

    def _check_pages(self, o: _Obj, name: str, si: int, layers: int, words: int, pages: dict[int, np.ndarray]) -> None:
        unit = self.lay.unit
        ids = o.handle.pages
        n = len(o.writers)
        stack = np.stack([pages[p].view(np.uint32).reshape(layers, unit, words) for p in ids])
        if n:
            pos = np.arange(n)
            got = stack[pos // unit, :, pos % unit, :]
            want = o.want.get(si)
            if want is None or len(want) != n:
                want = o.want[si] = self._cells(np.asarray(o.writers, np.uint32), pos.astype(np.uint32), si, layers,
                                                words)
            if not np.array_equal(got, want):
                bad = int(np.nonzero((got != want).any(axis=(1, 2)))[0][0])
                raise AssertionError(f"{o.kind} {name}: position {bad} (page {ids[bad // unit]}) holds writer "
                                     f"{got[bad, 0, 0]} position {got[bad, 0, 1]}, want writer {o.writers[bad]}; "
                                     f"ops so far {self.stats.ops}")
        if o.kind == "lease" and o.zero_from < len(ids) * unit:
            z = np.arange(o.zero_from, len(ids) * unit)
            tail = stack[z // unit, :, z % unit, :]
            if tail.any():
                bad = int(z[np.nonzero(tail.any(axis=(1, 2)))[0][0]])
                raise AssertionError(f"lease {name}: position {bad} (page {ids[bad // unit]}), never written, is not "
                                     f"zero ({self.stats.ops})")

    # ---- operations --------------------------------------------------------------------------

    def _tokens(self, at_least: int) -> int:
        return self.rng.randint(max(at_least, 1), max(at_least, 1) + self.max_tokens // 2)

    def _pick(self, objs: list[_Obj]) -> _Obj | None:
        return self.rng.choice(objs) if objs else None

    def _retry(self, ask: Callable[[], Any], keep: _Obj | None = None) -> Any:
        """`ask` until the pool grants it: Busy releases a random lease or checkpoint, HostFull a
        random parked copy (the fuzz's eviction; never `keep`); None when none is left."""
        while True:
            try:
                return ask()
            except kern_pool.Busy:
                if not self._release_any((self.leases, self.cps), keep):
                    return None
            except kern_pool.HostFull:
                if not self._release_any((self.parked,), keep):
                    return None

    def _release_any(self, pools: tuple[list[_Obj], ...], keep: _Obj | None) -> bool:
        choices = [(objs, i) for objs in pools for i, o in enumerate(objs) if o is not keep]
        if not choices:
            return False
        objs, i = self.rng.choice(choices)
        self._drop(objs, i)
        return True

    def _drop(self, objs: list[_Obj], i: int) -> None:
        objs.pop(i).handle.release()
        self.stats.count("release")

    def op_lease(self) -> None:
        tokens = self._tokens(1)
        lease = self._retry(lambda: self.rt.lease(tokens))
        if lease is None:
            return
        obj = _Obj(lease, [], 0, "lease", 0)
        self.leases.append(obj)
        self._write(obj, self.rng.randint(1, tokens))
        self.stats.count("lease")

    def op_write(self) -> None:
        obj = self._pick(self.leases)
        if obj is not None and len(obj.writers) < obj.handle.tokens:
            self._write(obj, self.rng.randint(len(obj.writers) + 1, obj.handle.tokens))
            self.stats.count("write")

    def _length(self, obj: _Obj) -> int | None:
        n = len(obj.writers)
        if n == 0:
            return None
        return n if self.stateful or self.rng.random() < 0.5 else self.rng.randint(1, n)

    def op_checkpoint(self, retire: bool) -> None:
        if not self.leases:
            return
        i = self.rng.randrange(len(self.leases))
        obj = self.leases[i]
        length = self._length(obj)
        if length is None:
            return
        if retire:
            self.leases.pop(i)
            cp = self.rt.retire(obj.handle, length)
        else:
            cp = self._retry(lambda: self.rt.checkpoint(obj.handle, length), keep=obj)
            if cp is None:
                return
        self.cps.append(_Obj(cp, obj.writers[:length], obj.slot, "checkpoint"))
        self.stats.count("retire" if retire else "checkpoint")

    def _start_length(self, src: _Obj, fork: bool) -> int:
        """A length to start from: the source's own, else (stateless) one inside it, at whole
        pages for a checkpoint (lease_from), anywhere for a fork."""
        n = len(src.writers)
        if self.stateful or self.rng.random() < 0.5:
            return n
        if fork:
            return self.rng.randint(1, n)
        whole = n // self.lay.unit
        return self.rng.randint(1, whole) * self.lay.unit if whole else n

    def _adopt(self, lease: Any, src: _Obj, length: int) -> None:
        obj = _Obj(lease, src.writers[:length], src.slot, "lease", -(-length // self.lay.unit) * self.lay.unit)
        self.leases.append(obj)
        if self.rng.random() < 0.7 and length < lease.tokens:
            self._write(obj, self.rng.randint(length + 1, lease.tokens))

    def op_restore(self) -> None:
        self._start_from(self.cps, fork=False)

    def op_fork(self) -> None:
        self._start_from(self.leases, fork=True)

    def _start_from(self, sources: list[_Obj], fork: bool) -> None:
        """A new lease from a random checkpoint (restore, lease_from) or live lease (fork)."""
        src = self._pick(sources)
        if src is None or not src.writers:
            return
        length = self._start_length(src, fork)
        tokens = self._tokens(length + 1)
        start = self.rt.fork if fork else self.rt.restore
        lease = self._retry(lambda: start(src.handle, length, tokens), keep=src)
        if lease is None:
            return
        self._adopt(lease, src, length)
        if fork:
            self.stats.count("fork" if length % self.lay.unit == 0 else "fork-in-page")
        else:
            self.stats.count("restore" if length == len(src.writers) else "lease_from")

    def op_park(self) -> None:
        if not self.cps:
            return
        i = self.rng.randrange(len(self.cps))
        src = self.cps[i]
        how = self.rng.choice(("room", "compute", "now"))
        if how == "room":
            room = self.rt.room(src.handle)
            if not isinstance(room, kern_pool.Room):
                return
            self.cps.pop(i)
            parked = self.rt.park(room)  # NOTE: the room's checkpoint goes once the copies landed
        else:
            parked = self._retry(lambda: self.rt.park(src.handle) if how == "compute" else self.rt.park_now(src.handle),
                                 keep=src)
            if parked is None:
                return
            if how == "now":
                self.cps.remove(src)
        self.parked.append(_Obj(parked, list(src.writers), src.slot, "parked"))
        self.stats.count(f"park-{how}")

    def op_wake(self) -> None:
        src = self._pick(self.parked)
        if src is None:
            return
        length = self._start_length(src, fork=False)
        if self.rng.random() < 0.5:
            cp = self._retry(lambda: self.rt.wake(src.handle, length), keep=src)
            if cp is not None:
                self.cps.append(_Obj(cp, src.writers[:length], src.slot, "checkpoint"))
                self.stats.count("wake")
            return
        tokens = self._tokens(length + 1)
        lease = self._retry(lambda: self.rt.wake_now(src.handle, length, tokens), keep=src)
        if lease is not None:
            self._adopt(lease, src, length)
            self.stats.count("wake_now")

    def op_pressure(self) -> None:
        """Leases until the pool is busy (remaps settle on the way), then releases half of them."""
        taken = []
        for _ in range(64):
            try:
                taken.append(self.rt.lease(self._tokens(self.lay.unit)))
            except kern_pool.Busy:
                break
        self.stats.count("pressure")
        for lease in taken:
            obj = _Obj(lease, [], 0, "lease", 0)
            if self.rng.random() < 0.5:
                lease.release()
            else:
                self.leases.append(obj)
                self._write(obj, self.rng.randint(1, min(lease.tokens, self.lay.unit * 2)))

    def op_release(self) -> None:
        pools = [p for p in (self.leases, self.cps, self.parked) if p]
        if pools:
            objs = self.rng.choice(pools)
            self._drop(objs, self.rng.randrange(len(objs)))

    OPS: tuple[tuple[str, int], ...] = (
        ("lease", 6), ("write", 6), ("checkpoint", 6), ("retire", 3), ("restore", 5), ("fork", 4),
        ("park", 8), ("wake", 8), ("settle", 1), ("pressure", 1), ("release", 3),
    )

    def step(self) -> str:
        names, weights = zip(*self.OPS, strict=True)
        name = self.rng.choices(names, weights)[0]
        while len(self.leases) + len(self.cps) + len(self.parked) > self.max_live:
            self.op_release()
        if name in ("checkpoint", "retire"):
            self.op_checkpoint(retire=name == "retire")
        elif name == "settle":
            self.rt.settle()
            self.stats.count(name)
        else:
            getattr(self, f"op_{name}")()
        return name

    def run(self, ops: int, check_rate: float = 1.0) -> Stats:
        """`ops` operations, each followed by the check at `check_rate` (seeded): between checks
        the runtime's copies stay queued, as a serving loop leaves them."""
        for _ in range(ops):
            self.step()
            if self.rng.random() < check_rate:
                self.check()
        self.check()
        self.finish()
        return self.stats

    def finish(self) -> None:
        """Releases everything; pages, slots and host units must all come back."""
        for objs in (self.leases, self.cps, self.parked):
            while objs:
                self._drop(objs, len(objs) - 1)
        self.rt.synchronize()
        counts = (self.rt.pool.pages_used, self.rt.pool.slots_used, self.rt.host.used)
        assert counts == (0, 0, 0), f"(pages, slots, host units) still used after releasing everything: {counts}"
