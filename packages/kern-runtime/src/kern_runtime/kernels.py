"""Kernel artifacts: modules by sha256, fatbin pieces, entry resolution and the ABI check.

The kernels directory is hashed file by file; only the hashes the manifest names are loaded (file
names play no part). A module file may be a cubin, a fatbin or a host shared object with an
`.nv_fatbin` section; a fatbin's ELF images for this device's architecture are loaded one by one,
so that same-named kernels (Triton specializations) can coexist. The ABI check compares declared
params with cuFuncGetParamInfo and picks the one instance whose layout matches.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _driver as drv
from .errors import CudaError, KernelArtifactError

__all__ = [
    "FATBIN_MAGIC",
    "LoadedModule",
    "ParamSlot",
    "declared_layout",
    "first_mismatch",
    "hash_dir",
    "param_size",
    "split_fatbin",
]

FATBIN_MAGIC = 0xBA55ED50
_ELF_MAGIC = b"\x7fELF"
_SCALAR_SIZES = {"i32": 4, "i64": 8, "f32": 4, "u8": 1}


def param_size(ptype: str) -> int:
    """ABI bytes of one declared param type (`in buffer<bf16>`, `inout state`, `i32`, `bytes<n>`)."""
    kind = ptype.split()[-1]
    if kind.startswith("buffer") or kind == "state":
        return 8
    if kind.startswith("bytes<") and kind.endswith(">"):
        return int(kind[6:-1])
    return _SCALAR_SIZES[kind]


@dataclass(frozen=True, slots=True)
class ParamSlot:
    """A param's declared ABI: size, and offset when its alignment is known (None for bytes<n>)."""

    size: int
    offset: int | None


def declared_layout(ptypes: Sequence[str]) -> list[int]:
    """The param sizes a manifest declares for a launch."""
    return [param_size(p) for p in ptypes]


