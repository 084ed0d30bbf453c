"""The verifier: what a parsed manifest means must hold before anything is loaded.

`check(manifest)` returns every problem as a `ManifestVerify` (JSON pointer, message, hint);
`verify(manifest)` raises `ManifestRejected` when there is any; `load_manifest(data)` parses and
verifies. All static checks are made at the var bounds (every var in [1, max]; a launch's `when`
narrows its var). The checks, by section:

- header: model label; var max >= 1; group sizes >= 1; each state has exactly one size >= 1;
  module sha256 (64 lowercase hex) and source (`hf:org/repo/path[@rev]`, `https://...` or a file).
- buffers: shapes resolve, every dim >= 1, bytes fit in 63 bits at the maxima; placement host only
  for weights; export not on host buffers or peers; `of`/`group` only on peers; peer rules (u64
  [group size], `of` an export buffer or a state, no domain); bind only (and always) on
  weight/source, with sane ranges and rank tables; fill roles on i32/i64 input/output buffers,
  each once; domains self-consistent.
- ops and launches: no `bytes<n>` in interfaces; kernel launches: module resolves, block <= 1024
  threads, grid non-zero at the minimum and within CUDA limits at the maximum, dynamic shared
  memory <= 232448 bytes, cluster <= 16 blocks dividing the grid, `when` inside the var's range,
  ABI <= 32764 bytes; args match params in count and type, literals and var/expr ranges fit their
  types, packs and tensormaps fit; extern launches: arg count, `algo` only on cublasLt bf16 GEMMs,
  collectives take `{"rank": g}`; impl dataflow: no writes through `in`, every `out` written,
  scratch written before read, no unused scratch.
- programs: flag exclusions (derive excludes once/batch/graph, once excludes batch/graph), batch
  shape; calls: op resolves, args match the interface (dtype, state, ranges), byte offsets aligned
  and in bounds at the maxima, tensormap footprints in bounds; dataflow: no read before write of
  workspace or output within a program, no writes to input, weight (outside derive) or source or
  peer, sources read only by derive programs, derive touches no state/input/output/peer and no
  collective, no peer reaches an extern; every output and carry (and every unbound weight) is
  written by some program.
- nothing declared is unused: buffers, states, vars, ops, modules, groups, scratch.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from kern_manifest.errors import (
    ExprError,
    ManifestError,
    ManifestRejected,
    ManifestVerify,
    escape_pointer,
)
from kern_manifest.expr import Expr
from kern_manifest.schema import (
    DTYPE_BYTES,
    INPUT_FILLS,
    PACK_DEFAULT_WIDTH,
    SCHEMA_VERSION,
    BufArg,
    Buffer,
    Call,
    Domain,
    ExprArg,
    ExternLaunch,
    F32Arg,
    I32Arg,
    I64Arg,
    KernelLaunch,
    LaunchArg,
    Manifest,
    Op,
    Pack,
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
    Program,
    RankArg,
    RankRanges,
    RankTensors,
    ScratchArg,
    Segment,
    StateArg,
    Tensormap,
    U8Arg,
    VarArg,
    parse_manifest,
)

__all__ = [
    "CUDA_LIMITS",
    "check",
    "load_manifest",
    "verify",
]


@dataclass(frozen=True, slots=True)
class _Limits:
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


CUDA_LIMITS: Final = _Limits()
"""sm_90 limits the verifier checks against (block, grid, opt-in shared memory, cluster, ABI)."""

_INT_RANGE: Final[Mapping[str, tuple[int, int]]] = {
    "i32": (-(1 << 31), (1 << 31) - 1),
    "i64": (-(1 << 63), (1 << 63) - 1),
    "u8": (0, 255),
}
_DTYPE_RANGE: Final[Mapping[str, tuple[int, int]]] = {
    "i8": (-128, 127),
    "u8": (0, 255),
    "i32": _INT_RANGE["i32"],
    "u32": (0, (1 << 32) - 1),
    "i64": _INT_RANGE["i64"],
    "u64": (0, (1 << 64) - 1),
}
_F32_MAX: Final = 3.4028234663852886e38
_MAX_BYTES: Final = (1 << 63) - 1
_STATE_ALIGN: Final = 16
_SHA_RE: Final = re.compile(r"[0-9a-f]{64}")
_TENSORMAP_NIBBLES: Final[Mapping[str, int]] = {
    "u8": 2, "u16": 4, "u32": 8, "i32": 8, "u64": 16, "i64": 16,
    "f16": 4, "bf16": 4, "f32": 8, "tf32": 8, "u4": 1, "u4packed": 1,
}  # fmt: skip
_ALGO_EXTERNS: Final = ("extern:cublaslt_bf16_tn", "extern:cublaslt_bf16_tn_acc")


def _ptr(*parts: str | int) -> str:
    return "".join("/" + escape_pointer(p) for p in parts)


def _names(names: Iterable[str]) -> str:
    listed = sorted(names)
    if not listed:
        return "none declared"
    shown = ", ".join(listed[:12])
    return shown + (f" (+{len(listed) - 12} more)" if len(listed) > 12 else "")


@dataclass(slots=True)
class _OpInfo:
    """What the program pass needs to know about one op."""

    params: tuple[ParamType, ...]
    has_extern: bool = False
    collective: bool = False
    tensormaps: list[tuple[int, Tensormap]] = field(default_factory=list[tuple[int, Tensormap]])


@dataclass(slots=True)
class _Use:
    """References seen so far (for the unused-declaration check)."""

    buffers: set[str] = field(default_factory=set[str])
    states: set[str] = field(default_factory=set[str])
    vars: set[str] = field(default_factory=set[str])
    ops: set[str] = field(default_factory=set[str])
    modules: set[str] = field(default_factory=set[str])
    groups: set[str] = field(default_factory=set[str])


class _Verifier:
    def __init__(self, manifest: Manifest) -> None:
        self.m = manifest
        self.problems: list[ManifestVerify] = []
        self.bounds = manifest.var_bounds
        self.vmax = manifest.var_max
        self.groups = dict(manifest.topology.groups) if manifest.topology else {}
        self.use = _Use()
        self.sizes: dict[str, int] = {}
        self.ops: dict[str, _OpInfo] = {}
        self.written: set[str] = set()
        self.extents: dict[str, int | None] = {}
        self.fills: dict[str, str] = {}

    def err(self, pointer: str, message: str, hint: str) -> None:
        self.problems.append(ManifestVerify(pointer, message, hint))

    def run(self) -> list[ManifestVerify]:
        self.header()
        for name, buf in self.m.buffers.items():
            self.buffer(name, buf)
        for name, op in self.m.ops.items():
            self.op(name, op)
        for name, program in self.m.programs.items():
            self.program(name, program)
        self.coverage()
        self.unused()
        return self.problems

    # ------------------------------------------------------------------ expressions and ranges

    def known(self, expr: Expr, at: str) -> bool:
        """Marks the expression's vars used; reports undeclared ones."""
        self.use.vars |= expr.vars
        missing = expr.vars - self.bounds.keys()
        for name in sorted(missing):
            self.err(
                at,
                f"unknown var {name!r}",
                f"declare it under /vars (declared: {_names(self.bounds)})",
            )
        return not missing

    def range(
        self, expr: Expr, at: str, bounds: Mapping[str, tuple[int, int]] | None = None
    ) -> tuple[int, int] | None:
        if not self.known(expr, at):
            return None
        try:
            return expr.range(bounds or self.bounds)
        except ExprError as exc:
            self.err(at, exc.message, exc.hint)
            return None

    def fits(
        self, expr: Expr, dtype: str, at: str, bounds: Mapping[str, tuple[int, int]] | None = None
    ) -> None:
        span = self.range(expr, at, bounds)
        lo, hi = _INT_RANGE[dtype]
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
                f"unknown var {name!r}",
                f"declare it under /vars (declared: {_names(self.bounds)})",
            )
            return False
        return True

    def group_ref(self, name: str, at: str) -> bool:
        self.use.groups.add(name)
        if name not in self.groups:
            self.err(
                at,
                f"unknown group {name!r}",
                f"declare it under /topology/groups (declared: {_names(self.groups)})",
            )
            return False
        return True

    # ------------------------------------------------------------------ header

    def header(self) -> None:
        m = self.m
        if m.schema_version != SCHEMA_VERSION:
            self.err(
                "/schema_version",
                f"schema_version {m.schema_version} is not {SCHEMA_VERSION}",
                "regenerate the manifest",
            )
        if not m.model.strip():
            self.err("/model", "empty model label", "name the model")
        for name, var in m.vars.items():
            if var.max < 1:
                self.err(
                    _ptr("vars", name, "max"),
                    f"var max {var.max} < 1",
                    "vars range over [1, max]; use max >= 1",
                )
        for name, size in self.groups.items():
            if size < 1:
                self.err(
                    _ptr("topology", "groups", name),
                    f"group size {size} < 1",
                    "a group has at least one rank",
                )
        for name, state in m.states.items():
            self.state(name, state.sizes)
        for name, module in m.modules.items():
            self.module(name, module.source, module.sha256)
        if not m.programs:
            self.err("/programs", "no programs", "declare at least one program")

    def state(self, name: str, sizes: Mapping[str, int]) -> None:
        if len(sizes) != 1:
            got = ", ".join(sizes) or "none"
            self.err(
                _ptr("states", name),
                f"state needs exactly one size field, got {got}",
                "set one of bytes, bytes_per_token, bytes_per_seq",
            )
        for key, value in sizes.items():
            if not 1 <= value <= _MAX_BYTES:
                self.err(
                    _ptr("states", name, key),
                    f"{key} {value} out of range",
                    "use a positive byte count",
                )

    def module(self, name: str, source: str, sha: str) -> None:
        if not _SHA_RE.fullmatch(sha):
            self.err(
                _ptr("modules", name, "sha256"),
                "sha256 is not 64 lowercase hex digits",
                "pin the module by its sha256 hex digest",
            )
        problem = _source_problem(source)
        if problem:
            self.err(
                _ptr("modules", name, "source"),
                problem,
                "use a file name, hf:<org>/<repo>/<path>[@rev] or https://...",
            )

    # ------------------------------------------------------------------ buffers

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
        if nbytes > _MAX_BYTES:
            self.err(
                at,
                f"{nbytes} bytes at the vars' maxima overflows 63 bits",
                "lower the var maxima or the dims",
            )
            return None
        return nbytes

    def buffer(self, name: str, buf: Buffer) -> None:
        at = _ptr("buffers", name)
        size = self.shape(buf.shape, buf.dtype, at + "/shape")
        if size is not None:
            self.sizes[name] = size
        if buf.placement == "host" and buf.kind != "weight":
            self.err(
                at + "/placement",
                f"host placement on a {buf.kind} buffer",
                "only weight buffers may live on the host",
            )
        if buf.export and (buf.placement == "host" or buf.kind == "peer"):
            self.err(
                at + "/export",
                f"export on a {'host' if buf.placement == 'host' else 'peer'} buffer",
                "export device buffers only",
            )
        if buf.kind == "peer":
            self.peer(name, buf, at)
        else:
            for key in ("of", "group"):
                if getattr(buf, key) is not None:
                    self.err(
                        f"{at}/{key}",
                        f"{key} on a {buf.kind} buffer",
                        "of and group belong to peer buffers only",
                    )
        self.bind(buf, at)
        self.fill(buf, at)
        if buf.domain is not None:
            self.domain(name, buf, buf.domain, at + "/domain")

    def peer(self, name: str, buf: Buffer, at: str) -> None:
        if buf.dtype != "u64":
            self.err(
                at + "/dtype",
                f"peer buffer of {buf.dtype}",
                'a peer buffer is "u64" (one address per rank)',
            )
        if buf.group is None:
            self.err(
                at, "peer buffer without group", "name the topology group whose ranks it addresses"
            )
        elif self.group_ref(buf.group, at + "/group"):
            size = self.groups[buf.group]
            if len(buf.shape) != 1 or buf.shape[0].const != size:
                self.err(
                    at + "/shape",
                    f"peer shape is not [{size}]",
                    "a peer buffer holds one u64 per rank: [group size]",
                )
        if buf.domain is not None:
            self.err(
                at + "/domain",
                "domain on a peer buffer",
                "remove it: the runtime fills peer buffers",
            )
        self.peer_of(name, buf.of, at)

    def peer_of(self, name: str, of: str | None, at: str) -> None:
        if of is None:
            self.err(at, "peer buffer without of", "name the export buffer or state it mirrors")
            return
        target = self.m.buffers.get(of)
        if of in self.m.states:
            self.use.states.add(of)
        elif target is None:
            self.err(
                at + "/of", f"unknown buffer or state {of!r}", "name an export buffer or a state"
            )
        elif of == name or target.kind == "peer" or not target.export:
            self.err(
                at + "/of",
                f"of {of!r} is not an export buffer",
                'point at a buffer with "export": true or a state',
            )
        else:
            self.use.buffers.add(of)

    def bind(self, buf: Buffer, at: str) -> None:
        if buf.bind is None:
            if buf.kind == "source":
                self.err(
                    at, "source buffer without bind", "list the checkpoint tensors that fill it"
                )
            return
        if buf.kind not in ("weight", "source"):
            self.err(
                at + "/bind",
                f"bind on a {buf.kind} buffer",
                "only weight and source buffers bind checkpoint tensors",
            )
            return
        if not buf.bind:
            self.err(at + "/bind", "empty bind", "list at least one tensor segment")
        for i, seg in enumerate(buf.bind):
            self.segment(seg, f"{at}/bind/{i}")

    def segment(self, seg: Segment, at: str) -> None:
        if isinstance(seg.tensor, RankTensors):
            self.rank_table(seg.tensor.group, len(seg.tensor.tensors), at + "/tensor")
        for key in ("rows", "cols"):
            value: tuple[int, int] | RankRanges | None = getattr(seg, key)
            if isinstance(value, RankRanges):
                self.rank_table(value.group, len(value.ranges), f"{at}/{key}")
                for j, pair in enumerate(value.ranges):
                    self.half_open(pair, f"{at}/{key}/ranges/{j}")
            elif value is not None:
                self.half_open(value, f"{at}/{key}")
        if seg.interleave is not None and seg.interleave.rows < 1:
            self.err(
                at + "/interleave/rows",
                f"interleave rows {seg.interleave.rows} < 1",
                "interleave blocks of at least one row",
            )

    def rank_table(self, group: str, count: int, at: str) -> None:
        if self.group_ref(group, at + "/group") and count != self.groups[group]:
            self.err(
                at,
                f"{count} entries for group {group!r} of {self.groups[group]} ranks",
                "give one entry per rank",
            )

    def half_open(self, pair: tuple[int, int], at: str) -> None:
        if not 0 <= pair[0] < pair[1]:
            self.err(
                at,
                f"range [{pair[0]}, {pair[1]}) is empty or negative",
                "use [from, to) with 0 <= from < to",
            )

    def fill(self, buf: Buffer, at: str) -> None:
        if buf.fill is None:
            return
        first = self.fills.setdefault(buf.fill, at)
        if first != at:
            self.err(
                at + "/fill",
                f"fill {buf.fill!r} again (first at {first})",
                "each fill role appears at most once",
            )
        wanted = "input" if buf.fill in INPUT_FILLS else "output"
        if buf.kind != wanted or buf.dtype not in ("i32", "i64"):
            self.err(
                at + "/fill",
                f"fill {buf.fill!r} on {buf.kind} buffer of {buf.dtype}",
                f"fill {buf.fill!r} belongs on an i32/i64 {wanted} buffer",
            )

    def domain(self, name: str, buf: Buffer, dom: Domain, at: str) -> None:
        integer = buf.dtype in _DTYPE_RANGE
        if dom.monotone and len(buf.shape) != 1:
            self.err(
                at + "/monotone",
                "monotone on a buffer that is not 1-D",
                "monotone applies to 1-D buffers only",
            )
        if dom.index_into is not None:
            self.index_domain(name, buf, dom, at, integer)
            return
        if dom.stride is not None:
            self.err(
                at + "/stride", "stride without index_into", "stride scales an index_into domain"
            )
        bounds: list[int | float | None] = []
        for key in ("min", "max"):
            bounds.append(self.domain_bound(getattr(dom, key), buf.dtype, integer, f"{at}/{key}"))
        lo, hi = bounds
        if lo is not None and hi is not None and lo > hi:
            self.err(at, f"domain min {lo} > max {hi}", "use min <= max")

    def domain_bound(
        self, bound: int | float | Expr | None, dtype: str, integer: bool, at: str
    ) -> int | float | None:
        if bound is None:
            return None
        if isinstance(bound, float):
            if integer:
                self.err(at, f"float bound {bound} on a buffer of {dtype}", "use an integer bound")
            return bound
        if isinstance(bound, Expr):
            if not self.known(bound, at):
                return None
            value = bound.eval(self.vmax)
        else:
            value = bound
        if integer and not _DTYPE_RANGE[dtype][0] <= value <= _DTYPE_RANGE[dtype][1]:
            self.err(at, f"bound {value} does not fit {dtype}", f"keep it within {dtype}'s range")
        return value

    def index_domain(self, name: str, buf: Buffer, dom: Domain, at: str, integer: bool) -> None:
        target = dom.index_into
        if dom.min is not None or dom.max is not None:
            self.err(
                at,
                "index_into together with min/max",
                "use either {index_into, stride} or {min, max}",
            )
        if not integer:
            self.err(
                at + "/index_into",
                f"index_into on a buffer of {buf.dtype}",
                "indices live in integer buffers",
            )
        if target == name or (target not in self.m.buffers and target not in self.m.states):
            self.err(
                at + "/index_into",
                f"index_into {target!r} is not another buffer or a state",
                "name the buffer or state the elements index",
            )
        if dom.stride is not None and dom.stride < 1:
            self.err(at + "/stride", f"stride {dom.stride} < 1", "use a stride >= 1")

    # ------------------------------------------------------------------ ops and launches

    def op(self, name: str, op: Op) -> None:
        at = _ptr("ops", name)
        info = _OpInfo(op.params)
        self.ops[name] = info
        for i, p in enumerate(op.params):
            if p.kind == "bytes":
                self.err(
                    f"{at}/params/{i}",
                    "bytes<n> in an op interface",
                    "bytes<n> params are launch-private: fill them with a pack",
                )
        scratch_sizes: dict[str, int] = {}
        for sname, sc in op.impl.scratch.items():
            size = self.shape(
                sc.shape, sc.dtype, f"{at}/impl/scratch/{escape_pointer(sname)}/shape"
            )
            scratch_sizes[sname] = size or 0
        if not op.impl.launches:
            self.err(
                at + "/impl/launches", "op with no launches", "give the impl at least one launch"
            )
        flow = _ImplFlow(op)
        for j, launch in enumerate(op.impl.launches):
            lat = f"{at}/impl/launches/{j}"
            if isinstance(launch, KernelLaunch):
                self.kernel(launch, lat)
            else:
                info.has_extern = True
                info.collective |= launch.signature.collective
                self.extern(launch, lat)
            self.launch_args(op, launch, lat, flow, info)
        flow.finish(self, at)

    def launch_bounds(
        self, launch: KernelLaunch | ExternLaunch, at: str
    ) -> dict[str, tuple[int, int]]:
        when = launch.when
        if when is None or not self.var_ref(when.var, at + "/when/var"):
            return self.bounds
        top = self.vmax[when.var]
        lo = 1 if when.min is None else when.min
        hi = top if when.max is None else when.max
        if lo > hi or lo > top or hi < 1:
            self.err(
                at + "/when",
                f"when range [{lo}, {hi}] is empty within {when.var} in [1, {top}]",
                "use 1 <= min <= max <= the var's max",
            )
            return self.bounds
        return {**self.bounds, when.var: (max(lo, 1), min(hi, top))}

    def kernel(self, launch: KernelLaunch, at: str) -> None:
        self.use.modules.add(launch.module)
        if launch.module not in self.m.modules:
            self.err(
                at + "/module",
                f"unknown module {launch.module!r}",
                f"declare it under /modules (declared: {_names(self.m.modules)})",
            )
        self.block(launch.block, at + "/block")
        bounds = self.launch_bounds(launch, at)
        limits = (CUDA_LIMITS.grid_x, CUDA_LIMITS.grid_yz, CUDA_LIMITS.grid_yz)
        for i, (dim, limit) in enumerate(zip(launch.grid, limits, strict=True)):
            span = self.range(dim, f"{at}/grid/{i}", bounds)
            if span is None:
                continue
            if span[0] < 1:
                self.err(
                    f"{at}/grid/{i}",
                    f"grid dim can be {span[0]}",
                    "grids must be >= 1 at the vars' minimum",
                )
            if span[1] > limit:
                self.err(
                    f"{at}/grid/{i}",
                    f"grid dim reaches {span[1]} > {limit}",
                    "stay within CUDA's grid limits at the vars' maximum",
                )
        smem = self.range(launch.shared_mem, at + "/shared_mem", bounds)
        if smem is not None and smem[1] > CUDA_LIMITS.shared_mem:
            self.err(
                at + "/shared_mem",
                f"dynamic shared memory reaches {smem[1]} bytes",
                f"sm_90 allows at most {CUDA_LIMITS.shared_mem} bytes (opt-in)",
            )
        if launch.cluster is not None:
            self.cluster(launch, at)
        params = launch.params
        if params is not None and sum(p.size for p in params) > CUDA_LIMITS.param_bytes:
            self.err(
                at + "/params",
                "kernel params exceed 32764 bytes",
                "pass large data through a buffer",
            )

    def block(self, block: tuple[int, int, int], at: str) -> None:
        x, y, z = block
        if (
            min(block) < 1
            or x > CUDA_LIMITS.block_xy
            or y > CUDA_LIMITS.block_xy
            or z > CUDA_LIMITS.block_z
        ):
            self.err(
                at,
                f"block {list(block)} outside CUDA limits",
                "each dim >= 1; x, y <= 1024; z <= 64",
            )
        elif x * y * z > CUDA_LIMITS.block_threads:
            self.err(at, f"block of {x * y * z} threads", "a block has at most 1024 threads")

    def cluster(self, launch: KernelLaunch, at: str) -> None:
        cluster = launch.cluster or (1, 1, 1)
        if min(cluster) < 1 or math.prod(cluster) > CUDA_LIMITS.cluster_blocks:
            self.err(
                at + "/cluster",
                f"cluster {list(cluster)} outside limits",
                "each dim >= 1, at most 16 blocks in all",
            )
            return
        for i, (dim, c) in enumerate(zip(launch.grid, cluster, strict=True)):
            if c > 1 and (dim.divisor == 0 or dim.divisor % c):
                self.err(
                    f"{at}/grid/{i}",
                    f"grid dim is not always a multiple of cluster {c}",
                    "make the grid dim a multiple of the cluster dim",
                )

    def extern(self, launch: ExternLaunch, at: str) -> None:
        self.launch_bounds(launch, at)
        if launch.algo is not None and launch.entry not in _ALGO_EXTERNS:
            self.err(at + "/algo", f"algo on {launch.entry}", "algo pins cublasLt bf16 GEMMs only")
        if launch.signature.collective:
            args = launch.args or ()
            if not args or not isinstance(args[-1], RankArg):
                self.err(
                    at + "/args",
                    f'{launch.entry} needs {{"rank": group}} as its last arg',
                    'wire [send, recv, count, {"rank": g}]',
                )

    def launch_params(
        self, op: Op, launch: KernelLaunch | ExternLaunch, at: str
    ) -> tuple[ParamType, ...] | None:
        if isinstance(launch, KernelLaunch):
            return launch.params if launch.params is not None else op.params
        sig = launch.signature
        n = len(launch.args) if launch.args is not None else len(op.params)
        if not len(sig.required) <= n <= len(sig.required) + len(sig.optional):
            want = f"{len(sig.required)}" + (
                f"..{len(sig.required) + len(sig.optional)}" if sig.optional else ""
            )
            self.err(
                at + ("/args" if launch.args is not None else ""),
                f"{launch.entry} takes {want} args, got {n}",
                "see docs/manifest.md, extern launches",
            )
            return None
        return (sig.required + sig.optional)[:n]

    def launch_args(
        self, op: Op, launch: KernelLaunch | ExternLaunch, at: str, flow: _ImplFlow, info: _OpInfo
    ) -> None:
        params = self.launch_params(op, launch, at)
        if params is None:
            return
        args: Sequence[LaunchArg] = (
            launch.args
            if launch.args is not None
            else [ParamArg(param=i) for i in range(len(op.params))]
        )
        if len(args) != len(params):
            where = at + "/args" if launch.args is not None else at
            self.err(
                where, f"{len(args)} args for {len(params)} params", "pass one arg per launch param"
            )
            return
        bounds = self.launch_bounds_quiet(launch)
        step = flow.step()
        for k, (arg, param) in enumerate(zip(args, params, strict=True)):
            self.launch_arg(op, arg, param, f"{at}/args/{k}", bounds, step, info)
        flow.commit(step)

    def launch_bounds_quiet(
        self, launch: KernelLaunch | ExternLaunch
    ) -> Mapping[str, tuple[int, int]]:
        when = launch.when
        if when is None or when.var not in self.vmax:
            return self.bounds
        top = self.vmax[when.var]
        lo = max(1, when.min or 1)
        hi = min(top, when.max if when.max is not None else top)
        return {**self.bounds, when.var: (lo, hi)} if lo <= hi else self.bounds

    def launch_arg(
        self,
        op: Op,
        arg: LaunchArg,
        param: ParamType,
        at: str,
        bounds: Mapping[str, tuple[int, int]],
        step: _Step,
        info: _OpInfo,
    ) -> None:
        if isinstance(arg, ParamArg):
            self.forward(op, arg.param, param, at, step)
        elif isinstance(arg, ScratchArg):
            self.scratch_arg(op, arg.scratch, param, at, step)
        elif isinstance(arg, PackArg):
            self.pack(op, arg.pack, param, at, bounds, step, info)
        else:
            self.scalar_arg(arg, param, at, bounds)

    def forward(self, op: Op, index: int, param: ParamType, at: str, step: _Step) -> None:
        if index >= len(op.params):
            self.err(
                at + "/param",
                f"param {index} out of range",
                f"the op has {len(op.params)} params (0..{len(op.params) - 1})",
            )
            return
        iface = op.params[index]
        if iface.kind != param.kind or iface.dtype != param.dtype:
            self.err(
                at,
                f"forwards `{iface}` into a `{param}` slot",
                "forward a param of the same kind and dtype",
            )
            return
        if param.writes and not iface.writes:
            self.err(
                at,
                f"writes through in param {index}",
                f"declare param {index} out or inout, or pass it to an in slot",
            )
        if iface.is_pointer:
            step.touch(("param", index), param.reads, param.writes)

    def scratch_arg(self, op: Op, name: str, param: ParamType, at: str, step: _Step) -> None:
        sc = op.impl.scratch.get(name)
        if sc is None:
            self.err(
                at + "/scratch",
                f"unknown scratch {name!r}",
                f"declare it under impl/scratch (declared: {_names(op.impl.scratch)})",
            )
            return
        if param.kind != "buffer" or param.dtype != sc.dtype:
            self.err(
                at,
                f"scratch {name!r} of {sc.dtype} into a `{param}` slot",
                f"the slot must be a buffer<{sc.dtype}>",
            )
            return
        step.touch(("scratch", name), param.reads, param.writes)

    def scalar_arg(
        self,
        arg: LaunchArg | object,
        param: ParamType,
        at: str,
        bounds: Mapping[str, tuple[int, int]],
    ) -> None:
        kind = _scalar_kind(arg)
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
        if dtype not in _INT_RANGE:
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
            if not math.isfinite(arg.f32) or abs(arg.f32) > _F32_MAX:
                self.err(at, f"{arg.f32} does not fit f32", "use a finite value within f32 range")
            return
        kind = _scalar_kind(arg)
        value: int = getattr(arg, kind)
        lo, hi = _INT_RANGE[kind]
        if not lo <= value <= hi:
            self.err(at, f"{value} does not fit {kind}", f"keep it within {lo}..{hi}")

    # ------------------------------------------------------------------ packs

    def pack(
        self,
        op: Op,
        pack: Pack,
        param: ParamType,
        at: str,
        bounds: Mapping[str, tuple[int, int]],
        step: _Step,
        info: _OpInfo,
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
        step: _Step,
        info: _OpInfo,
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
                    f"unknown scratch {f.scratch!r}",
                    f"declare it under impl/scratch (declared: {_names(op.impl.scratch)})",
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

    def pack_param(self, op: Op, f: PackParam, at: str, step: _Step) -> int | None:
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
        self, op: Op, f: PackTensormap, at: str, step: _Step, info: _OpInfo
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
            self.known(d, f"{tat}/dims/{i}")
        for i, s in enumerate(tm.strides):
            if self.known(s, f"{tat}/strides/{i}") and (s.divisor == 0 or s.divisor % 16):
                self.err(
                    f"{tat}/strides/{i}",
                    "stride is not always a non-zero multiple of 16",
                    "tensormap byte strides are multiples of 16",
                )
        return self.width_is(f.width if f.width is not None else 128, (128,), at)

    # ------------------------------------------------------------------ programs

    def program(self, name: str, program: Program) -> None:
        at = _ptr("programs", name)
        self.flags(program, at)
        if not program.calls:
            self.err(at + "/calls", "program with no calls", "give it at least one call")
        flow = _ProgramFlow(self, name, program, at)
        for i, call in enumerate(program.calls):
            self.call(call, f"{at}/calls/{i}", flow)

    def flags(self, program: Program, at: str) -> None:
        if program.derive and (program.once or program.graph or program.batch is not None):
            self.err(
                at + "/derive",
                "derive together with once, graph or batch",
                "derive programs run inside weight loading only",
            )
        if program.once and (program.graph or program.batch is not None):
            self.err(
                at + "/once",
                "once together with graph or batch",
                "once programs run one time after load",
            )
        batch = program.batch
        if batch is None:
            return
        if batch.groups < 1:
            self.err(at + "/batch/groups", f"groups {batch.groups} < 1", "use groups >= 1")
        if isinstance(batch.rows, int):
            if batch.rows < 1:
                self.err(
                    at + "/batch/rows", f"rows {batch.rows} < 1", "use rows >= 1 or a var name"
                )
        else:
            self.var_ref(batch.rows, at + "/batch/rows")
        for key in ("span", "context"):
            value = getattr(batch, key)
            if value is not None:
                self.var_ref(value, f"{at}/batch/{key}")

    def call(self, call: Call, at: str, flow: _ProgramFlow) -> None:
        self.use.ops.add(call.op)
        op = self.m.ops.get(call.op)
        info = self.ops.get(call.op)
        if op is None or info is None:
            self.err(
                at + "/op",
                f"unknown op {call.op!r}",
                f"declare it under /ops (declared: {_names(self.m.ops)})",
            )
            return
        if len(call.args) != len(op.params):
            self.err(
                at + "/args",
                f"{len(call.args)} args for op {call.op!r} of {len(op.params)} params",
                "pass one arg per interface param",
            )
            return
        if info.collective:
            flow.collective(at)
        reads: list[tuple[str, str]] = []
        writes: list[tuple[str, str]] = []
        for k, (arg, param) in enumerate(zip(call.args, op.params, strict=True)):
            aat = f"{at}/args/{k}"
            if isinstance(arg, BufArg):
                if self.buf_arg(arg, param, aat, info):
                    self.tensormap_bounds(arg, k, info, aat)
                    (reads if param.reads else writes).append((arg.buf, aat))
                    if param.reads and param.writes:
                        writes.append((arg.buf, aat))
            elif isinstance(arg, StateArg):
                self.state_arg(arg, param, aat)
                flow.state(aat)
            else:
                self.scalar_arg(arg, param, aat, self.bounds)
        flow.apply(reads, writes, info)

    def buf_arg(self, arg: BufArg, param: ParamType, at: str, info: _OpInfo) -> bool:
        self.use.buffers.add(arg.buf)
        buf = self.m.buffers.get(arg.buf)
        if buf is None:
            self.err(
                at + "/buf",
                f"unknown buffer {arg.buf!r}",
                f"declare it under /buffers (declared: {_names(self.m.buffers)})",
            )
            return False
        if param.kind != "buffer" or param.dtype != buf.dtype:
            self.err(
                at,
                f"buffer {arg.buf!r} of {buf.dtype} for a `{param}` param",
                "pass a buffer of the param's dtype",
            )
            return False
        if buf.kind == "peer" and info.has_extern:
            self.err(
                at,
                f"peer buffer {arg.buf!r} reaches an op with an extern launch",
                "externs may not receive peer buffers",
            )
        self.offset(arg.offset, DTYPE_BYTES[buf.dtype], self.sizes.get(arg.buf), at + "/offset")
        return True

    def offset(self, offset: Expr, align: int, size: int | None, at: str) -> int | None:
        span = self.range(offset, at)
        if span is None:
            return None
        if offset.divisor % align:
            self.err(
                at, f"offset is not always a multiple of {align}", f"align byte offsets to {align}"
            )
        if size is not None and span[1] >= size:
            self.err(
                at,
                f"offset reaches {span[1]} within {size} bytes",
                "keep offsets inside the buffer at the vars' maxima",
            )
        return span[1]

    def state_arg(self, arg: StateArg, param: ParamType, at: str) -> None:
        self.use.states.add(arg.state)
        state = self.m.states.get(arg.state)
        if state is None:
            self.err(
                at + "/state",
                f"unknown state {arg.state!r}",
                f"declare it under /states (declared: {_names(self.m.states)})",
            )
            return
        if param.kind != "state":
            self.err(
                at, f"state {arg.state!r} for a `{param}` param", "states go to state params only"
            )
            return
        self.offset(arg.offset, _STATE_ALIGN, self.state_extent(arg.state), at + "/offset")

    def state_extent(self, name: str) -> int | None:
        """Bytes a state offset may address: a fixed state, one slot, or one page (when a domain
        declares the page size as its index_into stride)."""
        if name not in self.extents:
            self.extents[name] = self._state_extent(name)
        return self.extents[name]

    def _state_extent(self, name: str) -> int | None:
        sizes = self.m.states[name].sizes
        if "bytes" in sizes:
            return sizes["bytes"]
        if "bytes_per_seq" in sizes:
            return sizes["bytes_per_seq"]
        pages = [
            b.domain.stride or 1
            for b in self.m.buffers.values()
            if b.domain is not None and b.domain.index_into == name and b.domain.stride is not None
        ]
        return sizes.get("bytes_per_token", 0) * max(pages) if pages else None

    def tensormap_bounds(self, arg: BufArg, index: int, info: _OpInfo, at: str) -> None:
        size = self.sizes.get(arg.buf)
        if size is None:
            return
        for param, tm in info.tensormaps:
            if param != index or tm.wrap or not tm.dims or tm.dims[-1].const == 0:
                continue
            if (
                any(d.vars - self.vmax.keys() for d in (*tm.dims, *tm.strides))
                or len(tm.strides) != len(tm.dims) - 1
            ):
                continue
            dims = [d.eval(self.vmax) for d in tm.dims]
            strides = [s.eval(self.vmax) for s in tm.strides]
            footprint = -(-dims[0] * _TENSORMAP_NIBBLES[tm.dtype] // 2)
            footprint += sum((d - 1) * s for d, s in zip(dims[1:], strides, strict=True))
            room = (
                size - arg.offset.eval(self.vmax)
                if not (arg.offset.vars - self.vmax.keys())
                else size
            )
            if footprint > room:
                self.err(
                    at,
                    f"tensormap footprint {footprint} bytes exceeds the {room} bytes past the offset",
                    "shrink the tensormap dims or pass a larger buffer",
                )

    # ------------------------------------------------------------------ whole-manifest checks

    def coverage(self) -> None:
        for name, buf in self.m.buffers.items():
            if name not in self.use.buffers:
                continue
            derived = buf.kind == "weight" and buf.bind is None
            if (buf.kind in ("output", "carry") or derived) and name not in self.written:
                what = "a derive program" if derived else "some program"
                self.err(
                    _ptr("buffers", name),
                    f"{buf.kind} {name!r} is never written",
                    f"write it in {what}" + ("" if not derived else ", or bind it"),
                )

    def unused(self) -> None:
        sections: list[tuple[str, Iterable[str], set[str]]] = [
            ("buffers", self.m.buffers, self.use.buffers),
            ("states", self.m.states, self.use.states),
            ("vars", self.m.vars, self.use.vars),
            ("ops", self.m.ops, self.use.ops),
            ("modules", self.m.modules, self.use.modules),
        ]
        for section, declared, used in sections:
            for name in declared:
                if name not in used:
                    self.err(
                        _ptr(section, name),
                        f"unused {section[:-1]} {name!r}",
                        "remove it or reference it",
                    )
        for name in self.groups:
            if name not in self.use.groups:
                self.err(
                    _ptr("topology", "groups", name),
                    f"unused group {name!r}",
                    "remove it or reference it",
                )


def _scalar_kind(arg: object) -> str:
    return str(getattr(arg, "KIND", type(arg).__name__))


def _source_problem(source: str) -> str | None:
    if not source.strip():
        return "empty source"
    if source.startswith("hf:"):
        path, _, rev = source[3:].partition("@")
        parts = path.split("/")
        if (
            len(parts) < 3
            or any(p in ("", ".", "..") for p in parts)
            or ("@" in source and not rev)
        ):
            return f"malformed hf: source {source!r}"
    elif source.startswith("https://"):
        if not source[len("https://") :].split("/")[0]:
            return f"https source {source!r} has no host"
    elif "://" in source:
        return f"unsupported source scheme in {source!r}"
    return None


# ---------------------------------------------------------------------- dataflow helpers

_Key = tuple[str, int | str]


@dataclass(slots=True)
class _Step:
    """The reads and writes of one launch (keys: ("param", i) or ("scratch", name))."""

    reads: set[_Key] = field(default_factory=set[_Key])
    writes: set[_Key] = field(default_factory=set[_Key])

    def touch(self, key: _Key, reads: bool, writes: bool) -> None:
        if reads:
            self.reads.add(key)
        if writes:
            self.writes.add(key)


class _ImplFlow:
    """Launch-order dataflow inside one impl: scratch written before read, out params written."""

    def __init__(self, op: Op) -> None:
        self.op = op
        self.written: set[_Key] = set()
        self.touched: set[_Key] = set()
        self.early_reads: list[tuple[str, int]] = []
        self.index = 0

    def step(self) -> _Step:
        return _Step()

    def commit(self, step: _Step) -> None:
        for key in sorted(step.reads, key=str):
            if key[0] == "scratch" and key not in self.written:
                self.early_reads.append((str(key[1]), self.index))
        self.written |= step.writes
        self.touched |= step.reads | step.writes
        self.index += 1

    def finish(self, v: _Verifier, at: str) -> None:
        for name, j in self.early_reads:
            v.err(
                f"{at}/impl/launches/{j}",
                f"reads scratch {name!r} before any launch writes it",
                "write scratch in an earlier launch",
            )
        for i, p in enumerate(self.op.params):
            if p.direction == "out" and ("param", i) not in self.written:
                v.err(
                    f"{at}/params/{i}",
                    f"out param {i} is never written by a launch",
                    "write it in some launch, or declare it in",
                )
        for name in self.op.impl.scratch:
            if ("scratch", name) not in self.touched:
                v.err(
                    f"{at}/impl/scratch/{escape_pointer(name)}",
                    f"unused scratch {name!r}",
                    "remove it or pass it to a launch",
                )


class _ProgramFlow:
    """Call-order dataflow inside one program."""

    def __init__(self, v: _Verifier, name: str, program: Program, at: str) -> None:
        self.v = v
        self.name = name
        self.program = program
        self.at = at
        self.written: set[str] = set()

    def collective(self, at: str) -> None:
        if self.program.derive:
            self.v.err(
                at + "/op",
                "derive program calls a collective",
                "derive programs run per rank inside weight loading",
            )

    def state(self, at: str) -> None:
        if self.program.derive:
            self.v.err(at, "derive program touches a state", "derive programs build weights only")

    def apply(
        self, reads: list[tuple[str, str]], writes: list[tuple[str, str]], info: _OpInfo
    ) -> None:
        buffers = self.v.m.buffers
        for name, at in reads:
            self.read(name, buffers[name], at)
        for name, at in writes:
            self.write(name, buffers[name], at)

    def read(self, name: str, buf: Buffer, at: str) -> None:
        derive = self.program.derive
        if buf.kind == "source" and not derive:
            self.v.err(
                at,
                f"source {name!r} read outside a derive program",
                "sources live only during load; read them in derive programs",
            )
        elif derive and buf.kind in ("input", "output", "peer"):
            self.v.err(
                at,
                f"derive program touches {buf.kind} {name!r}",
                "derive programs build weights only",
            )
        elif buf.kind in ("workspace", "output") and name not in self.written:
            self.v.err(
                at,
                f"reads {buf.kind} {name!r} before this program writes it",
                "write it in an earlier call of the program",
            )

    def write(self, name: str, buf: Buffer, at: str) -> None:
        kind = buf.kind
        derived_weight = kind == "weight" and buf.bind is None and self.program.derive
        if kind in ("input", "source", "peer") or (kind == "weight" and not derived_weight):
            hint = {
                "input": "inputs are written by the runtime only; use a carry buffer for device-written state",
                "source": "sources are read-only checkpoint bytes",
                "peer": "the runtime fills peer buffers; ops only read them",
                "weight": "weights come from bind; derive unbound weights in a derive program",
            }[kind]
            self.v.err(at, f"writes {kind} {name!r}", hint)
            return
        if self.program.derive and kind in ("output",):
            self.v.err(
                at, f"derive program touches {kind} {name!r}", "derive programs build weights only"
            )
        self.written.add(name)
        self.v.written.add(name)


# ---------------------------------------------------------------------- entry points


def check(manifest: Manifest) -> list[ManifestVerify]:
    """Every problem with a parsed manifest's meaning, in document order of discovery."""
    return _Verifier(manifest).run()


def verify(manifest: Manifest) -> None:
    """Checks a parsed manifest.

    Raises:
        ManifestRejected: with every `ManifestVerify` problem found.
    """
    problems = check(manifest)
    if problems:
        raise ManifestRejected(problems)


def load_manifest(data: str | bytes) -> Manifest:
    """Parses and verifies manifest text.

    Raises:
        ManifestRejected: with every `ManifestParse` problem, or else every `ManifestVerify` one.
    """
    manifest = parse_manifest(data)
    problems: list[ManifestError] = [*check(manifest)]
    if problems:
        raise ManifestRejected(problems)
    return manifest
