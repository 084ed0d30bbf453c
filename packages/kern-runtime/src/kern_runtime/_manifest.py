"""The runtime's view of kern_manifest: the one way a manifest is read (parsed and verified once
per process), loading with error mapping, and bind segments per rank."""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Mapping
from pathlib import Path

import kern_manifest as km
from kern_manifest import Buffer, Manifest, ManifestParse, ManifestRejected, RankRanges, RankTensors

from .errors import ApiError, InputFileError, ManifestParseError, ManifestVerifyError
from .weights import RowInterleave, TensorWindow

__all__ = ["bind_segments", "load_manifest", "map_rejection", "read_manifest"]

_MODELS_KEPT = 8
"""Manifest texts whose verified models `read_manifest` keeps (the most recently read)."""
_verified: dict[int, weakref.ref[Manifest]] = {}


def map_rejection(exc: km.ManifestError) -> ManifestParseError | ManifestVerifyError:
    """A kern_manifest rejection as the runtime's provider error (parse wins over verify)."""
    problems = exc.problems if isinstance(exc, ManifestRejected) else (exc,)
    if any(isinstance(p, ManifestParse) for p in problems):
        return ManifestParseError(exc.line())
    return ManifestVerifyError(exc.line())


def _mark_verified(model: Manifest) -> Manifest:
    key = id(model)
    _verified[key] = weakref.ref(model, lambda _ref: _verified.pop(key, None))
    return model


def _is_verified(model: Manifest) -> bool:
    ref = _verified.get(id(model))
    return ref is not None and ref() is model


def _verify(model: Manifest) -> None:
    problems = km.check(model)
    if problems:
        raise ManifestRejected(problems)


@functools.lru_cache(maxsize=_MODELS_KEPT)
def _model_of(data: bytes) -> Manifest:
    """The verified model of a manifest text, made once per text while it is kept.

    Raises:
        ManifestRejected: parse problems, else verify problems.
    """
    model = km.parse_manifest(data)
    _verify(model)
    return _mark_verified(model)


def _file_error(path: Path, exc: ManifestRejected) -> ManifestParseError | ManifestVerifyError:
    problems = list(exc.problems)
    first = problems[0].line() if problems else exc.line()
    more = f" (and {len(problems) - 1} more: kern manifest verify {path})" if len(problems) > 1 else ""
    kind = ManifestParseError if any(isinstance(p, ManifestParse) for p in problems) else ManifestVerifyError
    return kind(f"manifest {path}: {first}{more}")


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """The verified kern_manifest model of a manifest file: the one way in. The same text is parsed
    and verified once per process; every caller passes the model along.

    Raises:
        InputFileError: the file cannot be read.
        ManifestParseError: a parse problem (the first one; `kern manifest verify` lists all).
        ManifestVerifyError: a verify problem (the first one).
    """
    where = Path(path)
    try:
        data = where.read_bytes()
    except OSError as exc:
        raise InputFileError(f"manifest {where}: {exc.strerror or exc}") from None
    try:
        return _model_of(data)
    except ManifestRejected as exc:
        raise _file_error(where, exc) from None


def load_manifest(src: Manifest | str | os.PathLike[str]) -> Manifest:
    """A verified manifest model from a file path (`read_manifest`) or a model (verified here once;
    a model `read_manifest` gave is not verified again).

    Raises:
        as `read_manifest`; ManifestVerifyError: a model that fails the verifier.
    """
    if not isinstance(src, Manifest):
        return read_manifest(src)
    if not _is_verified(src):
        try:
            _verify(src)
        except km.ManifestError as exc:
            raise map_rejection(exc) from None
        _mark_verified(src)
    return src


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
