"""Weight sources and bind planning.

A `Tensors` gives, by name, a tensor's dtype, shape and bytes (`MemoryBlob`, `FileBlob` or
`DeviceBlob`). `Safetensors` implements it over one or many shards, reading headers only.
`plan_bind` is the pure step: a buffer's bind segments, resolved for this rank as `TensorWindow`s,
become a list of `Copy`s (with exact coverage, dtype and shape checked, and an e4m3 weight's
scales against its shape) before any byte moves;
`weights_loader` performs them.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .errors import ApiError, WeightArtifactError

__all__ = [
    "DTYPE_BYTES",
    "FP8_BLOCK",
    "Copy",
    "DeviceBlob",
    "FileBlob",
    "MemoryBlob",
    "RowInterleave",
    "Safetensors",
    "TensorInfo",
    "TensorWindow",
    "Tensors",
    "plan_bind",
]

DTYPE_BYTES: Mapping[str, int] = {
    "bf16": 2, "f16": 2, "f32": 4, "fp8e4m3": 1, "fp8e8m0": 1,
    "i8": 1, "i32": 4, "u32": 4, "i64": 8, "u64": 8, "u8": 1,
}  # fmt: skip

FP8_BLOCK: tuple[int, int] = (128, 128)
"""The [rows, cols] a Qwen FP8 checkpoint's `weight_scale_inv` entry scales."""
_FP8 = "fp8e4m3"
_SCALE_DTYPES = frozenset({"f32", "bf16", "f16"})
"""What an e4m3 weight's scales may be stored as (Qwen's block scales are f32; compressed-tensors'
per-row scales are often the model's bf16)."""

_SAFETENSORS_DTYPES: Mapping[str, str] = {
    "BF16": "bf16", "F16": "f16", "F32": "f32", "F8_E4M3": "fp8e4m3", "F8_E8M0": "fp8e8m0",
    "I8": "i8", "I32": "i32", "U32": "u32", "I64": "i64", "U64": "u64", "U8": "u8", "BOOL": "u8",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class MemoryBlob:
    """Bytes in this process's memory."""

    data: memoryview


@dataclass(frozen=True, slots=True)
class FileBlob:
    """A byte range of a file (read with pread, never mapped)."""

    path: str
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class DeviceBlob:
    """Bytes at a device address this context can read."""

    ptr: int
    nbytes: int


Blob = MemoryBlob | FileBlob | DeviceBlob


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One checkpoint tensor: kern dtype name, shape and where its bytes are."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    blob: Blob

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]

    @property
    def matrix(self) -> tuple[int, int]:
        """The tensor viewed as 2-D: [dim0, product of the other dims] (a scalar is [1, 1])."""
        if not self.shape:
            return (1, 1)
        return (self.shape[0], math.prod(self.shape[1:]))


class Tensors(Protocol):
    """A source of checkpoint tensors by name.

    `get(name)` gives the tensor called `name`, or None if this source has none; `names()` every
    tensor name this source holds.
    """

    def get(self, name: str) -> TensorInfo | None: ...

    def names(self) -> Iterator[str]: ...


