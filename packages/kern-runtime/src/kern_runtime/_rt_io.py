"""A runtime's input and output copies: checked prefix writes of inputs through their pinned
staging mirrors, reads of outputs, and output copies in flight (`Fetch`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kern_manifest import Buffer, Manifest

from . import _driver as drv
from . import memory
from ._rt_core import Device
from ._rt_memory import Memory, Staging
from .domains import InputDomain, check_domain
from .errors import ApiError
from .memory import Allocation

__all__ = ["Fetch", "Io"]

_NP_DTYPES: Mapping[str, Any] = {
    "bf16": np.uint16, "f16": np.float16, "f32": np.float32, "fp8e4m3": np.uint8, "fp8e8m0": np.uint8,
    "i8": np.int8, "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "u8": np.uint8,
}  # fmt: skip


@dataclass(eq=False, slots=True)
class Fetch:
    """An output copy in flight (`Runtime.fetch_output`): read it with `Runtime.fetched`."""

    name: str
    count: int
    dtype: np.dtype[Any]
    _slot: Staging
    _read: bool = False


class Io:
    """The copies into a runtime's inputs and out of its outputs, ordered on its stream."""

    def __init__(self, manifest: Manifest, device: Device, memory: Memory,
                 domains: Mapping[str, InputDomain]) -> None:
        self._manifest = manifest
        self._device = device
        self._memory = memory
        self._domains = domains
        self._fetch_free: dict[str, list[Staging]] = {}

    def _io(self, name: str, kind: str) -> tuple[Buffer, Allocation, Staging]:
        self._device.live()
        buf = self._manifest.buffers.get(name)
        if buf is None:
            raise ApiError(f"unknown buffer {name!r}; {kind} buffers: {self._names(kind)}")
        if buf.kind != kind:
            raise ApiError(f"buffer {name!r} is a {buf.kind} buffer, not an {kind}; {kind}s: {self._names(kind)}")
        return buf, self._memory.buffers[name], self._memory.staging[name]

    def _names(self, kind: str) -> list[str]:
        return sorted(n for n, b in self._manifest.buffers.items() if b.kind == kind)

    def _count(self, name: str, buf: Buffer, alloc: Allocation, count: int | None) -> tuple[np.dtype[Any], int]:
        dt = np.dtype(_NP_DTYPES[buf.dtype])
        cap = alloc.nbytes // dt.itemsize
        n = cap if count is None else count
        if not 0 <= n <= cap:
            raise ApiError(f"output {name!r} holds {cap} elements, asked for {count}")
        return dt, n

    def write_input(self, name: str, array: npt.ArrayLike) -> None:
        """See `Runtime.write_input`."""
        buf, alloc, stage = self._io(name, "input")
        arr = np.ascontiguousarray(array)
        want = np.dtype(_NP_DTYPES[buf.dtype])
        if arr.dtype != want:
            raise ApiError(f"input {name!r} is {buf.dtype}: pass a numpy {want} array, not {arr.dtype}")
        if arr.nbytes > alloc.nbytes:
            raise ApiError(f"input {name!r} holds {alloc.nbytes // want.itemsize} elements, got {arr.size}")
        dom = self._domains.get(name)
        if dom is not None:
            check_domain(name, dom, arr)
        stream = self._device.stream
        if stage.pending:
            drv.event_synchronize(stage.event)
        drv.host_view(stage.alloc.ptr, arr.nbytes)[:] = arr.reshape(-1).view(np.uint8).data
        drv.copy_htod_async(alloc.ptr, stage.alloc.ptr, arr.nbytes, stream)
        drv.event_record(stage.event, stream)
        stage.pending = True

    def read_output(self, name: str, count: int | None) -> npt.NDArray[Any]:
        """See `Runtime.read_output`."""
        buf, alloc, stage = self._io(name, "output")
        dt, n = self._count(name, buf, alloc, count)
        nbytes = n * dt.itemsize
        drv.copy_dtoh_async(stage.alloc.ptr, alloc.ptr, nbytes, self._device.stream)
        drv.stream_synchronize(self._device.stream)
        return np.frombuffer(drv.host_view(stage.alloc.ptr, nbytes), dtype=dt).copy()

    def fetch_output(self, name: str, count: int | None) -> Fetch:
        """See `Runtime.fetch_output`."""
        buf, alloc, _stage = self._io(name, "output")
        dt, n = self._count(name, buf, alloc, count)
        free = self._fetch_free.setdefault(name, [])
        slot = free.pop() if free else self._slot(alloc.nbytes)
        drv.copy_dtoh_async(slot.alloc.ptr, alloc.ptr, n * dt.itemsize, self._device.stream)
        drv.event_record(slot.event, self._device.stream)
        return Fetch(name, n, dt, slot)

    def _slot(self, nbytes: int) -> Staging:
        stack = self._device.stack
        event = drv.event_create(timing=False)
        stack.callback(drv.event_destroy, event)
        return Staging(memory.host(stack, nbytes), event)

    def fetched(self, fetch: Fetch) -> npt.NDArray[Any]:
        """See `Runtime.fetched`."""
        self._device.live()
        if fetch._read:  # pyright: ignore[reportPrivateUsage]
            raise ApiError(f"this fetch of {fetch.name!r} was read already")
        slot = fetch._slot  # pyright: ignore[reportPrivateUsage]
        drv.event_synchronize(slot.event)
        nbytes = fetch.count * fetch.dtype.itemsize
        out = np.frombuffer(drv.host_view(slot.alloc.ptr, nbytes), dtype=fetch.dtype).copy()
        fetch._read = True  # pyright: ignore[reportPrivateUsage]
        self._fetch_free[fetch.name].append(slot)
        return out
