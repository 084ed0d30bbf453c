"""Verifier checks of a kernel launch's packed argument buffers: fields, widths, params and
tensormaps (the base of OpChecks, whose `launch_arg` hands a pack arg to `pack`)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from kern_manifest._verify_base import (
    CUDA_LIMITS,
    Base,
    OpInfo,
    names,
)
from kern_manifest.errors import short
from kern_manifest.schema import (
    PACK_DEFAULT_WIDTH,
    Op,
    Pack,
    PackExpr,
    PackF32,
    PackI32,
    PackI64,
    PackParam,
    PackRank,
    PackScratch,
    PackTensormap,
    PackU8,
    PackVar,
    ParamType,
)

__all__ = ["Key", "LaunchAccess", "PackChecks"]

Key = tuple[str, int | str]


@dataclass(slots=True)
class LaunchAccess:
    """The reads and writes of one launch (keys: ("param", i) or ("scratch", name))."""

    reads: set[Key] = field(default_factory=set[Key])
    writes: set[Key] = field(default_factory=set[Key])

    def touch(self, key: Key, reads: bool, writes: bool) -> None:
        if reads:
            self.reads.add(key)
        if writes:
            self.writes.add(key)


class PackChecks(Base):
    """The packed-argument checks of launches."""

    def pack(
        self,
        op: Op,
        pack: Pack,
        param: ParamType,
        at: str,
        bounds: Mapping[str, tuple[int, int]],
        step: LaunchAccess,
        info: OpInfo,
    ) -> None:
        if param.kind != "bytes":
            self.err(at, f"pack for a `{param}` slot", "packs fill bytes<n> params")
            return
        if pack.size != param.size:
            self.err(
                at + "/pack/size",
                f"pack size {pack.size} for a bytes<{param.size}> param",
                f"use size {param.size}",
            )
        spans: list[tuple[int, int, int]] = []
        for n, f in enumerate(pack.fields):
            fat = f"{at}/pack/fields/{n}"
            width = self.pack_field(op, f, fat, bounds, step, info)
            if width is None:
                continue
            if f.at + width > pack.size:
                self.err(
                    fat,
                    f"field [{f.at}, {f.at + width}) runs past the pack's {pack.size} bytes",
                    "move it or grow the pack",
                )
            spans.append((f.at, f.at + width, n))
        spans.sort()
        for (_, end, _), (start, _, n) in itertools.pairwise(spans):
            if start < end:
                self.err(
                    f"{at}/pack/fields/{n}",
                    "pack field overlaps another",
                    "give each field its own bytes",
                )

    def pack_field(
        self,
        op: Op,
        f: object,
        at: str,
        bounds: Mapping[str, tuple[int, int]],
        step: LaunchAccess,
        info: OpInfo,
    ) -> int | None:
        if isinstance(f, PackTensormap):
            return self.tensormap_field(op, f, at, step, info)
        if isinstance(f, PackParam):
            return self.pack_param(op, f, at, step)
        assert isinstance(
            f, PackScratch | PackI32 | PackI64 | PackF32 | PackU8 | PackVar | PackExpr | PackRank
        )
        width = f.width if f.width is not None else PACK_DEFAULT_WIDTH[f.KIND]
        if isinstance(f, PackScratch):
            if f.scratch not in op.impl.scratch:
                self.err(
                    at + "/scratch",
                    f"unknown scratch {short(f.scratch)!r}",
                    f"declare it under impl/scratch (declared: {names(op.impl.scratch)})",
                )
            else:
                step.touch(("scratch", f.scratch), True, True)
            return self.width_is(width, (8,), at)
        if isinstance(f, PackVar | PackExpr | PackRank):
            if self.width_is(width, (4, 8), at) is None:
                return None
            dtype = "i32" if width == 4 else "i64"
            if isinstance(f, PackRank):
                self.group_ref(f.rank, at + "/rank")
            else:
                self.integer_value(f, dtype, at, bounds)
            return width
        self.literal(f, f"{at}/{f.KIND}")
        return self.width_is(width, (PACK_DEFAULT_WIDTH[f.KIND],), at)

    def width_is(self, width: int, allowed: tuple[int, ...], at: str) -> int | None:
        if width not in allowed:
            self.err(
                at + "/width",
                f"width {width}",
                f"this field's width is {' or '.join(map(str, allowed))}",
            )
            return None
        return width

    def pack_param(self, op: Op, f: PackParam, at: str, step: LaunchAccess) -> int | None:
        if f.param >= len(op.params):
            self.err(
                at + "/param",
                f"param {f.param} out of range",
                f"the op has {len(op.params)} params",
            )
            return None
        iface = op.params[f.param]
        if iface.is_pointer:
            step.touch(("param", f.param), iface.reads, iface.writes)
            natural = 8
        else:
            natural = iface.size
        return self.width_is(f.width if f.width is not None else natural, (natural,), at)

    def tensormap_field(
        self, op: Op, f: PackTensormap, at: str, step: LaunchAccess, info: OpInfo
    ) -> int | None:
        tm = f.tensormap
        tat = at + "/tensormap"
        if f.at % 64:
            self.err(
                at + "/at", f"tensormap at byte {f.at}", "tensormaps sit at 64-byte aligned offsets"
            )
        if tm.param >= len(op.params) or op.params[tm.param].kind != "buffer":
            self.err(
                tat + "/param",
                f"tensormap over param {tm.param}, which is not a buffer param",
                "point it at a buffer param of the op",
            )
        else:
            iface = op.params[tm.param]
            step.touch(("param", tm.param), iface.reads, iface.writes)
            info.tensormaps.append((tm.param, tm))
        rank = len(tm.dims)
        if not 1 <= rank <= CUDA_LIMITS.tensormap_rank:
            self.err(tat + "/dims", f"tensormap of rank {rank}", "use 1 to 5 dims")
        if len(tm.strides) != max(rank - 1, 0):
            self.err(
                tat + "/strides",
                f"{len(tm.strides)} strides for {rank} dims",
                "give byte strides of dims[1..] (rank - 1 of them)",
            )
        if len(tm.box) != rank or any(not 1 <= b <= CUDA_LIMITS.tensormap_box for b in tm.box):
            self.err(
                tat + "/box",
                f"box {list(tm.box)} for {rank} dims",
                "one box extent per dim, each 1..256",
            )
        for i, d in enumerate(tm.dims):
            self.range(d, f"{tat}/dims/{i}")
        for i, s in enumerate(tm.strides):
            span = self.range(s, f"{tat}/strides/{i}")
            if span is not None and (s.divisor == 0 or s.divisor % 16):
                self.err(
                    f"{tat}/strides/{i}",
                    "stride is not always a non-zero multiple of 16",
                    "tensormap byte strides are multiples of 16",
                )
        return self.width_is(f.width if f.width is not None else 128, (128,), at)
