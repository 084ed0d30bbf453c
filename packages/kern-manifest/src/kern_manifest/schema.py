"""The manifest schema (version 5): pydantic v2 models and the parsing entry point.

Every model is frozen and rejects unknown fields. Arg kinds, launch kinds and pack fields are
discriminated unions keyed on which field is present (`{"param": 0}` is a `ParamArg`). The full
format is documented for authors in docs/manifest.md.

Entry points:
    `parse_manifest(data)`: bytes/str -> `Manifest`, raising `ManifestRejected` with every
        `ManifestParse` problem (not UTF-8, not JSON, duplicate keys, wrong shape or types), each
        with the JSON pointer of the offending field. Meaning is checked by `kern_manifest.verify`.
    `MANIFEST: TypeAdapter[Manifest]`: the module-level adapter (`MANIFEST.validate_python`).
    `manifest_to_json(m)`: the model back to plain JSON values (round-trips through
        `parse_manifest`).

Helpers for the runtime and the generator:
    `ParamType` / `parse_param("inout buffer<bf16>")`: direction (in/out/inout; scalars and
        bytes are "in"), kind (buffer/state/scalar/bytes), dtype (buffer element type or scalar
        type), `size` (ABI slot bytes: 8 for pointers and i64, 4 for i32/f32, 1 for u8, n for
        bytes<n>), `reads` / `writes`.
    `DTYPE_BYTES` / `dtype_bytes(d)`: element sizes of buffer dtypes.
    `EXTERN_SIGNATURES` / `extern_signature(entry)`: the fixed params of each `extern:` entry
        (required + optional trailing params).
    `Buffer.elements(env)` / `Buffer.nbytes(env)`: size at given var values;
        `Manifest.var_max`, `Manifest.var_bounds`, `Manifest.buffer_max_bytes(name)`: size at the
        vars' maxima (what the runtime allocates).
    `launch_vars(launch)`, `call_vars(call)`, `Manifest.program_vars(name)`: the vars a launch, a
        call, or a whole program (its calls and every launch of the ops they call) actually reads;
        the key of a program's CUDA graph.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Final, Literal, TypeAlias, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import PydanticCustomError

from kern_manifest.errors import (
    MAX_NAME,
    ManifestError,
    ManifestParse,
    ManifestRejected,
    escape_pointer,
    short,
)
from kern_manifest.expr import Expr, parse_expr

__all__ = [
    "DTYPES",
    "DTYPE_BYTES",
    "EXTERN_SIGNATURES",
    "FLOAT_FILLS",
    "INPUT_FILLS",
    "MANIFEST",
    "MAX_TEXT",
    "OUTPUT_FILLS",
    "PACK_DEFAULT_WIDTH",
    "SCALAR_BYTES",
    "SCALAR_TYPES",
    "SCHEMA_VERSION",
    "TENSORMAP_DTYPES",
    "Algo",
    "Batch",
    "BufArg",
    "Buffer",
    "Call",
    "CallArg",
    "Domain",
    "ExprArg",
    "ExternLaunch",
    "ExternSignature",
    "F32Arg",
    "I32Arg",
    "I64Arg",
    "Impl",
    "Interleave",
    "KernelLaunch",
    "Launch",
    "LaunchArg",
    "Manifest",
    "Module",
    "Op",
    "Pack",
    "PackArg",
    "PackExpr",
    "PackF32",
    "PackField",
    "PackI32",
    "PackI64",
    "PackParam",
    "PackRank",
    "PackScratch",
    "PackTensormap",
    "PackU8",
    "PackVar",
    "ParamArg",
    "ParamType",
    "Program",
    "RankArg",
    "RankRanges",
    "RankTensors",
    "Scratch",
    "ScratchArg",
    "Segment",
    "State",
    "StateArg",
    "Tensormap",
    "Topology",
    "U8Arg",
    "Var",
    "VarArg",
    "When",
    "call_vars",
    "dtype_bytes",
    "extern_signature",
    "launch_vars",
    "manifest_to_json",
    "parse_manifest",
    "parse_param",
]

SCHEMA_VERSION: Final = 5

DType: TypeAlias = Literal[
    "bf16", "f16", "f32", "fp8e4m3", "fp8e8m0", "i8", "i32", "u32", "i64", "u64", "u8"
]
ScalarType: TypeAlias = Literal["i32", "i64", "f32", "u8"]
TensormapDType: TypeAlias = Literal[
    "u8", "u16", "u32", "i32", "u64", "i64", "f16", "bf16", "f32", "tf32", "u4", "u4packed"
]

DTYPE_BYTES: Final[Mapping[str, int]] = {
    "bf16": 2, "f16": 2, "f32": 4, "fp8e4m3": 1, "fp8e8m0": 1, "i8": 1,
    "i32": 4, "u32": 4, "i64": 8, "u64": 8, "u8": 1,
}  # fmt: skip
DTYPES: Final = tuple(DTYPE_BYTES)
SCALAR_TYPES: Final = ("i32", "i64", "f32", "u8")
SCALAR_BYTES: Final[Mapping[str, int]] = {"i32": 4, "i64": 8, "f32": 4, "u8": 1}
TENSORMAP_DTYPES: Final = (
    "u8", "u16", "u32", "i32", "u64", "i64", "f16", "bf16", "f32", "tf32", "u4", "u4packed",
)  # fmt: skip


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a buffer dtype (KeyError for an unknown name)."""
    return DTYPE_BYTES[dtype]


