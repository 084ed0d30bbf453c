"""Launch records: a launch's arguments staged once as little-endian u64 slots.

Each kernel param gets its own 8-byte-aligned slot (a `bytes<n>` pack takes ceil(n/8) slots) in
one buffer, and a pointer array addresses every slot: cuLaunchKernel reads the arguments from
there, so a replay passes one integer and converts nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import ManifestUnsupportedError

__all__ = ["ArgBlock", "KernelRecord", "encode_value", "pack_bytes"]

_FORMATS = {"i32": "<i", "i64": "<q", "f32": "<f", "u8": "<B", "ptr": "<Q"}


def encode_value(kind: str, value: int | float, where: str = "") -> bytes:
    """Little-endian bytes of one scalar or pointer (`kind`: i32, i64, f32, u8 or ptr)."""
    fmt = _FORMATS[kind]
    try:
        if kind == "f32":
            return struct.pack(fmt, float(value))
        if isinstance(value, float):
            raise ManifestUnsupportedError(f"{where}: {kind} arg got the float {value}")
        return struct.pack(fmt, value)
    except struct.error:
        raise ManifestUnsupportedError(f"{where}: value {value} does not fit {kind}") from None


def pack_bytes(size: int, fields: Sequence[tuple[int, bytes]], where: str = "") -> bytes:
    """A `bytes<size>` image: each (offset, bytes) field written in place, the rest zero."""
    out = bytearray(size)
    for at, raw in fields:
        if at < 0 or at + len(raw) > size:
            raise ManifestUnsupportedError(f"{where}: pack field at {at} of {len(raw)} bytes overruns {size} bytes")
        out[at : at + len(raw)] = raw
    return bytes(out)


class ArgBlock:
    """Kernel arguments staged once: slot bytes and the void* array that points at each slot."""

    __slots__ = ("data", "nbytes", "ptrs")

    def __init__(self, values: Sequence[bytes]) -> None:
        sizes = [-(-max(len(v), 1) // 8) * 8 for v in values]
        self.data: npt.NDArray[np.uint8] = np.zeros(max(sum(sizes), 8), dtype=np.uint8)
        self.ptrs: npt.NDArray[np.uint64] = np.zeros(max(len(values), 1), dtype=np.uint64)
        base = self.data.ctypes.data
        pos = 0
        for i, (v, s) in enumerate(zip(values, sizes, strict=True)):
            self.data[pos : pos + len(v)] = np.frombuffer(v, dtype=np.uint8)
            self.ptrs[i] = base + pos
            pos += s
        self.nbytes = pos

    @classmethod
    def view(cls, data: npt.NDArray[np.uint8], ptrs: npt.NDArray[np.uint64], nbytes: int) -> ArgBlock:
        """A block over slot bytes and a pointer array staged already (views of larger arrays
        that hold many blocks): the layout the constructor builds, without encoding again."""
        block = cls.__new__(cls)
        block.data, block.ptrs, block.nbytes = data, ptrs, nbytes
        return block

    @property
    def address(self) -> int:
        """The address of the void* array (cuLaunchKernel's kernelParams)."""
        return int(self.ptrs.ctypes.data)

    def slot(self, i: int) -> bytes:
        """The staged bytes of param i's slot (for tests and dumps)."""
        start = int(self.ptrs[i]) - self.data.ctypes.data
        end = int(self.ptrs[i + 1]) - self.data.ctypes.data if i + 1 < len(self.ptrs) else self.nbytes
        return self.data[start:end].tobytes()


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """One compiled kernel launch: function, geometry, staged args, optional Ex config."""

    func: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: ArgBlock
    config: Any  # CUlaunchConfig when cluster or PDL is set, else None
    label: str
