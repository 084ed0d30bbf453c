"""Verifier checks of programs: flags, calls, offsets, dataflow, coverage, unused names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from kern_manifest._verify_base import (
    STATE_ALIGN,
    TENSORMAP_NIBBLES,
    Base,
    OpInfo,
    names,
    ptr,
)
from kern_manifest._verify_fp8 import Fp8Checks
from kern_manifest.errors import short
from kern_manifest.expr import Expr
from kern_manifest.schema import (
    DTYPE_BYTES,
    BufArg,
    Buffer,
    Call,
    ParamType,
    Program,
    StateArg,
)

__all__ = ["ProgramChecks", "ProgramFlow"]


class ProgramFlow:
    """Call-order dataflow inside one program."""

    def __init__(self, v: Base, name: str, program: Program, at: str) -> None:
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
        self, reads: list[tuple[str, str]], writes: list[tuple[str, str]], info: OpInfo
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
                f"source {short(name)!r} read outside a derive program",
                "sources live only during load; read them in derive programs",
            )
        elif derive and buf.kind in ("input", "output", "peer"):
            self.v.err(
                at,
                f"derive program touches {buf.kind} {short(name)!r}",
                "derive programs build weights only",
            )
        elif buf.kind in ("workspace", "output") and name not in self.written:
            self.v.err(
                at,
                f"reads {buf.kind} {short(name)!r} before this program writes it",
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
            self.v.err(at, f"writes {kind} {short(name)!r}", hint)
            return
        if self.program.derive and kind in ("output",):
            self.v.err(
                at, f"derive program touches {kind} {short(name)!r}", "derive programs build weights only"
            )
        self.written.add(name)
        self.v.written.add(name)


class ProgramChecks(Fp8Checks):
    """Programs and calls; whole-manifest coverage and unused declarations."""

    def program(self, name: str, program: Program) -> None:
        at = ptr("programs", name)
        self.flags(program, at)
        if not program.calls:
            self.err(at + "/calls", "program with no calls", "give it at least one call")
        flow = ProgramFlow(self, name, program, at)
        labels: dict[str, int] = {}
        for i, call in enumerate(program.calls):
            if call.label is not None:
                self.label(call.label, i, labels, f"{at}/calls/{i}/label")
            self.call(call, f"{at}/calls/{i}", flow)

    def label(self, label: str, index: int, seen: dict[str, int], at: str) -> None:
        first = seen.setdefault(label, index)
        if first != index:
            self.err(
                at,
                f"label {short(label)!r} again (first at call {first})",
                "give each call of a program its own label",
            )

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

    def call(self, call: Call, at: str, flow: ProgramFlow) -> None:
        self.use.ops.add(call.op)
        op = self.m.ops.get(call.op)
        info = self.ops.get(call.op)
        if op is None or info is None:
            self.err(
                at + "/op",
                f"unknown op {short(call.op)!r}",
                f"declare it under /ops (declared: {names(self.m.ops)})",
            )
            return
        if len(call.args) != len(op.params):
            self.err(
                at + "/args",
                f"{len(call.args)} args for op {short(call.op)!r} of {len(op.params)} params",
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
        self.fp8_call(call.args, info, at)
        flow.apply(reads, writes, info)

    def buf_arg(self, arg: BufArg, param: ParamType, at: str, info: OpInfo) -> bool:
        self.use.buffers.add(arg.buf)
        buf = self.m.buffers.get(arg.buf)
        if buf is None:
            self.err(
                at + "/buf",
                f"unknown buffer {short(arg.buf)!r}",
                f"declare it under /buffers (declared: {names(self.m.buffers)})",
            )
            return False
        if param.kind != "buffer" or param.dtype != buf.dtype:
            self.err(
                at,
                f"buffer {short(arg.buf)!r} of {buf.dtype} for a `{param}` param",
                "pass a buffer of the param's dtype",
            )
            return False
        if buf.kind == "peer" and info.has_extern:
            self.err(
                at,
                f"peer buffer {short(arg.buf)!r} reaches an op with an extern launch",
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
                f"unknown state {short(arg.state)!r}",
                f"declare it under /states (declared: {names(self.m.states)})",
            )
            return
        if param.kind != "state":
            self.err(
                at, f"state {short(arg.state)!r} for a `{param}` param", "states go to state params only"
            )
            return
        self.offset(arg.offset, STATE_ALIGN, self.state_extent(arg.state), at + "/offset")
        if state.slices is not None and arg.offset.vars:
            self.err(
                at + "/offset",
                f"offset into sliced state {short(arg.state)!r} reads vars {sorted(map(short, arg.offset.vars))}",
                "a sliced state's offsets are constants (the slice a call touches is known at load)",
            )

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

    def tensormap_bounds(self, arg: BufArg, index: int, info: OpInfo, at: str) -> None:
        size = self.sizes.get(arg.buf)
        if size is None:
            return
        for param, tm in info.tensormaps:
            if param != index or tm.wrap or not tm.dims or tm.dims[-1].const == 0:
                continue
            dims = [self.at_max(d) for d in tm.dims]
            strides = [self.at_max(s) for s in tm.strides]
            if len(strides) != len(dims) - 1 or None in dims or None in strides:
                continue
            footprint = self.footprint(tm.dtype, cast("list[int]", dims), cast("list[int]", strides))
            offset = self.at_max(arg.offset)
            room = size if offset is None else size - offset
            if footprint > room:
                self.err(
                    at,
                    f"tensormap footprint {footprint} bytes exceeds the {room} bytes past the offset",
                    "shrink the tensormap dims or pass a larger buffer",
                )

    @staticmethod
    def footprint(dtype: str, dims: list[int], strides: list[int]) -> int:
        """Bytes a tensormap spans: the packed first dim plus (dim - 1) strides of the rest."""
        first = -(-dims[0] * TENSORMAP_NIBBLES[dtype] // 2)
        return first + sum((d - 1) * s for d, s in zip(dims[1:], strides, strict=True))

    def coverage(self) -> None:
        for name, buf in self.m.buffers.items():
            if name not in self.use.buffers:
                continue
            derived = buf.kind == "weight" and buf.bind is None
            if (buf.kind in ("output", "carry") or derived) and name not in self.written:
                what = "a derive program" if derived else "some program"
                self.err(
                    ptr("buffers", name),
                    f"{buf.kind} {short(name)!r} is never written",
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
                        ptr(section, name),
                        f"unused {section[:-1]} {short(name)!r}",
                        "remove it or reference it",
                    )
        for name in self.groups:
            if name not in self.use.groups:
                self.err(
                    ptr("topology", "groups", name),
                    f"unused group {short(name)!r}",
                    "remove it or reference it",
                )