def first_mismatch(sizes: Sequence[int], actual: Sequence[tuple[int, int]]) -> str | None:
    """None when `actual` (offset, size) pairs fit the declared sizes; else what differs first.

    Offsets follow natural alignment for scalars and pointers; a bytes<n> struct's alignment is
    the kernel's choice, so its offset must only be at or past the previous param's end.
    """
    if len(sizes) != len(actual):
        return f"declares {len(sizes)} params, the kernel has {len(actual)}"
    pos = 0
    for i, (size, (off, asize)) in enumerate(zip(sizes, actual, strict=True)):
        if size != asize:
            return f"param {i} is {asize} bytes in the kernel, declared {size}"
        natural = size if size in (1, 2, 4, 8) else None
        want = -(-pos // natural) * natural if natural else None
        if (want is not None and off != want) or off < pos:
            return f"param {i} sits at offset {off} in the kernel, declared layout puts it at {want or pos}"
        pos = off + size
    return None


def hash_dir(path: str | os.PathLike[str]) -> dict[str, Path]:
    """sha256 hex of every regular file directly or recursively under `path`."""
    root = Path(path)
    if not root.is_dir():
        raise KernelArtifactError(f"kernels directory {root} does not exist")
    out: dict[str, Path] = {}
    for f in sorted(root.rglob("*")):
        if f.is_file():
            out.setdefault(hashlib.sha256(f.read_bytes()).hexdigest(), f)
    return out


def _elf_fatbin_section(data: bytes) -> bytes | None:
    """The `.nv_fatbin` section of a 64-bit little-endian ELF (a host .so), if any."""
    if data[:4] != _ELF_MAGIC or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def sect(i: int) -> tuple[int, int, int]:
        name, _t, _f, _a, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, off, size
    _n, stroff, _s = sect(shstrndx)
    for i in range(shnum):
        name, off, size = sect(i)
        end = data.index(b"\0", stroff + name)
        if data[stroff + name : end] == b".nv_fatbin":
            return data[off : off + size]
    return None


def split_fatbin(data: bytes, arch: int) -> list[bytes]:
    """Each ELF image for `arch` (e.g. 90) in a fatbin, re-wrapped as a one-image fatbin.

    The driver loads (and decompresses) a one-image fatbin; images for other architectures and
    PTX are skipped. A blob may hold several fatbins back to back (an .nv_fatbin section).
    """
    out: list[bytes] = []
    pos = 0
    while pos + 16 <= len(data):
        magic, version, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            break
        body = pos + hsize
        end = body + fsize
        entry = body
        while entry + 64 <= end:
            kind, _v, ehsize, payload = struct.unpack_from("<HHIQ", data, entry)
            earch, = struct.unpack_from("<I", data, entry + 28)
            total = ehsize + payload
            if kind == 2 and earch == arch:
                image = data[entry : entry + total]
                out.append(struct.pack("<IHHQ", FATBIN_MAGIC, version, 16, len(image)) + image)
            entry += total
        pos = -(-end // 8) * 8
    return out


def module_images(data: bytes, arch: int) -> list[bytes]:
    """The loadable images of one module file: a cubin as is; fatbins split per image."""
    if data[:4] == struct.pack("<I", FATBIN_MAGIC):
        return split_fatbin(data, arch)
    section = _elf_fatbin_section(data)
    if section is not None:
        return split_fatbin(section, arch)
    return [data]


@dataclass(frozen=True, slots=True)
class Instance:
    """One loaded kernel function and its parameter layout."""

    func: Any
    layout: tuple[tuple[int, int], ...]


class LoadedModule:
    """A manifest module loaded from its pinned file: every image, every function by name."""

    def __init__(self, name: str, sha256: str, functions: Mapping[str, list[Instance]]) -> None:
        self.name = name
        self.sha256 = sha256
        self._functions = functions

    @classmethod
    def load(cls, stack: ExitStack, name: str, sha256: str, data: bytes, arch: int) -> LoadedModule:
        images = module_images(data, arch)
        if not images:
            raise KernelArtifactError(
                f"module {name!r} ({sha256[:12]}) holds no image for sm_{arch}; extract it for this GPU"
            )
        functions: dict[str, list[Instance]] = {}
        for image in images:
            try:
                mod = drv.module_load(image)
            except CudaError as exc:
                raise KernelArtifactError(
                    f"module {name!r} ({sha256[:12]}) does not load: {exc.explanation}; re-extract it"
                ) from None
            stack.callback(drv.module_unload, mod)
            for fname, func in drv.module_functions(mod):
                layout = tuple(drv.func_param_layout(func))
                functions.setdefault(fname, []).append(Instance(func, layout))
        return cls(name, sha256, functions)

    def resolve(self, entry: str, ptypes: Sequence[str]) -> Any:
        """The single instance of `entry` whose parameter layout matches the declared params."""
        found = self._functions.get(entry)
        if not found:
            raise KernelArtifactError(
                f"module {self.name!r} ({self.sha256[:12]}) has no entry {entry!r}; "
                f"it has {sorted(self._functions)[:8]}"
            )
        sizes = declared_layout(ptypes)
        problems = [first_mismatch(sizes, inst.layout) for inst in found]
        matches = [inst for inst, p in zip(found, problems, strict=True) if p is None]
        if len(matches) == 1:
            return matches[0].func
        if not matches:
            raise KernelArtifactError(
                f"module {self.name!r} entry {entry!r}: ABI mismatch, {problems[0]}"
                + (f" ({len(found)} instances, none match)" if len(found) > 1 else "")
            )
        raise KernelArtifactError(
            f"module {self.name!r} entry {entry!r}: {len(matches)} instances share the declared "
            "layout; the module must hold one instance per ABI"
        )


def read_module(hashes: Mapping[str, Path], name: str, sha256: str) -> bytes:
    """The bytes of a module by its pinned hash, re-checked after reading."""
    path = hashes.get(sha256)
    if path is None:
        raise KernelArtifactError(
            f"module {name!r}: no file with sha256 {sha256[:12]}… in the kernels directory; extract it"
        )
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise KernelArtifactError(f"module {name!r}: {path} changed while loading; its hash differs")
    return data
