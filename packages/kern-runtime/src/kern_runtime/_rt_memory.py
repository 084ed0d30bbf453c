"""Where a runtime's bytes live: buffers (weights on stacks of their own, so a `Resident` can keep
them), the pinned staging mirrors of inputs and outputs, fixed states, the sequence pool's arenas and
per-op scratch; reading and writing them."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kern_manifest import Buffer

from . import _driver as drv
from . import memory
from ._peering import Peering
from ._rt_core import Device, Spec
from .domains import StateUnits
from .errors import ApiError, ManifestUnsupportedError
from .memory import Allocation
from .sequences import Sequences, pool_config_for, pool_layout

__all__ = ["Memory", "Resident", "Staging", "Weight", "size_text"]


def size_text(n: int) -> str:
    """`n` bytes in the largest binary unit it reaches, one decimal."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


@dataclass(slots=True)
class Staging:
    """A pinned host block and the event of the last copy through it."""

    alloc: Allocation
    event: Any
    pending: bool = False


@dataclass(slots=True)
class Weight:
    """A weight buffer with the stack that releases it."""

    spec: Buffer
    alloc: Allocation
    stack: ExitStack


class Resident:
    """Device weight buffers kept from a closed Runtime, claimable by `Runtime.load(over=...)`."""

    def __init__(self, gpu: int, dev: Any, weights: dict[str, Weight]) -> None:
        self.gpu = gpu
        self._dev = dev
        self._weights = weights
        self._open = True
        drv.primary_context(dev)

    @property
    def names(self) -> list[str]:
        """Names of the weight buffers still held."""
        return sorted(self._weights)

    def claim(self, name: str, spec: Buffer) -> Weight | None:
        """The held buffer `name` if its declaration equals `spec` (else None)."""
        w = self._weights.get(name)
        return w if w is not None and w.spec == spec else None

    def take(self, names: list[str]) -> dict[str, Weight]:
        """Hands the named buffers over (they are no longer released by this Resident)."""
        return {n: self._weights.pop(n) for n in names}

    def close(self) -> None:
        """Releases every buffer not claimed."""
        if not self._open:
            return
        self._open = False
        for w in self._weights.values():
            w.stack.close()
        self._weights.clear()
        drv.release_primary_context(self._dev)


