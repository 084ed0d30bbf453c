"""The runtime's view of kern_manifest: loading with error mapping, and bind segments per rank."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import kern_manifest as km
from kern_manifest import Buffer, Manifest, ManifestParse, ManifestRejected, RankRanges, RankTensors

from .errors import ApiError, ManifestParseError, ManifestVerifyError
from .weights import RowInterleave, TensorWindow

__all__ = ["bind_segments", "load_manifest", "map_rejection"]


def map_rejection(exc: km.ManifestError) -> ManifestParseError | ManifestVerifyError:
    """A kern_manifest rejection as the runtime's provider error (parse wins over verify)."""
    problems = exc.problems if isinstance(exc, ManifestRejected) else (exc,)
    if any(isinstance(p, ManifestParse) for p in problems):
        return ManifestParseError(exc.line())
    return ManifestVerifyError(exc.line())


def _verify(model: Manifest) -> None:
    verify = getattr(km, "verify", None)
    if verify is None:
        return
    try:
        result = verify(model)
    except km.ManifestError as exc:
        raise map_rejection(exc) from None
    if result:
        raise map_rejection(ManifestRejected(list(result)))


def load_manifest(src: Manifest | str | os.PathLike[str]) -> Manifest:
    """A verified manifest model from a model or a file path."""
    if isinstance(src, Manifest):
        model = src
    else:
        try:
            data = Path(src).read_bytes()
        except OSError as exc:
            raise ApiError(f"cannot read manifest {src}: {exc.strerror}") from None
        try:
            model = km.parse_manifest(data)
        except km.ManifestError as exc:
            raise map_rejection(exc) from None
    _verify(model)
    return model


def _rank_pick(buffer: str, group: str, ranks: Mapping[str, int], n: int) -> int:
    r = ranks.get(group, 0)
    if not 0 <= r < n:
        raise ApiError(f"buffer {buffer!r}: rank {r} in group {group!r} has no entry (table of {n})")
    return r


def _range(buffer: str, raw: tuple[int, int] | RankRanges | None, ranks: Mapping[str, int]) -> tuple[int, int] | None:
    if raw is None or isinstance(raw, tuple):
        return raw
    pick = raw.ranges[_rank_pick(buffer, raw.group, ranks, len(raw.ranges))]
    return (pick[0], pick[1])


def bind_segments(name: str, buf: Buffer, ranks: Mapping[str, int]) -> list[TensorWindow]:
    """The buffer's bind resolved for this rank, as the planner's TensorWindows."""
    out: list[TensorWindow] = []
    for seg in buf.bind or ():
        tensor = seg.tensor
        if isinstance(tensor, RankTensors):
            tensor = tensor.tensors[_rank_pick(name, tensor.group, ranks, len(tensor.tensors))]
        inter = RowInterleave(seg.interleave.with_, seg.interleave.rows) if seg.interleave else None
        out.append(TensorWindow(tensor, _range(name, seg.rows, ranks), _range(name, seg.cols, ranks), inter))
    return out
