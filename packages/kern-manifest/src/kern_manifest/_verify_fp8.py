"""Verifier checks of the fp8 GEMM externs: k is a multiple of 16 at every value a launch can
give it, and both scales are one f32 element (cuBLASLt's per-tensor scale pointers).

A slot the launch fills itself (a literal, var, expr or scratch) is checked at the launch; a slot
it forwards from the op's interface becomes a `SlotRule`, checked at every call of the op."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final, Literal

from kern_manifest._verify_base import Base, OpInfo, SlotRule
from kern_manifest.errors import ExprError, short
from kern_manifest.expr import Expr
from kern_manifest.schema import (
    BufArg,
    CallArg,
    ExprArg,
    ExternLaunch,
    I32Arg,
    LaunchArg,
    Op,
    ParamArg,
    ScratchArg,
    VarArg,
)

__all__ = ["FP8_EXTERNS", "FP8_K_MULTIPLE", "Fp8Checks"]

FP8_EXTERNS: Final = ("extern:cublaslt_fp8_tn", "extern:cublaslt_fp8_tn_f32")
FP8_K_MULTIPLE: Final = 16
_ROLES: Final[Mapping[int, Literal["k", "scale"]]] = {3: "scale", 4: "scale", 7: "k"}
_MAX_ENUMERATION: Final = 1 << 16
_K_HINT: Final = (
    f"fp8 GEMMs take k % {FP8_K_MULTIPLE} == 0 at every var value: "
    f"pass a multiple of {FP8_K_MULTIPLE}, or narrow the launch with when"
)

Bounds = Mapping[str, tuple[int, int]]


class Fp8Checks(Base):
    """The k and scale rules of the fp8 externs, at launches and at the calls that feed them."""

    def fp8_launch(self, op: Op, launch: ExternLaunch, at: str, info: OpInfo, bounds: Bounds) -> None:
        if launch.entry not in FP8_EXTERNS:
            return
        args: Sequence[LaunchArg] = (
            launch.args
            if launch.args is not None
            else tuple(ParamArg(param=i) for i in range(len(op.params)))
        )
        if len(args) <= max(_ROLES):
            return
        for slot, role in _ROLES.items():
            arg = args[slot]
            if isinstance(arg, ParamArg):
                if arg.param < len(op.params):
                    info.slot_rules.append(SlotRule(arg.param, role, launch.entry, bounds))
            elif role == "k":
                self.fp8_k(arg, f"{at}/args/{slot}", bounds)
            elif isinstance(arg, ScratchArg):
                self.fp8_scratch_scale(op, arg.scratch, f"{at}/args/{slot}", launch.entry)

    def fp8_call(self, args: Sequence[CallArg], info: OpInfo, at: str) -> None:
        for rule in info.slot_rules:
            arg = args[rule.param]
            aat = f"{at}/args/{rule.param}"
            if rule.role == "k":
                self.fp8_k(arg, aat, rule.bounds)
            elif isinstance(arg, BufArg):
                self.fp8_buffer_scale(arg.buf, aat, rule.entry)

    def fp8_k(self, arg: object, at: str, bounds: Bounds) -> None:
        if isinstance(arg, I32Arg):
            if arg.i32 % FP8_K_MULTIPLE:
                self.err(at, f"k = {arg.i32} is not a multiple of {FP8_K_MULTIPLE}", _K_HINT)
            return
        if isinstance(arg, VarArg):
            expr = Expr.of(arg.var)
        elif isinstance(arg, ExprArg):
            expr = arg.expr
        else:
            return
        bad = self.off_multiple(expr, bounds)
        if bad is not None:
            self.err(at, f"k {bad}, not always a multiple of {FP8_K_MULTIPLE}", _K_HINT)

    def off_multiple(self, expr: Expr, bounds: Bounds) -> str | None:
        """How `expr` over `bounds` misses a multiple of 16 ("can be 100", "ranges 1..64"); None
        where it never does, or where the expression has problems its own checks report."""
        if expr.divisor % FP8_K_MULTIPLE == 0:
            return None
        if expr.vars - bounds.keys() or self.broken_var(expr.vars) is not None:
            return None
        try:
            lo, hi = expr.range(bounds)
            if lo == hi:
                return None if lo % FP8_K_MULTIPLE == 0 else f"can be {lo}"
            if len(expr.vars) == 1 and _span(expr, bounds) <= _MAX_ENUMERATION:
                return _enumerate_off(expr, bounds)
        except ExprError:
            return None
        return f"ranges {lo}..{hi}"

    def fp8_buffer_scale(self, name: str, at: str, entry: str) -> None:
        buf = self.m.buffers.get(name)
        size = self.sizes.get(name)
        if buf is None or buf.dtype != "f32" or size is None or size == 4:
            return
        self.err(
            at,
            f"scale buffer {short(name)!r} holds {size // 4} f32 values",
            f"{entry} reads one f32 per scale: give the buffer shape [1]",
        )

    def fp8_scratch_scale(self, op: Op, name: str, at: str, entry: str) -> None:
        sc = op.impl.scratch.get(name)
        if sc is None or sc.dtype != "f32":
            return
        dims = [self.at_max(d) for d in sc.shape]
        if any(d is None for d in dims):
            return
        count = math.prod(d or 0 for d in dims)
        if count != 1:
            self.err(
                at,
                f"scale scratch {short(name)!r} holds {count} f32 values",
                f"{entry} reads one f32 per scale: give the scratch shape [1]",
            )


def _span(expr: Expr, bounds: Bounds) -> int:
    (var,) = expr.vars
    lo, hi = bounds[var]
    return hi - lo


def _enumerate_off(expr: Expr, bounds: Bounds) -> str | None:
    (var,) = expr.vars
    lo, hi = bounds[var]
    for v in range(lo, hi + 1):
        value = expr.eval({var: v})
        if value % FP8_K_MULTIPLE:
            return f"can be {value} ({var} = {v})"
    return None