# --------------------------------------------------------------------------------------------
# Param types


Direction: TypeAlias = Literal["in", "out", "inout"]
ParamKind: TypeAlias = Literal["buffer", "state", "scalar", "bytes"]


@dataclass(frozen=True, slots=True)
class ParamType:
    """One parsed op or launch param string.

    Attributes:
        kind: buffer, state, scalar or bytes.
        direction: in, out or inout (scalars and bytes are always "in").
        dtype: the buffer's element dtype or the scalar type; None for state and bytes.
        size: ABI slot bytes: 8 for pointers and i64, 4 for i32/f32, 1 for u8, n for bytes<n>.
    """

    kind: ParamKind
    direction: Direction
    dtype: str | None
    size: int

    @property
    def reads(self) -> bool:
        """True for in and inout."""
        return self.direction != "out"

    @property
    def writes(self) -> bool:
        """True for out and inout."""
        return self.direction != "in"

    @property
    def is_pointer(self) -> bool:
        """True for buffer and state params (an 8-byte device address in the ABI)."""
        return self.kind in ("buffer", "state")

    def __str__(self) -> str:
        if self.kind == "buffer":
            return f"{self.direction} buffer<{self.dtype}>"
        if self.kind == "state":
            return f"{self.direction} state"
        if self.kind == "bytes":
            return f"bytes<{self.size}>"
        return str(self.dtype)


_PARAM_RE: Final = re.compile(
    r"(in|out|inout) (buffer<([a-z0-9]+)>|state)|(i32|i64|f32|u8)|bytes<([1-9][0-9]{0,5})>"
)
_PARAM_FORMS: Final = (
    '"in|out|inout buffer<dtype>", "in|out|inout state", "i32|i64|f32|u8" or "bytes<n>"'
)


def parse_param(text: str) -> ParamType:
    """Parses a param string such as "in buffer<bf16>", "inout state", "i32" or "bytes<128>".

    Raises:
        ManifestParse: malformed string (pointer "": the caller knows where it sits).
    """
    m = _PARAM_RE.fullmatch(text)
    if m is None:
        raise ManifestParse("", f"malformed param type {short(text)!r}", f"use {_PARAM_FORMS}")
    direction, _, dtype, scalar, nbytes = m.groups()
    if scalar is not None:
        return ParamType("scalar", "in", scalar, SCALAR_BYTES[scalar])
    if nbytes is not None:
        return ParamType("bytes", "in", None, int(nbytes))
    if dtype is None:
        return ParamType("state", cast(Direction, direction), None, 8)
    if dtype not in DTYPE_BYTES:
        raise ManifestParse(
            "", f"unknown buffer dtype {dtype!r} in {short(text)!r}", f"use one of {', '.join(DTYPES)}"
        )
    return ParamType("buffer", cast(Direction, direction), dtype, 8)


def _validate_param(value: object) -> ParamType:
    if isinstance(value, ParamType):
        return value
    if not isinstance(value, str):
        raise PydanticCustomError(
            "param_type",
            "{message}",
            {"message": "a param type is a string", "hint": f"use {_PARAM_FORMS}"},
        )
    try:
        return parse_param(value)
    except ManifestParse as exc:
        raise PydanticCustomError(
            "param_type", "{message}", {"message": exc.message, "hint": exc.hint}
        ) from None


if TYPE_CHECKING:
    Param: TypeAlias = ParamType
else:
    Param = Annotated[Any, PlainValidator(_validate_param), PlainSerializer(str, return_type=str)]


def _constants_of(info: ValidationInfo) -> Mapping[str, int | float]:
    ctx = info.context
    return cast("Mapping[str, int | float]", ctx.get("constants", {})) if isinstance(ctx, dict) else {}


def _constant(value: object, info: ValidationInfo) -> object:
    """A wire-only constant's name in a numeric position stands for its value."""
    if isinstance(value, str):
        return _constants_of(info).get(value, value)
    return value


def _expand(value: object, constants: Mapping[str, int | float]) -> object:
    """`value` (an expression's JSON) with every string that names a constant replaced by it."""
    if isinstance(value, str):
        return constants.get(value, value)
    if isinstance(value, list):
        return [_expand(v, constants) for v in cast("list[object]", value)]
    if isinstance(value, dict):
        return {k: _expand(v, constants) for k, v in cast("dict[str, object]", value).items()}
    return value


def _validate_expr(value: object, info: ValidationInfo) -> Expr:
    constants = _constants_of(info)
    if constants:
        value = _expand(value, constants)
    try:
        return parse_expr(value)
    except ManifestParse as exc:
        raise PydanticCustomError(
            "expr", "{message}", {"message": exc.message, "hint": exc.hint, "subpath": exc.pointer}
        ) from None


if TYPE_CHECKING:
    ExprField: TypeAlias = Expr
else:
    ExprField = Annotated[Any, PlainValidator(_validate_expr), PlainSerializer(Expr.to_json)]


