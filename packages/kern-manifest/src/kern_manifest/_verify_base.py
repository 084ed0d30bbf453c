"""Shared state and value checks of the verifier (see `kern_manifest.verify`)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from kern_manifest.errors import (
    ExprError,
    ManifestVerify,
    escape_pointer,
    name_list,
    short,
)
from kern_manifest.expr import Expr
from kern_manifest.schema import (
    DTYPE_BYTES,
    ExprArg,
    F32Arg,
    I32Arg,
    I64Arg,
    LaunchArg,
    Manifest,
    ParamType,
    RankArg,
    Tensormap,
    U8Arg,
    VarArg,
)

__all__ = [
    "ALGO_EXTERNS",
    "CUDA_LIMITS",
    "DTYPE_RANGE",
    "F32_MAX",
    "INT_RANGE",
    "MAX_BUFFER_BYTES",
    "SHA_RE",
    "STATE_ALIGN",
    "TENSORMAP_NIBBLES",
    "Base",
    "Limits",
    "OpInfo",
    "Root",
    "SlotRule",
    "Use",
    "names",
    "ptr",
    "scalar_kind",
]


@dataclass(frozen=True, slots=True)
class Limits:
    block_threads: int = 1024
    block_xy: int = 1024
    block_z: int = 64
    grid_x: int = (1 << 31) - 1
    grid_yz: int = 65535
    shared_mem: int = 232448
    cluster_blocks: int = 16
    param_bytes: int = 32764
    tensormap_rank: int = 5
    tensormap_box: int = 256


CUDA_LIMITS: Final = Limits()
"""sm_90 limits the verifier checks against (block, grid, opt-in shared memory, cluster, ABI)."""

INT_RANGE: Final[Mapping[str, tuple[int, int]]] = {
    "i32": (-(1 << 31), (1 << 31) - 1),
    "i64": (-(1 << 63), (1 << 63) - 1),
    "u8": (0, 255),
}
DTYPE_RANGE: Final[Mapping[str, tuple[int, int]]] = {
    "i8": (-128, 127),
    "u8": (0, 255),
    "i32": INT_RANGE["i32"],
    "u32": (0, (1 << 32) - 1),
    "i64": INT_RANGE["i64"],
    "u64": (0, (1 << 64) - 1),
}
F32_MAX: Final = 3.4028234663852886e38
MAX_BUFFER_BYTES: Final = 1 << 40
"""The largest buffer or scratch (at the vars' maxima): 1 TiB, past any GPU's memory (an H200
has 141 GB) and any host's pinned memory a weight buffer could take."""
STATE_ALIGN: Final = 16
SHA_RE: Final = re.compile(r"[0-9a-f]{64}")
TENSORMAP_NIBBLES: Final[Mapping[str, int]] = {
    "u8": 2, "u16": 4, "u32": 8, "i32": 8, "u64": 16, "i64": 16,
    "f16": 4, "bf16": 4, "f32": 8, "tf32": 8, "u4": 1, "u4packed": 1,
}  # fmt: skip
ALGO_EXTERNS: Final = ("extern:cublaslt_bf16_tn", "extern:cublaslt_bf16_tn_acc")


Root = tuple[str, str]
"""A root cause other problems follow from: ("var", name) or ("group", name)."""


def ptr(*parts: str | int) -> str:
    return "".join("/" + escape_pointer(p) for p in parts)


def names(names: Iterable[str]) -> str:
    return name_list(names) or "none declared"


def scalar_kind(arg: object) -> str:
    return str(getattr(arg, "KIND", type(arg).__name__))


@dataclass(frozen=True, slots=True)
class SlotRule:
    """An extern's rule on an op param it is forwarded, checked at every call of the op: "k" (a
    multiple of 16) or "scale" (one f32 element), over the launch's var bounds."""

    param: int
    role: Literal["k", "scale"]
    entry: str
    bounds: Mapping[str, tuple[int, int]]


@dataclass(slots=True)
class OpInfo:
    """What the program pass needs to know about one op."""

    params: tuple[ParamType, ...]
    has_extern: bool = False
    collective: bool = False
    tensormaps: list[tuple[int, Tensormap]] = field(default_factory=list[tuple[int, Tensormap]])
    slot_rules: list[SlotRule] = field(default_factory=list[SlotRule])


@dataclass(slots=True)
class Use:
    """References seen so far (for the unused-declaration check)."""

    buffers: set[str] = field(default_factory=set[str])
    states: set[str] = field(default_factory=set[str])
    vars: set[str] = field(default_factory=set[str])
    ops: set[str] = field(default_factory=set[str])
    modules: set[str] = field(default_factory=set[str])
    groups: set[str] = field(default_factory=set[str])


class Base:
    """The verifier's state: problems found, var bounds, sizes, references seen."""

    def __init__(self, manifest: Manifest) -> None:
        self.m = manifest
        self.problems: list[ManifestVerify] = []
        self.bounds = manifest.var_bounds
        self.vmax = manifest.var_max
        self.groups = dict(manifest.topology.groups) if manifest.topology else {}
        self.use = Use()
        self.sizes: dict[str, int] = {}
        self.ops: dict[str, OpInfo] = {}
        self.written: set[str] = set()
        self.extents: dict[str, int | None] = {}
        self.fills: dict[str, str] = {}
        self.carveouts: dict[tuple[str, str], tuple[int, str]] = {}
        self.roots: dict[Root, int] = {}
        self.follows: dict[Root, int] = {}

    def err(self, pointer: str, message: str, hint: str) -> None:
        self.problems.append(ManifestVerify(pointer, message, hint))

    def root(self, cause: Root, pointer: str, message: str, hint: str) -> None:
        """Reports a problem that later ones follow from; `follow(cause)` counts those."""
        self.roots[cause] = len(self.problems)
        self.err(pointer, message, hint)

    def follow(self, cause: Root) -> None:
        self.follows[cause] = self.follows.get(cause, 0) + 1

    def followed(self, cause: Root) -> bool:
        """True, counted as following, when `cause` was reported as a root."""
        if cause not in self.roots:
            return False
        self.follow(cause)
        return True

    def folded(self) -> list[ManifestVerify]:
        """The problems, each root carrying the count of the problems that follow from it."""
        out = list(self.problems)
        for cause, n in self.follows.items():
            i = self.roots[cause]
            p = out[i]
            out[i] = ManifestVerify(p.pointer, p.message, p.hint, n)
        return out

    def broken_var(self, names: Iterable[str]) -> Root | None:
        """The first var of `names` whose bounds are broken (max < 1), as a root cause."""
        return next((("var", n) for n in sorted(names) if ("var", n) in self.roots), None)

    def known(self, expr: Expr, at: str) -> bool:
        """Marks the expression's vars used; reports undeclared ones."""
        self.use.vars |= expr.vars
        missing = expr.vars - self.bounds.keys()
        for name in sorted(missing):
            self.err(
                at,
                f"unknown var {short(name)!r}",
                f"declare it under /vars (declared: {names(self.bounds)})",
            )
        return not missing

    def range(
        self, expr: Expr, at: str, bounds: Mapping[str, tuple[int, int]] | None = None
    ) -> tuple[int, int] | None:
        if not self.known(expr, at):
            return None
        cause = self.broken_var(expr.vars)
        if cause is not None:
            self.follow(cause)
            return None
        try:
            return expr.range(bounds or self.bounds)
        except ExprError as exc:
            self.err(at, exc.message, exc.hint)
            return None

    def at_max(self, expr: Expr) -> int | None:
        """The value at the vars' maxima; None where it has none (unknown or broken vars, a zero
        divisor): the check that ranges the expression reports those."""
        if expr.vars - self.vmax.keys() or self.broken_var(expr.vars) is not None:
            return None
        try:
            return expr.eval(self.vmax)
        except ExprError:
            return None

    def fits(
        self, expr: Expr, dtype: str, at: str, bounds: Mapping[str, tuple[int, int]] | None = None
    ) -> None:
        span = self.range(expr, at, bounds)
        lo, hi = INT_RANGE[dtype]
        if span is not None and (span[0] < lo or span[1] > hi):
            self.err(
                at,
                f"value range {span[0]}..{span[1]} exceeds {dtype} range",
                f"keep it within {lo}..{hi}",
            )

    def var_ref(self, name: str, at: str) -> bool:
        self.use.vars.add(name)
        if name not in self.bounds:
            self.err(
                at,
                f"unknown var {short(name)!r}",
                f"declare it under /vars (declared: {names(self.bounds)})",
            )
            return False
        return True

    def group_ref(self, name: str, at: str) -> bool:
        self.use.groups.add(name)
        if name not in self.groups:
            self.err(
                at,
                f"unknown group {short(name)!r}",
                f"declare it under /topology/groups (declared: {names(self.groups)})",
            )
            return False
        return True

    def scalar_arg(
        self,
        arg: LaunchArg | object,
        param: ParamType,
        at: str,
        bounds: Mapping[str, tuple[int, int]],
    ) -> None:
        kind = scalar_kind(arg)
        if param.kind != "scalar":
            self.err(
                at,
                f"{kind} arg for a `{param}` slot",
                "pass a buffer, state or pack as the param type says",
            )
            return
        dtype = param.dtype or ""
        if isinstance(arg, I32Arg | I64Arg | U8Arg | F32Arg):
            if kind != dtype:
                self.err(at, f"{kind} literal for a `{dtype}` param", f'write {{"{dtype}": ...}}')
                return
            self.literal(arg, f"{at}/{kind}")
        elif isinstance(arg, VarArg | ExprArg):
            self.integer_value(arg, dtype, at, bounds)
        elif isinstance(arg, RankArg):
            self.group_ref(arg.rank, at + "/rank")
            if dtype not in ("i32", "i64"):
                self.err(at, f"rank for a `{dtype}` param", "rank args feed i32 or i64 params")

    def integer_value(
        self, arg: VarArg | ExprArg, dtype: str, at: str, bounds: Mapping[str, tuple[int, int]]
    ) -> None:
        if dtype not in INT_RANGE:
            self.err(
                at,
                f"{'var' if isinstance(arg, VarArg) else 'expr'} arg for a `{dtype}` param",
                "var and expr args feed i32, i64 or u8 params",
            )
            return
        if isinstance(arg, VarArg):
            if self.var_ref(arg.var, at + "/var"):
                self.fits(Expr.of(arg.var), dtype, at + "/var", bounds)
        else:
            self.fits(arg.expr, dtype, at + "/expr", bounds)

    def literal(self, arg: I32Arg | I64Arg | U8Arg | F32Arg, at: str) -> None:
        if isinstance(arg, F32Arg):
            if not math.isfinite(arg.f32) or abs(arg.f32) > F32_MAX:
                self.err(at, f"{arg.f32} does not fit f32", "use a finite value within f32 range")
            return
        kind = scalar_kind(arg)
        value: int = getattr(arg, kind)
        lo, hi = INT_RANGE[kind]
        if not lo <= value <= hi:
            self.err(at, f"{value} does not fit {kind}", f"keep it within {lo}..{hi}")

    def shape(self, dims: Sequence[Expr], dtype: str, at: str) -> int | None:
        ok = True
        for i, dim in enumerate(dims):
            span = self.range(dim, f"{at}/{i}")
            if span is None:
                ok = False
            elif span[0] < 1:
                self.err(
                    f"{at}/{i}",
                    f"dim can be {span[0]}",
                    "every dim must be >= 1 at the vars' minimum",
                )
                ok = False
        if not ok:
            return None
        nbytes = math.prod(d.eval(self.vmax) for d in dims) * DTYPE_BYTES[dtype]
        if nbytes > MAX_BUFFER_BYTES:
            self.err(
                at,
                f"{nbytes} bytes at the vars' maxima, over the {MAX_BUFFER_BYTES} (1 TiB) a buffer may take",
                "lower the var maxima or the dims",
            )
            return None
        return nbytes
