"""Compiling a program at given var values into executable steps (launch records, GEMMs).

Everything here runs once per (program, vars key): expressions are evaluated, `when` ranges pick
launches, args are staged as u64 slots, tensormaps are encoded, GEMM plans resolved. A step is
then one driver or cuBLASLt call.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from kern_manifest.expr import Expr
from kern_manifest.schema import (
    BufArg,
    Call,
    ExprArg,
    ExternLaunch,
    F32Arg,
    I32Arg,
    I64Arg,
    KernelLaunch,
    Manifest,
    Op,
    PackArg,
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
    ParamArg,
    ParamType,
    RankArg,
    ScratchArg,
    StateArg,
    Tensormap,
    U8Arg,
    VarArg,
)

from . import _driver as drv
from . import nccl
from .blas import Blas, GemmShape
from .errors import ManifestUnsupportedError
from .launch import ArgBlock, KernelRecord, encode_value, pack_bytes

__all__ = ["ProgramTemplate", "Resources", "Step", "Value", "call_value", "compile_program", "gemm_operands",
           "gemm_shape", "gemm_sizes_at"]

_TMAP_BYTES = {"u8": 1, "u16": 2, "u32": 4, "i32": 4, "u64": 8, "i64": 8, "f16": 2, "bf16": 2,
               "f32": 4, "tf32": 4, "u4": 1, "u4packed": 1}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Value:
    """A resolved call arg: a pointer (with the bytes left past it) or a scalar."""

    ptr: int | None = None
    room: int = 0
    scalar: int | float | None = None


@dataclass(frozen=True, slots=True)
class Resources:
    """What compilation reads from the runtime: addresses, functions, BLAS, ranks."""

    manifest: Manifest
    buffers: Mapping[str, tuple[int, int]]  # name -> (ptr, bytes)
    states: Mapping[str, tuple[int, int]]
    scratch: Mapping[str, Mapping[str, int]]  # op -> scratch name -> ptr
    funcs: Mapping[tuple[str, int], Any]  # (op, launch index) -> CUfunction
    blas: Blas | None
    ranks: Mapping[str, int]
    stream: Any
    comms: Mapping[str, nccl.Communicator] = field(default_factory=dict[str, nccl.Communicator])


@dataclass(frozen=True, slots=True)
class Step:
    """One executable step: call position, label, and the action on the stream."""

    position: int
    label: str
    run: Callable[[], None]
    algo: Mapping[str, int] | None = None


@cache
def _by_position(n: int) -> tuple[ParamArg, ...]:
    """The args of a launch that names none: its op's params in order."""
    return tuple(ParamArg(param=i) for i in range(n))


def call_value(res: Resources, arg: object, env: Mapping[str, int], where: str) -> Value:
    if isinstance(arg, BufArg | StateArg):
        table = res.buffers if isinstance(arg, BufArg) else res.states
        name = arg.buf if isinstance(arg, BufArg) else arg.state
        if name not in table:
            raise ManifestUnsupportedError(f"{where}: {name!r} has no memory in this runtime (peer or unloaded source)")
        ptr, size = table[name]
        off = arg.offset.eval(env)
        return Value(ptr=ptr + off, room=size - off)
    if isinstance(arg, VarArg):
        return Value(scalar=env[arg.var])
    if isinstance(arg, ExprArg):
        return Value(scalar=arg.expr.eval(env))
    if isinstance(arg, I32Arg | I64Arg | U8Arg | F32Arg):
        return Value(scalar=_literal(arg))
    if isinstance(arg, RankArg):
        return Value(scalar=res.ranks.get(arg.rank, 0))
    raise ManifestUnsupportedError(f"{where}: unsupported call arg {arg!r}")


def _literal(arg: I32Arg | I64Arg | U8Arg | F32Arg) -> int | float:
    if isinstance(arg, I32Arg):
        return arg.i32
    if isinstance(arg, I64Arg):
        return arg.i64
    if isinstance(arg, U8Arg):
        return arg.u8
    return arg.f32