def _validate_bound(value: object, info: ValidationInfo) -> int | float | Expr:
    value = _constant(value, info)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise PydanticCustomError(
                "bound",
                "{message}",
                {"message": "bound is not finite", "hint": "use a finite number"},
            )
        return value
    return _validate_expr(value, info)


def _dump_bound(value: int | float | Expr) -> object:
    return value.to_json() if isinstance(value, Expr) else value


if TYPE_CHECKING:
    Bound: TypeAlias = int | float | Expr
else:
    Bound = Annotated[Any, PlainValidator(_validate_bound), PlainSerializer(_dump_bound)]


# --------------------------------------------------------------------------------------------
# Base model and key-discriminated unions


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _keyed(tags: tuple[str, ...]) -> Callable[[Any], str | None]:
    def pick(value: Any) -> str | None:
        if isinstance(value, dict):
            for tag in tags:
                if tag in value:
                    return "~" + tag
            return None
        tag = getattr(value, "KIND", None)
        return None if tag is None else "~" + tag

    return pick


def _one_of(kind: str, tags: tuple[str, ...]) -> Discriminator:
    forms = ", ".join(f'{{"{t}": ...}}' for t in tags)
    return Discriminator(
        _keyed(tags),
        custom_error_type="kind",
        custom_error_message=f"not a known {kind}",
        custom_error_context={"hint": f"use one of {forms}"},
    )


Name = Annotated[StrictStr, Field(min_length=1, max_length=MAX_NAME)]
Label = Annotated[StrictStr, Field(max_length=MAX_NAME)]
"""The model's label and call labels: like a name, but may be empty (the verifier says so)."""
MAX_TEXT: Final = 4096
"""The longest kernel entry symbol (a mangled C++ template name may run to thousands) or module
source (a path or URL)."""
Text = Annotated[StrictStr, Field(max_length=MAX_TEXT)]
Int = Annotated[StrictInt, BeforeValidator(_constant)]
"""An integer; a wire-only constant's name may stand for it (`parse_manifest`)."""
Float = Annotated[StrictFloat, BeforeValidator(_constant)]
"""A number; a wire-only constant's name may stand for it."""
Index = Annotated[Int, Field(ge=0)]
Dim3 = tuple[Int, Int, Int]


# --------------------------------------------------------------------------------------------
# Vars, states, topology, modules


class Var(_Model):
    """A per-call scalar that sizes memory or launch geometry; its lower bound is always 1."""

    max: Int


class State(_Model):
    """Opaque persistent memory; exactly one size field is set (checked by the verifier).

    `slices` (paged states only) declares each page as that many equal contiguous slices (a
    model's layers) and promises that a call whose argument points into slice s touches only
    slice s of each page: the runtime then moves pages from the host tier slice by slice, and a
    call waits only for its own slice's copies."""

    bytes: Int | None = None
    bytes_per_token: Int | None = None
    bytes_per_seq: Int | None = None
    slices: Int | None = None

    @property
    def sizes(self) -> dict[str, int]:
        """The size fields that are set, by name."""
        return {
            k: v
            for k, v in (
                ("bytes", self.bytes),
                ("bytes_per_token", self.bytes_per_token),
                ("bytes_per_seq", self.bytes_per_seq),
            )
            if v is not None
        }


class Topology(_Model):
    """Named rank groups and their sizes."""

    groups: dict[Name, Int]


class Module(_Model):
    """A pinned code artifact: the sha256 is its identity, `source` only a label or address."""

    source: Text
    sha256: StrictStr


# --------------------------------------------------------------------------------------------
# Buffers


class Domain(_Model):
    """A prior on a buffer's contents: `{min?, max?}` or `{index_into, stride?}`, plus monotone."""

    min: Bound | None = None
    max: Bound | None = None
    index_into: Name | None = None
    stride: Int | None = None
    monotone: StrictBool = False


class RankTensors(_Model):
    """A rank-selected tensor name: this rank's index in `group` picks from `tensors`."""

    group: Name
    tensors: tuple[Name, ...]


class RankRanges(_Model):
    """Per-rank half-open ranges: this rank's index in `group` picks from `ranges`."""

    group: Name
    ranges: tuple[tuple[Int, Int], ...]


class Interleave(_Model):
    """Alternate blocks of `rows` rows from the segment's tensor and `with` (same shape)."""

    with_: Name = Field(alias="with")
    rows: Int


TensorRef = Annotated[Name | RankTensors, Field(union_mode="left_to_right")]
RowRange = Annotated[tuple[Int, Int] | RankRanges, Field(union_mode="left_to_right")]


class Segment(_Model):
    """One checkpoint-tensor segment of a weight/source buffer, viewed as [dim0, rest]."""

    tensor: TensorRef
    rows: RowRange | None = None
    cols: RowRange | None = None
    interleave: Interleave | None = None