class Memory:
    """Every allocation of one runtime by name, and the checked reads and writes of them."""

    def __init__(self, spec: Spec, device: Device, peering: Peering | None) -> None:
        self.spec = spec
        self.device = device
        self.peering = peering
        self.buffers: dict[str, Allocation] = {}
        self.states: dict[str, Allocation] = {}
        self.notes: dict[str, str] = {}
        self.scratch: dict[str, dict[str, int]] = {}
        self.staging: dict[str, Staging] = {}
        self.weights: dict[str, Weight] = {}
        self.claimed: set[str] = set()
        self.seqs: Sequences | None = None

    # -- allocation -------------------------------------------------------------------------------

    def allocate(self, over: Resident | None) -> None:
        """Buffers (claiming identical weights from `over`), fixed states, scratch."""
        for name, buf in self.spec.manifest.buffers.items():
            if buf.kind == "peer":
                self._add_peer_buffer(name, buf)
            elif buf.kind != "source" and not self._claim(name, buf, over):
                nbytes = self.spec.manifest.buffer_max_bytes(name)
                self.buffers[name] = self._allocate(name, buf, nbytes)
                if buf.kind in ("input", "output"):
                    self._add_staging(name, nbytes)
        self._allocate_fixed_states()
        self._allocate_scratch()

    def _claim(self, name: str, buf: Buffer, over: Resident | None) -> bool:
        if buf.kind != "weight" or buf.placement != "device" or over is None:
            return False
        claimed = over.claim(name, buf)
        if claimed is None:
            return False
        self.buffers[name] = claimed.alloc
        self.claimed.add(name)
        return True

    def _add_peer_buffer(self, name: str, buf: Buffer) -> None:
        of = self.spec.manifest.states.get(buf.of or "")
        if of is not None and of.bytes is None:
            raise ManifestUnsupportedError(
                f"peer buffer {name!r} mirrors pooled state {buf.of!r}: this runtime exports fixed states and "
                "export buffers only")
        alloc = memory.device(self.device.stack, self.spec.manifest.buffer_max_bytes(name))
        self.buffers[name] = alloc
        assert self.peering is not None  # NOTE: the verifier requires a topology group on a peer
        self.peering.add_peer_buffer(name, alloc)

    def _allocate(self, name: str, buf: Buffer, nbytes: int) -> Allocation:
        dev = self.device.dev
        stack = ExitStack() if buf.kind == "weight" else self.device.stack
        if buf.placement == "host":
            alloc = memory.host(stack, nbytes)
        elif buf.export and self.peering is not None and buf.kind != "weight":
            alloc = self.peering.share(name, nbytes, drv.vmm_granularity(dev))
        elif buf.export:
            alloc = memory.vmm(stack, dev, nbytes, drv.vmm_granularity(dev))
        else:
            alloc = memory.device(stack, nbytes)
        if buf.kind == "weight":
            self.weights[name] = Weight(buf, alloc, stack)
        return alloc

    def _add_staging(self, name: str, nbytes: int) -> None:
        stack = self.device.stack
        alloc = memory.host(stack, nbytes)
        event = drv.event_create()
        stack.callback(drv.event_destroy, event)
        self.staging[name] = Staging(alloc, event)

    def _allocate_fixed_states(self) -> None:
        gran = drv.vmm_granularity(self.device.dev)
        for name, st in self.spec.manifest.states.items():
            if st.bytes is None:
                continue
            nbytes, chunk, note = memory.state_size(st, self.spec.tokens or 0, self.spec.capacity.seqs, 1, gran)
            if self.peering is not None and self.peering.kind is not None:
                alloc = self.peering.share(name, nbytes, chunk)
            else:
                alloc = memory.vmm(self.device.stack, self.device.dev, nbytes, chunk)
            drv.memset_async(alloc.ptr, alloc.nbytes, self.device.stream)
            self.states[name] = alloc
            self.notes[name] = note

    def _allocate_scratch(self) -> None:
        env = self.spec.manifest.var_max
        for op_name, op in self.spec.manifest.ops.items():
            table: dict[str, int] = {}
            for sname, sc in op.impl.scratch.items():
                table[sname] = memory.device(self.device.stack, sc.nbytes(env)).ptr
            self.scratch[op_name] = table

    def allocate_pool(self) -> None:
        """The pool of paged and per-seq states, last: `Capacity(tokens=None)` gives it the device
        memory still free once buffers, scratch and fixed states have theirs, less 1 GiB."""
        m, dev = self.spec.manifest, self.device
        paged, per_seq, unit, _ = pool_layout(m)
        free = drv.mem_get_info()[0] if self.spec.tokens is None and (paged or per_seq) else None
        config = pool_config_for(m, self.spec.capacity, free)
        if config is not None:
            slices = {n: s.slices for n, s in m.states.items() if s.slices is not None}
            self.seqs = Sequences(dev.stack, dev.dev, dev.stream, config, dev.ctx, slices)
            for name, (base, reserved) in self.seqs.spans.items():
                self.states[name] = Allocation(base, reserved, "vmm")
            chunk = size_text(config.chunk)
            for p in paged:
                self.notes[p.name] = f"paged, {config.pages_max} pages of {unit} tokens, pool chunk {chunk}"
            for q in per_seq:
                self.notes[q.name] = f"per-seq, {config.first_slots} slots (up to {config.slots_max}), pool chunk {chunk}"
        drv.stream_synchronize(dev.stream)

    def state_units(self) -> dict[str, StateUnits]:
        """What each allocated state holds, in the units an `index_into` domain counts."""
        out: dict[str, StateUnits] = {}
        config = self.seqs.config if self.seqs is not None else None
        for name, st in self.spec.manifest.states.items():
            if st.bytes is not None:
                out[name] = StateUnits(st.bytes, f"{st.bytes} bytes")
            elif config is not None and st.bytes_per_token is not None:
                out[name] = StateUnits(config.pages_max * config.unit,
                                       f"{config.pages_max} pages of {config.unit} tokens")
            elif config is not None and st.bytes_per_seq is not None:
                out[name] = StateUnits(config.slots_max * st.bytes_per_seq,
                                       f"{config.slots_max} slots of {st.bytes_per_seq} bytes")
        return out

    def stage_source(self, name: str) -> tuple[ExitStack, Allocation]:
        """A derive program's source buffer, on a stack of its own (closing it frees the buffer;
        the caller drops the name from `buffers`)."""
        stack = ExitStack()
        alloc = memory.device(stack, self.spec.manifest.buffer_max_bytes(name))
        self.buffers[name] = alloc
        return stack, alloc

    def keep_weights(self) -> dict[str, Weight]:
        """Hands the device weight buffers over (a `Resident` releases them from now on)."""
        kept = {n: w for n, w in self.weights.items() if w.spec.placement == "device"}
        for n in kept:
            del self.weights[n]
        return kept

    def release_weights(self) -> None:
        """Releases every weight buffer still held."""
        for w in self.weights.values():
            w.stack.close()
        self.weights.clear()

    # -- use --------------------------------------------------------------------------------------

    def pool(self) -> Sequences:
        """The sequence pool (ApiError: closed, or no paged or per-seq state)."""
        self.device.live()
        if self.seqs is None:
            raise ApiError("this manifest declares no paged or per-seq state: there is no sequence pool")
        return self.seqs

    def synchronize(self) -> None:
        """Waits for the compute stream and the transfer stream (ApiError: closed)."""
        self.device.live()
        drv.stream_synchronize(self.device.stream)
        if self.seqs is not None:
            self.seqs.synchronize_transfers()

    def read_state(self, name: str, start: int, nbytes: int) -> npt.NDArray[np.uint8]:
        """`nbytes` of state `name` from byte `start`; synchronizes."""
        alloc = self._state(name, start, nbytes)
        out = np.empty(nbytes, dtype=np.uint8)
        self.synchronize()
        drv.copy_dtoh(out.ctypes.data, alloc.ptr + start, nbytes)
        return out

    def write_state(self, name: str, start: int, data: npt.ArrayLike) -> None:
        """Writes bytes into state `name` at byte `start`; synchronizes."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        alloc = self._state(name, start, raw.nbytes)
        self.synchronize()
        drv.copy_htod(alloc.ptr + start, raw.ctypes.data, raw.nbytes)

    def zero_state(self, name: str, start: int, nbytes: int) -> None:
        """Zeroes `nbytes` of state `name` from byte `start` on the device; synchronizes."""
        alloc = self._state(name, start, nbytes)
        self.synchronize()
        if nbytes:
            drv.memset_async(alloc.ptr + start, nbytes, self.device.stream)
        self.synchronize()

    def _state(self, name: str, start: int, nbytes: int) -> Allocation:
        self.device.live()
        alloc = self.states.get(name)
        if alloc is None:
            raise ApiError(f"unknown state {name!r}; states: {sorted(self.states)}")
        if start < 0 or nbytes < 0 or start + nbytes > alloc.nbytes:
            raise ApiError(f"state {name!r} range [{start}, {start + nbytes}) is outside its {alloc.nbytes} bytes")
        return alloc

    def buffer(self, name: str) -> Allocation:
        """Buffer `name`'s memory (ApiError: closed, or none now)."""
        self.device.live()
        if name not in self.buffers:
            raise ApiError(f"buffer {name!r} has no memory now; buffers: {sorted(self.buffers)}")
        return self.buffers[name]

    def read_buffer(self, name: str) -> npt.NDArray[np.uint8]:
        """Every byte of buffer `name`; synchronizes."""
        alloc = self.buffer(name)
        out = np.empty(alloc.nbytes, dtype=np.uint8)
        self.synchronize()
        if alloc.where == "host":
            out[:] = np.frombuffer(drv.host_view(alloc.ptr, alloc.nbytes), dtype=np.uint8)
        else:
            drv.copy_dtoh(out.ctypes.data, alloc.ptr, alloc.nbytes)
        return out

    def own_address(self, name: str) -> int:
        """The address of this rank's buffer or state `name` (what a peer buffer points at)."""
        alloc = self.buffers.get(name) or self.states.get(name)
        if alloc is None:
            raise ApiError(f"{name!r} has no memory in this runtime")
        return alloc.ptr
