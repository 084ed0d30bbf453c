"""Input domains: the bounds a host write into an input buffer must respect (reference design 1.4).

A buffer's `domain` is either `{min?, max?}` (inclusive; an int, a float or an expression of the
vars, evaluated at the vars' maxima as the verifier does) or `{index_into, stride?}`: the elements
index `stride`-sized units of another buffer or a state, so they lie in [0, units // stride - 1]:
- a buffer: rows (its first dimension at the vars' maxima);
- a paged state (`bytes_per_token`): the token slots of the pool's pages (pages x tokens per page),
  so a block table with stride = tokens per page holds page numbers the pool has;
- a per-seq state (`bytes_per_seq`): byte lines over the pool's slots (slots x bytes per slot);
- a fixed state (`bytes`): its bytes.
`monotone` also requires a non-decreasing sequence (of the elements written: a prefix write is
not checked against the elements after it). Floating-point inputs are compared by value (bf16 and
the fp8 formats arrive as their bits) and a NaN is always outside. A paged state's bound is its
pool's capacity in pages: a page number below it may still be unmapped when the pool has given
chunks to slots. `input_domains` resolves every input buffer's domain once, at load;
`check_domain` tests a write against it in O(n) and raises `DomainError` before anything is copied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kern_manifest import Manifest
from kern_manifest.expr import Expr

from .errors import ApiError, DomainError

__all__ = ["InputDomain", "StateUnits", "check_domain", "input_domains"]


@dataclass(frozen=True)
class StateUnits:
    """What the runtime holds of one state, for `index_into` bounds.

    Attributes:
        units: token slots (paged), bytes over all slots (per-seq) or bytes (fixed).
        note: how `units` came about, for error messages ("256 pages of 16 tokens").
    """

    units: int
    note: str


@dataclass(frozen=True)
class InputDomain:
    """One input buffer's resolved domain.

    Attributes:
        lo: the least allowed element (None: unbounded below).
        hi: the greatest allowed element (None: unbounded above).
        monotone: elements must not decrease.
        source: where the bounds come from, for error messages.
    """

    lo: int | float | None
    hi: int | float | None
    monotone: bool
    source: str
    dtype: str = ""


def _fp8_table(kind: str) -> npt.NDArray[np.float64]:
    """The value of every byte of an fp8 format (NaN where the format has one)."""
    b = np.arange(256)
    if kind == "fp8e8m0":  # an unsigned power of two; 0xff is NaN
        return np.where(b == 255, np.nan, np.exp2(b - 127.0))
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    mag = np.where(exp == 0, np.exp2(-6.0) * man / 8.0, np.exp2(exp - 7.0) * (1.0 + man / 8.0))
    return np.where((b & 0x7F) == 0x7F, np.nan, sign * mag)  # e4m3 (OCP "FN"): no infinities


_FP8 = {kind: _fp8_table(kind) for kind in ("fp8e4m3", "fp8e8m0")}


def _values(dtype: str, flat: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The numbers the elements stand for: bf16 / fp8 bits decoded, every other dtype as it is."""
    if dtype == "bf16":
        return (flat.astype(np.uint32) << 16).view(np.float32)
    if dtype in _FP8:
        return _FP8[dtype][flat.astype(np.intp)]
    return flat


def _bound(value: int | float | Expr | None, env: Mapping[str, int]) -> int | float | None:
    if value is None or isinstance(value, int | float):
        return value
    return value.eval(env)


def input_domains(manifest: Manifest, states: Mapping[str, StateUnits]) -> dict[str, InputDomain]:
    """Every input buffer with a domain -> its bounds; `states` describes the states the
    runtime allocated (a state missing there cannot bound an index and is skipped).

    Raises:
        ApiError: an `index_into` target holds fewer units than one stride (no index is valid).
    """
    env = manifest.var_max
    out: dict[str, InputDomain] = {}
    for name, buf in manifest.buffers.items():
        dom = buf.domain
        if buf.kind != "input" or dom is None:
            continue
        if dom.index_into is None:
            lo, hi = _bound(dom.min, env), _bound(dom.max, env)
            if lo is None and hi is None and not dom.monotone:
                continue
            out[name] = InputDomain(lo, hi, dom.monotone, f"min {lo}, max {hi}", buf.dtype)
            continue
        target = dom.index_into
        stride = dom.stride or 1
        if target in manifest.buffers:
            rows = manifest.buffers[target].shape[0].eval(env)
            units, note = rows, f"buffer {target!r} of {rows} rows"
        elif target in states:
            units, note = states[target].units, f"state {target!r}: {states[target].note}"
        else:
            continue
        if units < stride:
            raise ApiError(f"input {name!r} indexes {note} in strides of {stride}: no index fits; "
                           "raise the capacity (or the target's size)")
        out[name] = InputDomain(0, units // stride - 1, dom.monotone, f"index_into {note}, stride {stride}", buf.dtype)
    return out


def _inside(flat: npt.NDArray[Any], lo: int | float | None, hi: int | float | None) -> bool:
    """Every element is a number within [lo, hi]: the common case, without building masks (a
    host-fed decode step writes four one-element inputs per token)."""
    if flat.size == 1:
        v = flat.item()
        return v == v and (lo is None or v >= lo) and (hi is None or v <= hi)  # NOTE: v != v for NaN
    if flat.dtype.kind == "f" and bool(np.isnan(flat).any()):
        return False
    return (lo is None or flat.min() >= lo) and (hi is None or flat.max() <= hi)


def check_domain(name: str, dom: InputDomain, array: npt.NDArray[Any]) -> None:
    """Raises DomainError when `array` (the values about to be written into input `name`) leaves
    `dom`: the first offending element and the allowed range, in one line."""
    flat = _values(dom.dtype, array.reshape(-1))
    if flat.size == 0:
        return
    if not _inside(flat, dom.lo, dom.hi):
        ok = np.ones(flat.shape, dtype=bool) if flat.dtype.kind != "f" else ~np.isnan(flat)
        if dom.lo is not None:
            ok &= flat >= dom.lo
        if dom.hi is not None:
            ok &= flat <= dom.hi
        bad = np.flatnonzero(~ok)
        i = int(bad[0])
        lo = "-inf" if dom.lo is None else dom.lo
        hi = "inf" if dom.hi is None else dom.hi
        raise DomainError(
            f"input {name!r} element {i} is {flat[i].item()}, outside its domain [{lo}, {hi}] "
            f"({dom.source}); {bad.size} of {flat.size} elements are outside: write values in range"
        )
    if dom.monotone and flat.size > 1:
        down = np.flatnonzero(flat[1:] < flat[:-1])
        if down.size:
            i = int(down[0]) + 1
            raise DomainError(
                f"input {name!r} element {i} is {flat[i].item()}, below element {i - 1} "
                f"({flat[i - 1].item()}): its domain is monotone; write a non-decreasing sequence"
            )