class Safetensors:
    """Tensors over safetensors shards; only headers are read at open.

    Build with `Safetensors.open(paths)` (files or directories of `*.safetensors`) or
    `Safetensors.parse(bytes)` for one in-memory file.
    """

    def __init__(self, tensors: dict[str, TensorInfo], files: tuple[str, ...]) -> None:
        self._tensors = tensors
        self.files = files

    @classmethod
    def open(cls, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Safetensors:
        """Reads the headers of every shard; a tensor in two shards is a WeightArtifactError."""
        files = _expand(paths)
        tensors: dict[str, TensorInfo] = {}
        for path in files:
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) != 8:
                    raise WeightArtifactError(f"{path}: too short for a safetensors file")
                (size,) = struct.unpack("<Q", head)
                end = os.fstat(f.fileno()).st_size
                _check_header_size(path, size, end)
                header = f.read(size)
            for info in _parse_header(path, header, 8 + size, end, _file_blob(path)):
                _add(tensors, info, path)
        return cls(tensors, tuple(files))

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> Safetensors:
        """Tensors over one safetensors file held in memory (bytes are not copied)."""
        view = memoryview(data).cast("B")
        if len(view) < 8:
            raise WeightArtifactError("<memory>: too short for a safetensors file")
        (size,) = struct.unpack("<Q", view[:8])
        _check_header_size("<memory>", size, len(view))
        base = 8 + size
        header = bytes(view[8:base])
        tensors: dict[str, TensorInfo] = {}
        for info in _parse_header("<memory>", header, base, len(view), _memory_blob(view)):
            _add(tensors, info, "<memory>")
        return cls(tensors, ())

    def get(self, name: str) -> TensorInfo | None:
        return self._tensors.get(name)

    def names(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    @property
    def nbytes(self) -> int:
        """Total bytes of every tensor."""
        return sum(t.nbytes for t in self._tensors.values())


MAX_HEADER = 100_000_000
"""The safetensors format's bound on a header's JSON (bytes)."""


def _check_header_size(path: str | os.PathLike[str], size: int, end: int) -> None:
    """A header length that the file (or the format) cannot hold: not a safetensors file. Checked
    before the header is read, so a text file's first 8 bytes never size an allocation."""
    if size > min(end - 8, MAX_HEADER):
        raise WeightArtifactError(f"{path}: not a safetensors file (its first 8 bytes give a {size}-byte header; "
                                  f"the file has {end} bytes)")


BlobMaker = Callable[[int, int], "Blob"]


def _file_blob(path: str) -> BlobMaker:
    return lambda offset, nbytes: FileBlob(path, offset, nbytes)


def _memory_blob(view: memoryview) -> BlobMaker:
    return lambda offset, nbytes: MemoryBlob(view[offset : offset + nbytes])


def _expand(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    files: list[str] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.glob("*.safetensors"))
            if not found:
                raise ApiError(f"{p}: directory holds no *.safetensors files")
            files.extend(found)
        elif p.is_file():
            files.append(str(p))
        else:
            raise ApiError(f"{p}: no such weights file or directory")
    if not files:
        raise ApiError("no weights files given")
    return files


def _parse_header(where: str, header: bytes, base: int, end: int, blob: BlobMaker) -> list[TensorInfo]:
    try:
        meta = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightArtifactError(f"{where}: safetensors header is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise WeightArtifactError(f"{where}: safetensors header is not an object")
    out: list[TensorInfo] = []
    for name, entry in meta.items():  # type: ignore[union-attr]
        if name == "__metadata__":
            continue
        out.append(_entry(where, name, entry, base, end, blob))
    return out


def _entry(where: str, name: str, entry: object, base: int, end: int, blob: BlobMaker) -> TensorInfo:
    try:
        dtype = _SAFETENSORS_DTYPES[entry["dtype"]]  # type: ignore[index]
        shape = tuple(int(d) for d in entry["shape"])  # type: ignore[index]
        start, stop = (int(x) for x in entry["data_offsets"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        raise WeightArtifactError(f"{where}: tensor {name!r} has a bad header entry {entry!r}") from None
    nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
    if stop - start != nbytes or start < 0 or base + stop > end:
        raise WeightArtifactError(
            f"{where}: tensor {name!r} byte range [{start}, {stop}) does not fit its shape or the file"
        )
    return TensorInfo(name, dtype, shape, blob(base + start, nbytes))


def _add(tensors: dict[str, TensorInfo], info: TensorInfo, where: str) -> None:
    old = tensors.get(info.name)
    if old is not None:
        first = old.blob.path if isinstance(old.blob, FileBlob) else "<memory>"
        raise WeightArtifactError(
            f"tensor {info.name!r} appears in two shards ({first} and {where}); keep one copy"
        )
    tensors[info.name] = info


# -- bind planning (pure) -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowInterleave:
    """Alternate blocks of `rows` rows of the window's tensor and of `with_` (same shape)."""

    with_: str
    rows: int


@dataclass(frozen=True, slots=True)
class TensorWindow:
    """One bind segment, resolved for this rank: a tensor's rows x cols window (half-open)."""

    tensor: str
    rows: tuple[int, int] | None = None
    cols: tuple[int, int] | None = None
    interleave: RowInterleave | None = None


@dataclass(frozen=True, slots=True)
class Copy:
    """Copy `height` rows of `width` bytes from a tensor's blob into a buffer.

    Source row r starts at `src_offset + r * src_pitch` inside the blob; destination rows are
    packed (`dst_offset + r * width`). A contiguous run has `height == 1`.
    """

    tensor: TensorInfo
    src_offset: int
    src_pitch: int
    dst_offset: int
    width: int
    height: int

    @property
    def nbytes(self) -> int:
        return self.width * self.height


def _lookup(tensors: Tensors, buffer: str, name: str) -> TensorInfo:
    info = tensors.get(name)
    if info is None:
        raise WeightArtifactError(f"buffer {buffer!r}: checkpoint has no tensor {name!r}")
    return info


def _window(buffer: str, info: TensorInfo, seg: TensorWindow) -> tuple[int, int, int, int]:
    nrows, ncols = info.matrix
    r0, r1 = seg.rows if seg.rows is not None else (0, nrows)
    c0, c1 = seg.cols if seg.cols is not None else (0, ncols)
    if not (0 <= r0 < r1 <= nrows and 0 <= c0 < c1 <= ncols):
        raise WeightArtifactError(
            f"buffer {buffer!r}: window rows [{r0},{r1}) cols [{c0},{c1}) outside tensor "
            f"{info.name!r} of shape {list(info.shape)} (viewed as [{nrows}, {ncols}])"
        )
    return r0, r1, c0, c1


def _rect(info: TensorInfo, r0: int, r1: int, c0: int, c1: int, dst: int) -> Copy:
    esize = DTYPE_BYTES[info.dtype]
    pitch = info.matrix[1] * esize
    width = (c1 - c0) * esize
    if width == pitch:
        return Copy(info, r0 * pitch, pitch, dst, width * (r1 - r0), 1)
    return Copy(info, r0 * pitch + c0 * esize, pitch, dst, width, r1 - r0)


def _segment_copies(buffer: str, dtype: str, tensors: Tensors, seg: TensorWindow, dst: int) -> list[Copy]:
    info = _lookup(tensors, buffer, seg.tensor)
    _check_dtype(buffer, dtype, info)
    if info.dtype == _FP8:
        _check_fp8_scales(buffer, info, tensors)
    r0, r1, c0, c1 = _window(buffer, info, seg)
    if seg.interleave is None:
        return [_rect(info, r0, r1, c0, c1, dst)]
    other = _lookup(tensors, buffer, seg.interleave.with_)
    _check_dtype(buffer, dtype, other)
    if other.dtype == _FP8:
        _check_fp8_scales(buffer, other, tensors)
    if other.shape != info.shape:
        raise WeightArtifactError(
            f"buffer {buffer!r}: interleave partners {info.name!r} {list(info.shape)} and "
            f"{other.name!r} {list(other.shape)} differ in shape"
        )
    n = seg.interleave.rows
    if n < 1 or (r1 - r0) % n:
        raise WeightArtifactError(
            f"buffer {buffer!r}: {r1 - r0} rows of {info.name!r} do not split into blocks of {n}"
        )
    out: list[Copy] = []
    for start in range(r0, r1, n):
        for part in (info, other):
            c = _rect(part, start, start + n, c0, c1, dst)
            out.append(c)
            dst += c.nbytes
    return out


def _check_dtype(buffer: str, dtype: str, info: TensorInfo) -> None:
    if info.dtype == dtype:
        return
    if info.dtype == _FP8:
        raise WeightArtifactError(
            f"buffer {buffer!r} is {dtype} but tensor {info.name!r} is {_FP8}: an FP8 checkpoint "
            "needs a manifest with fp8 weight buffers (or bind a bf16 checkpoint)"
        )
    if dtype == _FP8:
        raise WeightArtifactError(
            f"buffer {buffer!r} is {_FP8} but tensor {info.name!r} is {info.dtype}: this manifest "
            "binds an FP8 checkpoint's weights (or use a manifest for this checkpoint's dtype)"
        )
    raise WeightArtifactError(
        f"buffer {buffer!r} is {dtype} but tensor {info.name!r} is {info.dtype}; export it as {dtype}"
    )


def _check_fp8_scales(buffer: str, weight: TensorInfo, tensors: Tensors) -> None:
    """An e4m3 weight's scales fit its shape: Qwen's `<name>_scale_inv`, one per 128 x 128 block,
    and compressed-tensors' `<name>_scale`, one per output row ([n, 1]) or one in all."""
    n, k = weight.matrix
    for companion in (tensors.get(weight.name + "_scale_inv"), tensors.get(weight.name + "_scale")):
        if companion is not None and companion.dtype not in _SCALE_DTYPES:
            raise WeightArtifactError(
                f"buffer {buffer!r}: scales {companion.name!r} are {companion.dtype}; an e4m3 weight's scales are "
                f"{' or '.join(sorted(_SCALE_DTYPES))}"
            )
    block = tensors.get(weight.name + "_scale_inv")
    want = (-(-n // FP8_BLOCK[0]), -(-k // FP8_BLOCK[1]))
    if block is not None and block.shape != want:
        raise WeightArtifactError(
            f"buffer {buffer!r}: block scales {block.name!r} {list(block.shape)} do not fit "
            f"{weight.name!r} {list(weight.shape)}, which takes {list(want)} (one per "
            f"{FP8_BLOCK[0]} x {FP8_BLOCK[1]} block)"
        )
    channel = tensors.get(weight.name + "_scale")
    if channel is not None and channel.shape not in ((n, 1), (1,), ()):
        raise WeightArtifactError(
            f"buffer {buffer!r}: scales {channel.name!r} {list(channel.shape)} do not fit "
            f"{weight.name!r} {list(weight.shape)}, which takes [{n}, 1] (one per output row) or [1]"
        )


def plan_bind(
    buffer: str, dtype: str, nbytes: int, segments: Sequence[TensorWindow], tensors: Tensors
) -> list[Copy]:
    """Turns a buffer's bind into copies, checking dtype, windows and exact coverage.

    Raises:
        WeightArtifactError: a tensor is missing, has another dtype (an FP8 checkpoint for a bf16
            buffer or the reverse among them), a window falls outside it, an e4m3 tensor's
            `_scale_inv` / `_scale` companion does not fit its shape, or the segments do not fill
            the buffer exactly.
    """
    copies: list[Copy] = []
    dst = 0
    for seg in segments:
        part = _segment_copies(buffer, dtype, tensors, seg, dst)
        copies.extend(part)
        dst += sum(c.nbytes for c in part)
    if dst != nbytes:
        raise WeightArtifactError(
            f"buffer {buffer!r} holds {nbytes} bytes but its bind segments give {dst}; "
            "the checkpoint's shapes differ from the manifest"
        )
    return _merge(copies)


def _merge(copies: list[Copy]) -> list[Copy]:
    """Joins contiguous runs that continue each other in both source and destination."""
    out: list[Copy] = []
    for c in copies:
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.height == 1
            and c.height == 1
            and prev.tensor.blob == c.tensor.blob
            and prev.src_offset + prev.width == c.src_offset
            and prev.dst_offset + prev.width == c.dst_offset
        ):
            out[-1] = Copy(prev.tensor, prev.src_offset, prev.src_pitch, prev.dst_offset, prev.width + c.width, 1)
        else:
            out.append(c)
    return out