def _encode(ptype: ParamType, v: Value, where: str) -> bytes:
    if ptype.is_pointer:
        if v.ptr is None:
            raise ManifestUnsupportedError(f"{where}: pointer param got a scalar")
        return encode_value("ptr", v.ptr, where)
    if ptype.kind == "bytes":
        raise ManifestUnsupportedError(f"{where}: bytes<{ptype.size}> param needs a pack arg")
    if v.scalar is None:
        raise ManifestUnsupportedError(f"{where}: scalar param got a pointer")
    return encode_value(str(ptype.dtype), v.scalar, where)


class _Compiler:
    def __init__(self, res: Resources, program: str, env: Mapping[str, int]) -> None:
        self.res = res
        self.program = program
        self.env = env

    def call(self, position: int, call: Call) -> list[Step]:
        op = self.res.manifest.ops[call.op]
        label = call.label or call.op
        where = f"program {self.program!r} call {position} ({label})"
        values = [call_value(self.res, a, self.env, where) for a in call.args]
        steps: list[Step] = []
        for li, launch in enumerate(op.impl.launches):
            if launch.when is not None and not _inside(launch.when, self.env):
                continue
            lw = f"{where} launch {li}"
            if isinstance(launch, ExternLaunch):
                run, algo = self.extern(call.op, launch, values, lw)
                steps.append(Step(position, label, run, algo))
            else:
                rec = self.kernel(call.op, li, launch, op, values, lw, label)
                steps.append(Step(position, label, _launcher(rec, self.res.stream)))
        return steps

    def arg_bytes(self, op_name: str, op: Op, arg: object, ptype: ParamType, values: Sequence[Value], where: str) -> bytes:
        if isinstance(arg, ParamArg):
            return _encode(ptype, values[arg.param], where)
        if isinstance(arg, ScratchArg):
            return encode_value("ptr", self.res.scratch[op_name][arg.scratch], where)
        if isinstance(arg, I32Arg | I64Arg | U8Arg | F32Arg):
            return _encode(ptype, Value(scalar=_literal(arg)), where)
        if isinstance(arg, VarArg):
            return _encode(ptype, Value(scalar=self.env[arg.var]), where)
        if isinstance(arg, ExprArg):
            return _encode(ptype, Value(scalar=arg.expr.eval(self.env)), where)
        if isinstance(arg, RankArg):
            return _encode(ptype, Value(scalar=self.res.ranks.get(arg.rank, 0)), where)
        if isinstance(arg, PackArg):
            fields = [self._field(op_name, op, f, values, where) for f in arg.pack.fields]
            return pack_bytes(arg.pack.size, fields, where)
        raise ManifestUnsupportedError(f"{where}: unsupported launch arg {arg!r}")

    def _field(self, op_name: str, op: Op, f: object, values: Sequence[Value], where: str) -> tuple[int, bytes]:
        if isinstance(f, PackTensormap):
            return f.at, self.tensormap(f.tensormap, values, where)
        at: int = f.at  # type: ignore[attr-defined]
        width: int | None = f.width  # type: ignore[attr-defined]
        if isinstance(f, PackParam):
            v = values[f.param]
            ptype = op.params[f.param]
            if v.ptr is not None:
                return at, _width(v.ptr, width or 8, False, where)
            if ptype.dtype == "f32":
                return at, struct.pack("<f", float(v.scalar or 0.0))
            return at, _width(int(v.scalar or 0), width or ptype.size, True, where)
        if isinstance(f, PackScratch):
            return at, _width(self.res.scratch[op_name][f.scratch], width or 8, False, where)
        if isinstance(f, PackF32):
            return at, struct.pack("<f", f.f32)
        if isinstance(f, PackI32 | PackI64 | PackU8):
            default = 4 if isinstance(f, PackI32) else 8 if isinstance(f, PackI64) else 1
            return at, _width(int(_literal(f)), width or default, True, where)
        if isinstance(f, PackVar):
            return at, _width(self.env[f.var], width or 4, True, where)
        if isinstance(f, PackExpr):
            return at, _width(f.expr.eval(self.env), width or 4, True, where)
        if isinstance(f, PackRank):
            return at, _width(self.res.ranks.get(f.rank, 0), width or 4, True, where)
        raise ManifestUnsupportedError(f"{where}: unsupported pack field {f!r}")

    def tensormap(self, t: Tensormap, values: Sequence[Value], where: str) -> bytes:
        v = values[t.param]
        if v.ptr is None:
            raise ManifestUnsupportedError(f"{where}: tensormap param {t.param} is not a pointer")
        dims = [d.eval(self.env) for d in t.dims]
        strides = [s.eval(self.env) for s in t.strides]
        if dims and dims[-1] == 0:
            outer = strides[-1] if strides else _TMAP_BYTES[t.dtype]
            dims[-1] = max(1, v.room // outer)
        return drv.tensormap_encode_tiled(t.dtype, v.ptr, dims, strides, list(t.box), t.swizzle, t.l2_promotion, t.oob_nan)

    def kernel(
        self, op_name: str, li: int, launch: KernelLaunch, op: Op, values: Sequence[Value], where: str, label: str
    ) -> KernelRecord:
        params = launch.params if launch.params is not None else op.params
        args = launch.args if launch.args is not None else _by_position(len(params))
        raw = [self.arg_bytes(op_name, op, a, p, values, f"{where} arg {i}") for i, (a, p) in enumerate(zip(args, params, strict=True))]
        grid = (launch.grid[0].eval(self.env), launch.grid[1].eval(self.env), launch.grid[2].eval(self.env))
        smem = launch.shared_mem.eval(self.env)
        block = (launch.block[0], launch.block[1], launch.block[2])
        config = None
        if launch.cluster is not None or launch.pdl:
            config = drv.launch_config(grid, block, smem, self.res.stream, launch.cluster, launch.pdl)
        return KernelRecord(self.res.funcs[(op_name, li)], grid, block, smem, ArgBlock(raw), config, label)

    def extern(
        self, op: str, launch: ExternLaunch, values: Sequence[Value], where: str
    ) -> tuple[Callable[[], None], Mapping[str, int] | None]:
        if launch.signature.collective:
            return self.collective(op, launch, values, where), None
        gemm = self.gemm(op, launch, values, where)
        return gemm.run, gemm.blas.describe(gemm.plan)

    def gemm(self, op: str, launch: ExternLaunch, values: Sequence[Value], where: str) -> _Gemm:
        blas = self.res.blas
        if blas is None or not launch.entry.startswith("extern:cubl"):
            raise ManifestUnsupportedError(f"{where}: {launch.entry} is not available in this runtime")
        args = launch.args if launch.args is not None else _by_position(len(values))
        vals = [self.extern_value(op, a, values, where) for a in args]
        (a, w, c), shape, scales = gemm_operands(launch.entry, vals, where)
        return _Gemm(blas, shape, blas.plan(shape, _algo_tuple(launch), scales), a, w, c, int(self.res.stream))

    def collective(self, op: str, launch: ExternLaunch, values: Sequence[Value], where: str) -> Callable[[], None]:
        args = launch.args or ()
        group = args[-1].rank if args and isinstance(args[-1], RankArg) else ""
        comm = self.res.comms.get(group)
        if comm is None:
            raise ManifestUnsupportedError(f"{where}: group {group!r} has no communicator (connect first)")
        send, recv, count = (self.extern_value(op, a, values, where) for a in args[:3])
        if send.ptr is None or recv.ptr is None or count.scalar is None:
            raise ManifestUnsupportedError(f"{where}: {launch.entry} takes send and recv buffers and a count")
        n = int(count.scalar)
        want_send, want_recv = nccl.collective_bytes(launch.entry, n, comm.size)
        size = 4 if launch.entry.endswith("_f32") else 2
        if want_send * size > send.room or want_recv * size > recv.room:
            raise ManifestUnsupportedError(
                f"{where}: {launch.entry} of {n} per rank over {comm.size} ranks needs {want_send * size} send and "
                f"{want_recv * size} recv bytes, the buffers hold {send.room} and {recv.room}")
        return nccl.collective(launch.entry, comm, send.ptr, recv.ptr, n, self.res.stream)

    def extern_value(self, op: str, arg: object, values: Sequence[Value], where: str) -> Value:
        """An extern launch's arg of op `op` (a scratch buffer: its pointer and allocated bytes)."""
        if isinstance(arg, ParamArg):
            return values[arg.param]
        if isinstance(arg, ScratchArg):
            spec = self.res.manifest.ops[op].impl.scratch[arg.scratch]
            return Value(ptr=self.res.scratch[op][arg.scratch], room=spec.nbytes(self.res.manifest.var_max))
        if isinstance(arg, I32Arg | I64Arg | U8Arg | F32Arg):
            return Value(scalar=_literal(arg))
        if isinstance(arg, VarArg):
            return Value(scalar=self.env[arg.var])
        if isinstance(arg, ExprArg):
            return Value(scalar=arg.expr.eval(self.env))
        raise ManifestUnsupportedError(f"{where}: unsupported extern arg {arg!r}")


@dataclass(frozen=True, slots=True)
class _Gemm:
    """One resolved extern GEMM: its plan and pointers; `run` is the step's action."""

    blas: Blas
    shape: GemmShape
    plan: Any
    a: int
    w: int
    c: int
    stream: int

    def run(self) -> None:
        self.blas.matmul(self.plan, self.a, self.w, self.c, self.stream)


def _algo_tuple(launch: ExternLaunch) -> tuple[int, ...] | None:
    a = launch.algo
    if a is None:
        return None
    return (a.id, a.tile, a.split_k, a.reduction, a.swizzle, a.custom, a.stages, a.inner_shape, a.cluster_shape)


_BF16_GEMMS = ("extern:cublaslt_bf16_tn", "extern:cublaslt_bf16_tn_acc", "extern:cublas_bf16_tn_f32")
_FP8_GEMMS = ("extern:cublaslt_fp8_tn", "extern:cublaslt_fp8_tn_f32")


def gemm_sizes_at(entry: str) -> int:
    """Where an extern GEMM's sizes [m, n, k, ...] start in its args: after a, w, c (and an fp8
    GEMM's two scales)."""
    return 5 if entry in _FP8_GEMMS else 3


def gemm_shape(entry: str, scalars: Sequence[int], where: str = "") -> GemmShape:
    """The GemmShape of an extern GEMM from its size args [m, n, k, ldc?, lda?] (an fp8 GEMM's:
    [m, n, k, ldc?])."""
    if entry not in _BF16_GEMMS + _FP8_GEMMS:
        raise ManifestUnsupportedError(f"{where}: {entry} is not supported by this runtime")
    if len(scalars) < 3:
        raise ManifestUnsupportedError(f"{where}: {entry} needs m, n, k")
    m, n, k = scalars[:3]
    fp8 = entry in _FP8_GEMMS
    ldc = scalars[3] if len(scalars) > 3 else n
    lda = scalars[4] if len(scalars) > 4 and not fp8 else k
    return GemmShape(m, n, k, ldc, lda, entry.endswith("_f32"), entry.endswith("_acc"), fp8)


def gemm_operands(entry: str, vals: Sequence[Value], where: str) -> tuple[tuple[int, int, int], GemmShape, tuple[int, int] | None]:
    """An extern GEMM's (a, w, c) pointers, its shape, and an fp8 GEMM's (A scale, W scale)
    pointers from its resolved args.

    Raises:
        ManifestUnsupportedError: a, w, c or a scale is not a buffer, a scale holds less than one
            f32, or the entry is not a GEMM this runtime runs.
    """
    a, w, c = (vals[i].ptr for i in range(3))
    if a is None or w is None or c is None:
        raise ManifestUnsupportedError(f"{where}: GEMM a/w/c must be buffers")
    first = gemm_sizes_at(entry)
    shape = gemm_shape(entry, [int(v.scalar or 0) for v in vals[first:]], where)
    if not shape.fp8:
        return (a, w, c), shape, None
    a_scale, w_scale = vals[3], vals[4]
    if a_scale.ptr is None or w_scale.ptr is None or min(a_scale.room, w_scale.room) < 4:
        raise ManifestUnsupportedError(f"{where}: {entry} takes its A and W scales as one-element f32 buffers")
    return (a, w, c), shape, (a_scale.ptr, w_scale.ptr)


def _width(value: int, width: int, signed: bool, where: str) -> bytes:
    try:
        return value.to_bytes(width, "little", signed=signed and value < 0)
    except OverflowError:
        raise ManifestUnsupportedError(f"{where}: pack value {value} does not fit {width} bytes") from None


def _inside(when: Any, env: Mapping[str, int]) -> bool:
    v = env[when.var]
    return (when.min is None or v >= when.min) and (when.max is None or v <= when.max)


class _Launch:
    """A bound kernel launch; holds its record so the staged args outlive every replay."""

    __slots__ = ("record", "stream")

    def __init__(self, record: KernelRecord, stream: Any) -> None:
        self.record = record
        self.stream = stream

    def __call__(self) -> None:
        r = self.record
        if r.config is not None:
            drv.launch_ex(r.config, r.func, r.args.address)
        else:
            drv.launch(r.func, r.grid, r.block, r.smem, self.stream, r.args.address)


def _launcher(rec: KernelRecord, stream: Any) -> Callable[[], None]:
    return _Launch(rec, stream)


def compile_program(res: Resources, program: str, env: Mapping[str, int]) -> list[Step]:
    """Steps for every call of `program` at var values `env`."""
    comp = _Compiler(res, program, env)
    steps: list[Step] = []
    for position, call in enumerate(res.manifest.programs[program].calls):
        steps.extend(comp.call(position, call))
    return steps


# -- templates: a program staged once, compiled per var key by patching what reads vars ----------


class _Restage(Exception):
    """A var key the template cannot stage exactly; the plain compile runs instead."""


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """Everything a template read from `Resources`, copied (the runtime's tables are mutable)."""

    manifest: Manifest
    buffers: dict[str, tuple[int, int]]
    states: dict[str, tuple[int, int]]
    scratch: dict[str, dict[str, int]]
    funcs: dict[tuple[str, int], Any]
    blas: Blas | None
    ranks: dict[str, int]
    stream: Any
    comms: dict[str, nccl.Communicator]


def _snapshot(res: Resources) -> _Snapshot:
    return _Snapshot(
        res.manifest, dict(res.buffers), dict(res.states), {k: dict(v) for k, v in res.scratch.items()},
        dict(res.funcs), res.blas, dict(res.ranks), res.stream, dict(res.comms),
    )  # fmt: skip


def _fixed_value(arg: object) -> bool:
    """Whether a call arg's value reads no var."""
    if isinstance(arg, BufArg | StateArg):
        return arg.offset.const is not None
    if isinstance(arg, ExprArg):
        return arg.expr.const is not None
    return isinstance(arg, I32Arg | I64Arg | U8Arg | F32Arg | RankArg)


def _fixed_field(f: object, moving: frozenset[int]) -> bool:
    if isinstance(f, PackParam):
        return f.param not in moving
    if isinstance(f, PackExpr):
        return f.expr.const is not None
    return isinstance(f, PackScratch | PackF32 | PackI32 | PackI64 | PackU8 | PackRank)


def _fixed_arg(arg: object, moving: frozenset[int]) -> bool:
    """Whether a launch arg's bytes read no var (`moving`: the call values that do)."""
    if isinstance(arg, ParamArg):
        return arg.param not in moving
    if isinstance(arg, ExprArg):
        return arg.expr.const is not None
    if isinstance(arg, PackArg):
        return all(_fixed_field(f, moving) for f in arg.pack.fields)
    return isinstance(arg, ScratchArg | I32Arg | I64Arg | U8Arg | F32Arg | RankArg)


def _slot(n: int) -> int:
    return -(-max(n, 1) // 8) * 8


_SCALAR_FORMATS = {"i32": "<i", "i64": "<q", "u8": "<B", "f32": "<f"}


@dataclass(frozen=True, slots=True)
class _Patch:
    """A launch arg that reads vars: where its bytes go in the program's slot image, and how to
    make them (`expr` and `fmt` for a var or expression scalar, else the plain encoder)."""

    pos: int
    size: int
    arg: object
    ptype: ParamType
    where: str
    expr: Any  # Expr | None
    fmt: str | None

    def write(
        self, comp: _Compiler, op_name: str, op: Op, values: Sequence[Value], data: bytearray
    ) -> None:
        if self.fmt is not None:
            v = self.expr.eval(comp.env)
            try:
                struct.pack_into(self.fmt, data, self.pos, float(v) if self.fmt == "<f" else v)
            except struct.error:
                raise _Restage from None
            return
        raw = comp.arg_bytes(op_name, op, self.arg, self.ptype, values, self.where)
        if len(raw) != self.size:
            raise _Restage
        data[self.pos : self.pos + self.size] = raw


def _patch(pos: int, arg: object, ptype: ParamType, where: str) -> _Patch:
    size = arg.pack.size if isinstance(arg, PackArg) else ptype.size
    expr = (
        Expr.of(arg.var)
        if isinstance(arg, VarArg)
        else arg.expr
        if isinstance(arg, ExprArg)
        else None
    )
    fmt = None
    if expr is not None and not ptype.is_pointer and ptype.kind != "bytes":
        fmt = _SCALAR_FORMATS.get(str(ptype.dtype))
        if fmt is not None and struct.calcsize(fmt) != size:
            fmt = None
    return _Patch(pos, size, arg, ptype, where, expr, fmt)


class _Layout:
    """The slot image of every launch of a program that reads vars, built once (a key copies it
    into one array and each record's ArgBlock views its slice), and the algo of every GEMM plan
    the program's steps hold, described once per plan."""

    def __init__(self) -> None:
        self.image = bytearray()
        self.offsets: list[int] = []
        self.described: dict[int, tuple[Any, Mapping[str, int]]] = {}  # id(plan) -> (plan, algo)


@dataclass(frozen=True, slots=True)
class _Staged:
    """A compile's copy of the layout: the bytes (patched in place) and every slot's address."""

    data: bytearray
    array: npt.NDArray[np.uint8]
    ptrs: npt.NDArray[np.uint64]


class _KernelTemplate:
    """One kernel launch staged once: the whole step when nothing reads vars, else its slot image
    with every var-free arg encoded, the args that read vars, and its geometry."""

    __slots__ = ("block", "call", "cluster", "dstart", "func", "grid", "launch", "nargs", "nbytes",
                 "patches", "position", "pstart", "smem", "step", "when")  # fmt: skip

    def __init__(
        self,
        comp: _Compiler,
        position: int,
        call: _CallTemplate,
        li: int,
        layout: _Layout,
        where: str,
    ) -> None:
        op = call.opdef
        launch = op.impl.launches[li]
        assert isinstance(launch, KernelLaunch)
        self.position, self.call, self.launch, self.when = position, call, launch, launch.when
        self.func = comp.res.funcs[(call.op, li)]
        self.block = (launch.block[0], launch.block[1], launch.block[2])
        g0, g1, g2 = (g.const for g in launch.grid)
        self.grid = (g0, g1, g2) if g0 is not None and g1 is not None and g2 is not None else None
        self.smem = launch.shared_mem.const
        self.cluster = launch.cluster is not None or launch.pdl
        params = launch.params if launch.params is not None else op.params
        args = launch.args if launch.args is not None else _by_position(len(params))
        pairs: list[tuple[object, ParamType]] = list(zip(args, params, strict=True))
        self.step: Step | None = None
        self.patches: tuple[_Patch, ...] = ()
        self.dstart = self.pstart = self.nargs = self.nbytes = 0
        if (
            self.grid is not None
            and self.smem is not None
            and all(_fixed_arg(a, call.moving) for a, _ in pairs)
        ):
            rec = comp.kernel(call.op, li, launch, op, call.values, where, call.label)
            self.step = Step(position, call.label, _launcher(rec, comp.res.stream))
            return
        self._lay(comp, pairs, layout, where)

    def _lay(
        self, comp: _Compiler, pairs: list[tuple[object, ParamType]], layout: _Layout, where: str
    ) -> None:
        image = layout.image
        self.dstart, self.pstart, self.nargs = len(image), len(layout.offsets), len(pairs)
        patches: list[_Patch] = []
        for i, (a, p) in enumerate(pairs):
            aw = f"{where} arg {i}"
            layout.offsets.append(len(image))
            if _fixed_arg(a, self.call.moving):
                raw = comp.arg_bytes(self.call.op, self.call.opdef, a, p, self.call.values, aw)
                image += raw + bytes(_slot(len(raw)) - len(raw))
            else:
                patch = _patch(len(image), a, p, aw)
                patches.append(patch)
                image += bytes(_slot(patch.size))
        self.nbytes = len(image) - self.dstart
        image += bytes(max(8 - self.nbytes, 0))
        self.patches = tuple(patches)

    def make(self, comp: _Compiler, values: Sequence[Value], staged: _Staged) -> Step:
        if self.step is not None:
            return self.step
        env = comp.env
        for p in self.patches:
            p.write(comp, self.call.op, self.call.opdef, values, staged.data)
        g = self.launch.grid
        grid = (
            self.grid if self.grid is not None else (g[0].eval(env), g[1].eval(env), g[2].eval(env))
        )
        smem = self.smem if self.smem is not None else self.launch.shared_mem.eval(env)
        config = None
        if self.cluster:
            config = drv.launch_config(
                grid, self.block, smem, comp.res.stream, self.launch.cluster, self.launch.pdl
            )
        d0, p0 = self.dstart, self.pstart
        data = staged.array[d0 : d0 + max(self.nbytes, 8)]
        ptrs = staged.ptrs[p0 : p0 + self.nargs] if self.nargs else np.zeros(1, dtype=np.uint64)
        rec = KernelRecord(
            self.func,
            grid,
            self.block,
            smem,
            ArgBlock.view(data, ptrs, self.nbytes),
            config,
            self.call.label,
        )
        return Step(self.position, self.call.label, _launcher(rec, comp.res.stream))


class _ExternTemplate:
    """One extern launch: a GEMM that reads no var is one step for every key; otherwise its
    var-free args are resolved once and the rest per key (the BLAS caches plans by shape), each
    plan's algo described once for the whole program. Collectives resolve per key."""

    __slots__ = ("algo", "args", "call", "described", "fixed", "launch", "moving", "position", "step", "when", "where")

    def __init__(self, comp: _Compiler, position: int, call: _CallTemplate, li: int, layout: _Layout, where: str) -> None:
        launch = call.opdef.impl.launches[li]
        assert isinstance(launch, ExternLaunch)
        self.position, self.call, self.launch, self.when, self.where = position, call, launch, launch.when, where
        self.described = layout.described
        self.step: Step | None = None
        self.algo = _algo_tuple(launch)
        self.args = launch.args if launch.args is not None else _by_position(len(call.values))
        self.moving: tuple[int, ...] = ()
        self.fixed: list[Value] = []
        if launch.signature.collective:
            return
        self.moving = tuple(i for i, a in enumerate(self.args) if not _fixed_arg(a, call.moving))
        self.fixed = [Value() if i in self.moving else comp.extern_value(call.op, a, call.values, where)
                      for i, a in enumerate(self.args)]
        if not self.moving:
            self.step = self.make(comp, call.values, None)

    def make(self, comp: _Compiler, values: Sequence[Value], staged: _Staged | None) -> Step:
        if self.step is not None:
            return self.step
        if self.launch.signature.collective:
            return Step(self.position, self.call.label, comp.collective(self.call.op, self.launch, values, self.where),
                        None)
        blas = comp.res.blas
        if blas is None or not self.launch.entry.startswith("extern:cubl") or len(self.fixed) < 3:
            raise _Restage
        vals = self.fixed
        if self.moving:
            vals = list(vals)
            for i in self.moving:
                vals[i] = comp.extern_value(self.call.op, self.args[i], values, self.where)
        if vals[0].ptr is None or vals[1].ptr is None or vals[2].ptr is None:
            raise _Restage
        (a, w, c), shape, scales = gemm_operands(self.launch.entry, vals, self.where)
        plan = blas.plan(shape, self.algo, scales)
        seen = self.described.get(id(plan))
        if seen is None or seen[0] is not plan:
            seen = (plan, blas.describe(plan))
            self.described[id(plan)] = seen
        return Step(self.position, self.call.label, _Gemm(blas, shape, plan, a, w, c, int(comp.res.stream)).run, seen[1])


class _CallTemplate:
    """One call: its var-free values resolved once, and a template per launch."""

    __slots__ = ("label", "launches", "moving", "op", "opdef", "values", "where")

    def __init__(self, comp: _Compiler, position: int, call: Call, layout: _Layout) -> None:
        self.op = call.op
        self.opdef = comp.res.manifest.ops[call.op]
        self.label = call.label or call.op
        self.where = f"program {comp.program!r} call {position} ({self.label})"
        self.moving: frozenset[int] = frozenset(
            i for i, a in enumerate(call.args) if not _fixed_value(a)
        )
        self.values = [
            Value() if i in self.moving else call_value(comp.res, a, {}, self.where)
            for i, a in enumerate(call.args)
        ]
        self.launches: list[_KernelTemplate | _ExternTemplate] = []
        for li, launch in enumerate(self.opdef.impl.launches):
            kind = _ExternTemplate if isinstance(launch, ExternLaunch) else _KernelTemplate
            self.launches.append(
                kind(comp, position, self, li, layout, f"{self.where} launch {li}")
            )

    def steps(
        self, comp: _Compiler, args: Sequence[object], staged: _Staged, out: list[Step]
    ) -> None:
        values = self.values
        if self.moving:
            values = list(values)
            for i in self.moving:
                values[i] = call_value(comp.res, args[i], comp.env, self.where)
        env = comp.env
        for t in self.launches:
            if t.when is None or _inside(t.when, env):
                out.append(t.make(comp, values, staged))


class ProgramTemplate:
    """A program staged once for compiling at many var keys.

    Everything that reads no var (call values, encoded arg bytes, geometry, whole launches and
    GEMMs) is resolved when the template is built, and the slot bytes of every launch that reads
    vars lie in one image; `compile` copies that image once, evaluates only the expressions that
    read vars and patches their bytes. Its steps are those `compile_program` makes at the same
    key; a program the template cannot build, or a key it cannot stage exactly (every error
    among them), takes the plain compile, which raises what it always raised.
    """

    def __init__(self, res: Resources, program: str) -> None:
        self.program = program
        self.snapshot = _snapshot(res)
        comp = _Compiler(res, program, {})
        layout = _Layout()
        calls = res.manifest.programs[program].calls
        try:
            built = [(_CallTemplate(comp, i, c, layout), c.args) for i, c in enumerate(calls)]
        except Exception:  # any failure: the plain compile reports it at every key
            built = None
        self._calls = built
        self._image = bytes(layout.image)
        self._offsets = np.array(layout.offsets, dtype=np.uint64)

    def fits(self, res: Resources) -> bool:
        """Whether `res` holds what this template was built from (addresses, functions, ...)."""
        return _snapshot(res) == self.snapshot

    def compile(self, res: Resources, env: Mapping[str, int]) -> list[Step]:
        """The steps of the program at `env` (`res` must fit the template)."""
        if self._calls is None:
            return compile_program(res, self.program, env)
        comp = _Compiler(res, self.program, env)
        data = bytearray(self._image)
        array = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(0, dtype=np.uint8)
        staged = _Staged(data, array, self._offsets + np.uint64(array.ctypes.data))
        steps: list[Step] = []
        try:
            for call, args in self._calls:
                call.steps(comp, args, staged, steps)
        except Exception:  # the plain compile raises the error it always raised
            return compile_program(res, self.program, env)
        return steps