BufferKind: TypeAlias = Literal["input", "output", "weight", "source", "workspace", "carry", "peer"]
InputFill: TypeAlias = Literal[
    "token", "position", "valid", "slot", "seq_len", "cu_seqlens", "span_at", "blocks", "sampling", "seed"
]
OutputFill: TypeAlias = Literal["tokens", "count", "error", "clock", "logprobs", "top_tokens"]
INPUT_FILLS: Final = (
    "token",
    "position",
    "valid",
    "slot",
    "seq_len",
    "cu_seqlens",
    "span_at",
    "blocks",
    "sampling",
    "seed",
)
OUTPUT_FILLS: Final = ("tokens", "count", "error", "clock", "logprobs", "top_tokens")
FLOAT_FILLS: Final = ("sampling", "logprobs")
"""Fill roles on f32 buffers (every other role is on i32/i64 buffers)."""


class Buffer(_Model):
    """A typed tensor, allocated at the vars' maxima."""

    dtype: DType
    shape: tuple[ExprField, ...]
    kind: BufferKind
    placement: Literal["device", "host"] = "device"
    fill: InputFill | OutputFill | None = None
    export: StrictBool = False
    domain: Domain | None = None
    bind: tuple[Segment, ...] | None = None
    of: Name | None = None
    group: Name | None = None

    def elements(self, env: Mapping[str, int]) -> int:
        """Element count at the given var values."""
        return math.prod(d.eval(env) for d in self.shape)

    def nbytes(self, env: Mapping[str, int]) -> int:
        """Byte size at the given var values."""
        return self.elements(env) * DTYPE_BYTES[self.dtype]


class Scratch(_Model):
    """An impl-private buffer, invisible to callers."""

    dtype: DType
    shape: tuple[ExprField, ...]

    def nbytes(self, env: Mapping[str, int]) -> int:
        """Byte size at the given var values."""
        return math.prod(d.eval(env) for d in self.shape) * DTYPE_BYTES[self.dtype]


# --------------------------------------------------------------------------------------------
# Launch args and packs


class ParamArg(_Model):
    """Forward the op's interface param `param` (index)."""

    KIND: ClassVar[str] = "param"
    param: Index


class ScratchArg(_Model):
    """Pass the impl's scratch buffer."""

    KIND: ClassVar[str] = "scratch"
    scratch: Name


class I32Arg(_Model):
    """An i32 literal."""

    KIND: ClassVar[str] = "i32"
    i32: Int


class I64Arg(_Model):
    """An i64 literal."""

    KIND: ClassVar[str] = "i64"
    i64: Int


class F32Arg(_Model):
    """An f32 literal."""

    KIND: ClassVar[str] = "f32"
    f32: Float


class U8Arg(_Model):
    """A u8 literal."""

    KIND: ClassVar[str] = "u8"
    u8: Int


class VarArg(_Model):
    """The value of a var."""

    KIND: ClassVar[str] = "var"
    var: Name


class ExprArg(_Model):
    """The value of an expression over vars."""

    KIND: ClassVar[str] = "expr"
    expr: ExprField


class RankArg(_Model):
    """This rank's index in a topology group (burned in at load); i32/i64 params only."""

    KIND: ClassVar[str] = "rank"
    rank: Name


class Tensormap(_Model):
    """A TMA descriptor over a param's buffer (plus the call's offset), encoded at load."""

    param: Index
    dtype: TensormapDType
    dims: tuple[ExprField, ...]
    strides: tuple[ExprField, ...] = ()
    box: tuple[Int, ...]
    swizzle: Literal[0, 32, 64, 128] = 0
    l2_promotion: Literal[0, 64, 128, 256] = 0
    oob_nan: StrictBool = False
    wrap: StrictBool = False


class _Field(_Model):
    at: Index
    width: Int | None = None


class PackParam(_Field, ParamArg):
    """Pack field: a param's pointer (plus the call offset) or scalar value."""


class PackScratch(_Field, ScratchArg):
    """Pack field: a scratch buffer's pointer."""


class PackI32(_Field, I32Arg):
    """Pack field: an i32 literal."""


class PackI64(_Field, I64Arg):
    """Pack field: an i64 literal."""


class PackF32(_Field, F32Arg):
    """Pack field: an f32 literal."""


class PackU8(_Field, U8Arg):
    """Pack field: a u8 literal."""


class PackVar(_Field, VarArg):
    """Pack field: a var's value."""


class PackExpr(_Field, ExprArg):
    """Pack field: an expression's value."""


class PackRank(_Field, RankArg):
    """Pack field: this rank's index in a group."""


class PackTensormap(_Field):
    """Pack field: a 128-byte tensormap, 64-byte aligned."""

    KIND: ClassVar[str] = "tensormap"
    tensormap: Tensormap


_PACK_TAGS: Final = (
    "tensormap",
    "param",
    "scratch",
    "i32",
    "i64",
    "f32",
    "u8",
    "var",
    "expr",
    "rank",
)
PackField = Annotated[
    Annotated[PackTensormap, Tag("~tensormap")]
    | Annotated[PackParam, Tag("~param")]
    | Annotated[PackScratch, Tag("~scratch")]
    | Annotated[PackI32, Tag("~i32")]
    | Annotated[PackI64, Tag("~i64")]
    | Annotated[PackF32, Tag("~f32")]
    | Annotated[PackU8, Tag("~u8")]
    | Annotated[PackVar, Tag("~var")]
    | Annotated[PackExpr, Tag("~expr")]
    | Annotated[PackRank, Tag("~rank")],
    _one_of("pack field source", _PACK_TAGS),
]

