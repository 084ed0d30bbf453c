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

__all__ = ["Resources", "Step", "Value", "call_value", "compile_program", "gemm_shape"]

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
                run, algo = self.extern(launch, values, lw)
                steps.append(Step(position, label, run, algo))
            else:
                rec = self.kernel(call.op, li, launch, op, values, lw, label)
                steps.append(Step(position, label, _launcher(rec, self.res.stream)))
        return steps

    def _arg(self, op_name: str, op: Op, arg: object, ptype: ParamType, values: Sequence[Value], where: str) -> bytes:
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
        raw = [self._arg(op_name, op, a, p, values, f"{where} arg {i}") for i, (a, p) in enumerate(zip(args, params, strict=True))]
        grid = (launch.grid[0].eval(self.env), launch.grid[1].eval(self.env), launch.grid[2].eval(self.env))
        smem = launch.shared_mem.eval(self.env)
        block = (launch.block[0], launch.block[1], launch.block[2])
        config = None
        if launch.cluster is not None or launch.pdl:
            config = drv.launch_config(grid, block, smem, self.res.stream, launch.cluster, launch.pdl)
        return KernelRecord(self.res.funcs[(op_name, li)], grid, block, smem, ArgBlock(raw), config, label)

    def extern(
        self, launch: ExternLaunch, values: Sequence[Value], where: str
    ) -> tuple[Callable[[], None], Mapping[str, int] | None]:
        if launch.signature.collective:
            return self.collective(launch, values, where), None
        blas = self.res.blas
        if blas is None or not launch.entry.startswith("extern:cubl"):
            raise ManifestUnsupportedError(f"{where}: {launch.entry} is not available in this runtime")
        args = launch.args if launch.args is not None else _by_position(len(values))
        vals = [self._extern_value(a, values, where) for a in args]
        a, w, c = (vals[i].ptr for i in range(3))
        if a is None or w is None or c is None:
            raise ManifestUnsupportedError(f"{where}: GEMM a/w/c must be buffers")
        shape = gemm_shape(launch.entry, [int(v.scalar or 0) for v in vals[3:]], where)
        plan = blas.plan(shape, _algo_tuple(launch))
        stream = int(self.res.stream)
        return (lambda: blas.matmul(plan, a, w, c, stream)), blas.describe(plan)

    def collective(self, launch: ExternLaunch, values: Sequence[Value], where: str) -> Callable[[], None]:
        args = launch.args or ()
        group = args[-1].rank if args and isinstance(args[-1], RankArg) else ""
        comm = self.res.comms.get(group)
        if comm is None:
            raise ManifestUnsupportedError(f"{where}: group {group!r} has no communicator (connect first)")
        send, recv, count = (self._extern_value(a, values, where) for a in args[:3])
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

    def _extern_value(self, arg: object, values: Sequence[Value], where: str) -> Value:
        if isinstance(arg, ParamArg):
            return values[arg.param]
        if isinstance(arg, I32Arg | I64Arg | U8Arg | F32Arg):
            return Value(scalar=_literal(arg))
        if isinstance(arg, VarArg):
            return Value(scalar=self.env[arg.var])
        if isinstance(arg, ExprArg):
            return Value(scalar=arg.expr.eval(self.env))
        raise ManifestUnsupportedError(f"{where}: unsupported extern arg {arg!r}")


def _algo_tuple(launch: ExternLaunch) -> tuple[int, ...] | None:
    a = launch.algo
    if a is None:
        return None
    return (a.id, a.tile, a.split_k, a.reduction, a.swizzle, a.custom, a.stages, a.inner_shape, a.cluster_shape)


def gemm_shape(entry: str, scalars: Sequence[int], where: str = "") -> GemmShape:
    """The GemmShape of an extern GEMM from its scalar args [m, n, k, ldc?, lda?]."""
    if entry not in ("extern:cublaslt_bf16_tn", "extern:cublaslt_bf16_tn_acc", "extern:cublas_bf16_tn_f32"):
        raise ManifestUnsupportedError(f"{where}: {entry} is not supported by this runtime (bf16 GEMMs only)")
    if len(scalars) < 3:
        raise ManifestUnsupportedError(f"{where}: {entry} needs m, n, k")
    m, n, k = scalars[:3]
    ldc = scalars[3] if len(scalars) > 3 else n
    lda = scalars[4] if len(scalars) > 4 else k
    return GemmShape(m, n, k, ldc, lda, entry.endswith("_f32"), entry.endswith("_acc"))


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