# NOTE: default pack field widths by source kind (tensormap 128; pointers and i64 8).
PACK_DEFAULT_WIDTH: Final[Mapping[str, int]] = {
    "tensormap": 128, "scratch": 8, "i32": 4, "i64": 8, "f32": 4, "u8": 1, "var": 4, "expr": 4, "rank": 4,
}  # fmt: skip


class Pack(_Model):
    """The bytes of a `bytes<n>` param: `size` bytes, fields at byte offsets, the rest zero."""

    size: Int
    fields: tuple[PackField, ...]


class PackArg(_Model):
    """A byte pack for a `bytes<n>` param."""

    KIND: ClassVar[str] = "pack"
    pack: Pack


_LAUNCH_ARG_TAGS: Final = (
    "param",
    "scratch",
    "i32",
    "i64",
    "f32",
    "u8",
    "var",
    "expr",
    "rank",
    "pack",
)
LaunchArg = Annotated[
    Annotated[ParamArg, Tag("~param")]
    | Annotated[ScratchArg, Tag("~scratch")]
    | Annotated[I32Arg, Tag("~i32")]
    | Annotated[I64Arg, Tag("~i64")]
    | Annotated[F32Arg, Tag("~f32")]
    | Annotated[U8Arg, Tag("~u8")]
    | Annotated[VarArg, Tag("~var")]
    | Annotated[ExprArg, Tag("~expr")]
    | Annotated[RankArg, Tag("~rank")]
    | Annotated[PackArg, Tag("~pack")],
    _one_of("launch arg", _LAUNCH_ARG_TAGS),
]


# --------------------------------------------------------------------------------------------
# Launches


class When(_Model):
    """Run the launch only while `var` lies in [min, max] (inclusive; missing ends are open)."""

    var: Name
    min: Int | None = None
    max: Int | None = None


def _module_entry(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise PydanticCustomError(
            "entry",
            "{message}",
            {"message": "entry must be a non-empty string", "hint": "name the kernel symbol"},
        )
    if len(value) > MAX_TEXT:
        raise PydanticCustomError(
            "entry",
            "{message}",
            {"message": f"entry of {len(value)} characters", "hint": f"use at most {MAX_TEXT}"},
        )
    if value.startswith("extern:"):
        raise PydanticCustomError(
            "entry",
            "{message}",
            {
                "message": f"a module launch may not use {short(value)!r}",
                "hint": "drop `module` to call a built-in extern",
            },
        )
    return value


class KernelLaunch(_Model):
    """A CUDA kernel launch: `entry` in `module`, with geometry and args."""

    KIND: ClassVar[str] = "kernel"
    module: Name
    entry: Annotated[str, PlainValidator(_module_entry)]
    block: Dim3
    grid: tuple[ExprField, ExprField, ExprField]
    shared_mem: ExprField = Field(default_factory=lambda: parse_expr(0))
    cluster: Dim3 | None = None
    pdl: StrictBool = False
    carveout: Int | None = None
    when: When | None = None
    params: tuple[Param, ...] | None = None
    args: tuple[LaunchArg, ...] | None = None


@dataclass(frozen=True, slots=True)
class ExternSignature:
    """The params of a built-in extern: `required` always, then up to all of `optional`."""

    required: tuple[ParamType, ...]
    optional: tuple[ParamType, ...] = ()
    algo: bool = False
    collective: bool = False


def _sig(*texts: str) -> tuple[ParamType, ...]:
    return tuple(parse_param(t) for t in texts)


def _gemm(
    a: str, c: str, n_optional: int, *, acc: bool = False, scales: bool = False, algo: bool = False
) -> ExternSignature:
    head = _sig(f"in buffer<{a}>", f"in buffer<{a}>", f"{'inout' if acc else 'out'} buffer<{c}>")
    if scales:
        head += _sig("in buffer<f32>", "in buffer<f32>")
    return ExternSignature(head + _sig("i32", "i32", "i32"), _sig(*["i32"] * n_optional), algo=algo)


def _collectives() -> dict[str, ExternSignature]:
    out: dict[str, ExternSignature] = {}
    for verb in ("allreduce", "allgather", "reducescatter", "alltoall"):
        for dt in ("f32", "bf16"):
            out[f"extern:nccl_{verb}_{dt}"] = ExternSignature(
                _sig(f"in buffer<{dt}>", f"out buffer<{dt}>", "i64", "i32"), collective=True
            )
    return out


# NOTE: GEMMs are row-major C[m,n] = A[m,k] @ W[n,k]^T; args [a, w, c, (a_scale, w_scale,) m, n, k,
# ldc?, lda?] with row strides in elements. Collectives: [send, recv, count per rank, {"rank": g}].
EXTERN_SIGNATURES: Final[Mapping[str, ExternSignature]] = {
    "extern:cublaslt_bf16_tn": _gemm("bf16", "bf16", 2, algo=True),
    "extern:cublaslt_bf16_tn_acc": _gemm("bf16", "bf16", 2, acc=True, algo=True),
    "extern:cublas_bf16_tn_f32": _gemm("bf16", "f32", 2),
    "extern:cublaslt_fp8_tn": _gemm("fp8e4m3", "bf16", 1, scales=True),
    "extern:cublaslt_fp8_tn_f32": _gemm("fp8e4m3", "f32", 1, scales=True),
    **_collectives(),
}


def extern_signature(entry: str) -> ExternSignature:
    """The signature of a built-in extern entry such as "extern:cublaslt_bf16_tn" (KeyError if unknown)."""
    return EXTERN_SIGNATURES[entry]


def _extern_entry(value: object) -> str:
    if not isinstance(value, str) or value not in EXTERN_SIGNATURES:
        names = ", ".join(EXTERN_SIGNATURES)
        shown = short(value) if isinstance(value, str) else value
        raise PydanticCustomError(
            "entry",
            "{message}",
            {"message": f"unknown extern entry {shown!r}", "hint": f"use one of {names}"},
        )
    return value


class Algo(_Model):
    """A pinned cublasLt algorithm (cublasLtMatmulAlgoConfigAttributes_t values)."""

    id: Int
    tile: Int = 0
    stages: Int = 0
    split_k: Int = 1
    reduction: Int = 0
    swizzle: Int = 0
    custom: Int = 0
    inner_shape: Int = 0
    cluster_shape: Int = 0


class ExternLaunch(_Model):
    """A built-in op of the runtime (cublasLt GEMMs, NCCL collectives): no module, no geometry."""

    KIND: ClassVar[str] = "extern"
    entry: Annotated[str, PlainValidator(_extern_entry)]
    when: When | None = None
    args: tuple[LaunchArg, ...] | None = None
    algo: Algo | None = None

    @property
    def signature(self) -> ExternSignature:
        """The extern's fixed params."""
        return EXTERN_SIGNATURES[self.entry]


def _launch_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        if "module" in value:
            return "~kernel"
        entry = value.get("entry")
        return "~extern" if isinstance(entry, str) and entry.startswith("extern:") else "~kernel"
    tag = getattr(value, "KIND", None)
    return None if tag is None else "~" + tag


Launch = Annotated[
    Annotated[KernelLaunch, Tag("~kernel")] | Annotated[ExternLaunch, Tag("~extern")],
    Discriminator(_launch_kind),
]


class Impl(_Model):
    """An op's implementation: private scratch buffers and a list of launches."""

    scratch: dict[Name, Scratch] = Field(default_factory=dict)
    launches: tuple[Launch, ...]


class Op(_Model):
    """An interface (param types) and its implementation."""

    params: tuple[Param, ...]
    impl: Impl


# --------------------------------------------------------------------------------------------
# Programs


class BufArg(_Model):
    """A buffer plus a byte offset (a sub-view)."""

    KIND: ClassVar[str] = "buf"
    buf: Name
    offset: ExprField = Field(default_factory=lambda: parse_expr(0))


class StateArg(_Model):
    """A state plus a byte offset (e.g. one layer's region)."""

    KIND: ClassVar[str] = "state"
    state: Name
    offset: ExprField = Field(default_factory=lambda: parse_expr(0))


_CALL_ARG_TAGS: Final = ("buf", "state", "var", "expr", "i32", "i64", "f32", "u8", "rank")
CallArg = Annotated[
    Annotated[BufArg, Tag("~buf")]
    | Annotated[StateArg, Tag("~state")]
    | Annotated[VarArg, Tag("~var")]
    | Annotated[ExprArg, Tag("~expr")]
    | Annotated[I32Arg, Tag("~i32")]
    | Annotated[I64Arg, Tag("~i64")]
    | Annotated[F32Arg, Tag("~f32")]
    | Annotated[U8Arg, Tag("~u8")]
    | Annotated[RankArg, Tag("~rank")],
    _one_of("call arg", _CALL_ARG_TAGS),
]


class Call(_Model):
    """One op invocation with its args, in interface order."""

    label: Label | None = None
    op: Name
    args: tuple[CallArg, ...]


class Batch(_Model):
    """The serving shape of a program: up to `groups` sequences of `rows` rows each."""

    groups: Int
    rows: Annotated[Int | Name, Field(union_mode="left_to_right")]
    span: Name | None = None
    context: Name | None = None


class Program(_Model):
    """A named straight-line list of calls."""

    batch: Batch | None = None
    once: StrictBool = False
    derive: StrictBool = False
    graph: StrictBool = False
    calls: tuple[Call, ...]


class Manifest(_Model):
    """A whole manifest (schema version 5)."""

    schema_version: StrictInt
    model: Label
    topology: Topology | None = None
    vars: dict[Name, Var] = Field(default_factory=dict)
    states: dict[Name, State] = Field(default_factory=dict)
    buffers: dict[Name, Buffer]
    modules: dict[Name, Module]
    ops: dict[Name, Op]
    programs: dict[Name, Program]

    @property
    def var_max(self) -> dict[str, int]:
        """Every var at its maximum (the environment buffers are sized in)."""
        return {name: v.max for name, v in self.vars.items()}

    @property
    def var_bounds(self) -> dict[str, tuple[int, int]]:
        """Every var's inclusive (1, max) bounds."""
        return {name: (1, v.max) for name, v in self.vars.items()}

    def buffer_max_bytes(self, name: str) -> int:
        """Bytes the runtime allocates for buffer `name` (its size at the vars' maxima)."""
        return self.buffers[name].nbytes(self.var_max)

    def program_vars(self, name: str) -> frozenset[str]:
        """The vars program `name` reads: its calls' args and every launch of the ops it calls."""
        seen_ops: set[str] = set()
        out: set[str] = set()
        for call in self.programs[name].calls:
            out |= call_vars(call)
            if call.op not in seen_ops and call.op in self.ops:
                seen_ops.add(call.op)
                for launch in self.ops[call.op].impl.launches:
                    out |= launch_vars(launch)
        return frozenset(out)


# --------------------------------------------------------------------------------------------
# Vars read


def _arg_vars(args: Iterable[object]) -> Iterator[str]:
    for arg in args:
        if isinstance(arg, VarArg):
            yield arg.var
        elif isinstance(arg, ExprArg):
            yield from arg.expr.vars
        elif isinstance(arg, BufArg | StateArg):
            yield from arg.offset.vars
        elif isinstance(arg, PackArg):
            yield from _arg_vars(arg.pack.fields)
        elif isinstance(arg, PackTensormap):
            for e in (*arg.tensormap.dims, *arg.tensormap.strides):
                yield from e.vars


def launch_vars(launch: KernelLaunch | ExternLaunch) -> frozenset[str]:
    """The vars a launch reads: grid, shared_mem, `when`, var/expr args and pack fields.

    Extern launches read the vars of their args and their `when`.
    """
    out = set(_arg_vars(launch.args or ()))
    if launch.when is not None:
        out.add(launch.when.var)
    if isinstance(launch, KernelLaunch):
        for e in (*launch.grid, launch.shared_mem):
            out |= e.vars
    return frozenset(out)


def call_vars(call: Call) -> frozenset[str]:
    """The vars a call reads directly: var/expr args and buffer/state offsets."""
    return frozenset(_arg_vars(call.args))


# --------------------------------------------------------------------------------------------
# Parsing


MANIFEST: Final = TypeAdapter(Manifest)


class _DupDict(dict[str, Any]):
    """A JSON object that repeated a key; `dups` lists the repeated keys."""

    dups: list[str]


class _Hook:
    """An object_pairs_hook that marks objects with repeated keys and remembers it saw any."""

    def __init__(self) -> None:
        self.saw_dups = False

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        dups: list[str] = []
        for key, value in pairs:
            if key in out:
                dups.append(key)
            out[key] = value
        if not dups:
            return out
        self.saw_dups = True
        marked = _DupDict(out)
        marked.dups = dups
        return marked


class _NotJson(ValueError):
    """NaN, Infinity or -Infinity: JSON has no such number."""


def _no_constant(name: str) -> object:
    raise _NotJson(f"{name} is not JSON")


def _decode(data: str | bytes) -> tuple[object, bool]:
    """The JSON value and whether some object repeated a key."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestParse(
                "", f"not UTF-8 text (byte {exc.start})", "a manifest is a UTF-8 JSON file"
            ) from None
    data = data.removeprefix("\ufeff")
    hook = _Hook()
    try:
        return json.loads(data, object_pairs_hook=hook, parse_constant=_no_constant), hook.saw_dups
    except json.JSONDecodeError as exc:
        raise ManifestParse(
            "",
            f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            "fix the JSON syntax",
        ) from None
    except RecursionError:
        raise ManifestParse(
            "", "not JSON: nested too deeply", "a manifest nests only a few levels"
        ) from None
    except _NotJson as exc:
        raise ManifestParse("", f"not JSON: {exc}", "fix the JSON syntax") from None
    except ValueError:
        # NOTE: the one other ValueError json.loads raises: an integer past Python's limit of
        # sys.get_int_max_str_digits() digits
        raise ManifestParse(
            "", "not JSON: a number too long", "numbers in a manifest fit in 64 bits"
        ) from None


def _duplicates(root: object) -> list[ManifestParse]:
    out: list[ManifestParse] = []
    stack: list[tuple[str, object]] = [("", root)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            for key in getattr(node, "dups", ()):
                out.append(
                    ManifestParse(
                        f"{path}/{escape_pointer(key)}",
                        f"duplicate key {short(key)!r}",
                        "each name may appear once",
                    )
                )
            stack.extend((f"{path}/{escape_pointer(k)}", v) for k, v in node.items())  # type: ignore[union-attr]
        elif isinstance(node, list):
            stack.extend((f"{path}/{i}", v) for i, v in enumerate(node))  # type: ignore[arg-type]
    return out


def _pointer(raw: object, loc: tuple[int | str, ...]) -> str:
    """Maps a pydantic error location onto the raw JSON (union tags and validator names drop out)."""
    parts: list[str] = []
    node = raw
    for item in loc:
        if isinstance(node, dict) and isinstance(item, str) and item in node:
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):  # type: ignore[arg-type]
            node = node[item]  # type: ignore[index]
        else:
            continue
        parts.append(escape_pointer(item))
    return "".join("/" + p for p in parts)


_HINTS: Final[Mapping[str, str]] = {
    "missing": "add the field",
    "extra_forbidden": "remove it: unknown fields are rejected (see docs/manifest.md)",
    "int_type": "use a JSON integer",
    "float_type": "use a JSON number",
    "string_type": "use a JSON string",
    "bool_type": "use true or false",
    "dict_type": "use a JSON object",
    "model_type": "use a JSON object",
    "tuple_type": "use a JSON array",
    "literal_error": "use one of the listed values",
    "too_short": "add the missing items",
    "too_long": "remove the extra items",
    "string_too_short": "use a non-empty name",
    "string_too_long": "shorten it",
    "greater_than_equal": "use a non-negative integer",
}


def _problem(raw: object, err: Any) -> ManifestParse:
    loc = tuple(err["loc"])
    ctx = err.get("ctx") or {}
    pointer = _pointer(raw, loc)
    kind = err["type"]
    message = err["msg"]
    if kind == "missing":
        name = loc[-1] if loc else ""
        if isinstance(name, int):
            message = f"array too short: no item {name}"
        else:
            message = f"missing field {name!r}"
            pointer += "/" + escape_pointer(name) if name else ""
    elif kind == "extra_forbidden":
        message = f"unknown field {short(str(loc[-1]))!r}" if loc else message
    if kind == "expr":
        pointer += str(ctx.get("subpath", ""))
    if kind == "string_too_long":
        message = f"longer than {ctx.get('max_length')} characters"
    hint = str(ctx.get("hint") or _HINTS.get(kind, "see docs/manifest.md"))
    return ManifestParse(pointer, message, hint)


def _check_version(raw: object) -> None:
    if not isinstance(raw, dict):
        raise ManifestParse(
            "", f"a manifest is a JSON object, not {_json_type(raw)}", "wrap it in {...}"
        )
    version = raw.get("schema_version")  # type: ignore[union-attr]
    if "schema_version" not in raw:
        raise ManifestParse(
            "/schema_version",
            "missing field 'schema_version'",
            f'add "schema_version": {SCHEMA_VERSION}',
        )
    if type(version) is not int or version != SCHEMA_VERSION:
        raise ManifestParse(
            "/schema_version",
            f"schema_version {short(repr(version))} is not {SCHEMA_VERSION}",
            "regenerate the manifest for schema 5",
        )


def _json_type(value: object) -> str:
    names: dict[type, str] = {
        list: "an array",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


_CONSTANT_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _take_constants(
    raw: dict[str, object],
) -> tuple[dict[str, object], dict[str, int | float], list[ManifestError]]:
    """The manifest without its wire-only `constants`, the constants, and what is wrong with them:
    each a name (letters, digits, `_`) that is not also a var, mapped to a plain finite number."""
    if "constants" not in raw:
        return raw, {}, []
    body = {k: v for k, v in raw.items() if k != "constants"}
    table = raw["constants"]
    if not isinstance(table, dict):
        bad = ManifestParse(
            "/constants", f"constants is {_json_type(table)}", 'use an object of numbers, e.g. {"HID": 2560}'
        )
        return body, {}, [bad]
    declared = raw.get("vars")
    var_names = set(cast("dict[str, object]", declared)) if isinstance(declared, dict) else set[str]()
    out: dict[str, int | float] = {}
    problems: list[ManifestError] = []
    for name, value in cast("dict[str, object]", table).items():
        at = "/constants/" + escape_pointer(name)
        shown = short(name)
        if len(name) > MAX_NAME or not _CONSTANT_NAME.fullmatch(name):
            problems.append(ManifestParse(at, f"constant name {shown!r}",
                                          f"use up to {MAX_NAME} letters, digits and _ (e.g. HIDDEN_SIZE)"))
        elif name in var_names:
            problems.append(ManifestParse(at, f"constant {shown!r} is also a var", "rename one: a constant may not shadow a var"))
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            problems.append(ManifestParse(at, f"constant {shown!r} is {_json_type(value)}", "give a plain finite JSON number"))
        else:
            out[name] = value
    return body, out, problems


def parse_manifest(data: str | bytes) -> Manifest:
    """Parses manifest text into a model; meaning is not checked (see `kern_manifest.verify`).

    Wire-only `constants` (a top-level object of named numbers) are expanded: a constant's name
    may stand for a number in any numeric position but `schema_version` (integers, floats, shapes,
    expressions, bounds, offsets); the model holds the numbers and keeps no `constants`.

    Raises:
        ManifestRejected: every `ManifestParse` problem found, each with its JSON pointer.
    """
    try:
        raw, saw_dups = _decode(data)
        _check_version(raw)
    except ManifestParse as exc:
        raise ManifestRejected([exc]) from None
    body, constants, problems = _take_constants(cast("dict[str, object]", raw))
    if saw_dups:
        problems[:0] = _duplicates(raw)
    try:
        manifest = MANIFEST.validate_python(body, context={"constants": constants})
    except ValidationError as exc:
        problems.extend(
            _problem(body, e) for e in exc.errors(include_url=False, include_input=False)
        )
        raise ManifestRejected(problems) from None
    if problems:
        raise ManifestRejected(problems)
    return manifest


def manifest_to_json(manifest: Manifest) -> dict[str, Any]:
    """Plain JSON values for a manifest (None fields dropped); `parse_manifest` reads them back."""
    return MANIFEST.dump_python(manifest, mode="json", by_alias=True, exclude_none=True)
