"""Verifier checks of the header, states, modules and buffers."""

from __future__ import annotations

from collections.abc import Mapping

from kern_manifest._verify_base import (
    DTYPE_RANGE,
    MAX_BUFFER_BYTES,
    SHA_RE,
    Base,
    ptr,
)
from kern_manifest.errors import short, short_pointer
from kern_manifest.expr import Expr
from kern_manifest.schema import (
    FLOAT_FILLS,
    INPUT_FILLS,
    SCHEMA_VERSION,
    Buffer,
    Domain,
    RankRanges,
    RankTensors,
    Segment,
)

__all__ = ["BufferChecks", "source_problem"]


def source_problem(source: str) -> str | None:
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
            return f"malformed hf: source {short(source)!r}"
    elif source.startswith("https://"):
        if not source[len("https://") :].split("/")[0]:
            return f"https source {short(source)!r} has no host"
    elif "://" in source:
        return f"unsupported source scheme in {short(source)!r}"
    return None


class BufferChecks(Base):
    """Header, states, modules, buffers (shapes, peers, bind, fill, domains)."""

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
                self.root(
                    ("var", name),
                    ptr("vars", name, "max"),
                    f"var max {var.max} < 1",
                    "vars range over [1, max]; use max >= 1",
                )
        for name, size in self.groups.items():
            if size < 1:
                self.root(
                    ("group", name),
                    ptr("topology", "groups", name),
                    f"group size {size} < 1",
                    "a group has at least one rank",
                )
        for name, state in m.states.items():
            self.state(name, state.sizes)
            if state.slices is not None:
                self.slices(name, state.bytes_per_token, state.slices)
        for name, module in m.modules.items():
            self.module(name, module.source, module.sha256)
        if not m.programs:
            self.err("/programs", "no programs", "declare at least one program")

    def state(self, name: str, sizes: Mapping[str, int]) -> None:
        if len(sizes) != 1:
            got = ", ".join(sizes) or "none"
            self.err(
                ptr("states", name),
                f"state needs exactly one size field, got {got}",
                "set one of bytes, bytes_per_token, bytes_per_seq",
            )
        for key, value in sizes.items():
            if not 1 <= value <= MAX_BUFFER_BYTES:
                self.err(
                    ptr("states", name, key),
                    f"{key} {value} out of range",
                    "use a positive byte count of at most 1 TiB (2^40)",
                )

    def slices(self, name: str, per_token: int | None, slices: int) -> None:
        at = ptr("states", name, "slices")
        if per_token is None:
            self.err(at, "slices on a state that is not paged", "declare slices only beside bytes_per_token")
        elif not 1 <= slices <= per_token or per_token % slices:
            self.err(
                at,
                f"slices {slices} do not divide bytes_per_token {per_token}",
                "use a positive divisor of bytes_per_token (e.g. the layer count)",
            )

    def module(self, name: str, source: str, sha: str) -> None:
        if not SHA_RE.fullmatch(sha):
            self.err(
                ptr("modules", name, "sha256"),
                "sha256 is not 64 lowercase hex digits",
                "pin the module by its sha256 hex digest",
            )
        problem = source_problem(source)
        if problem:
            self.err(
                ptr("modules", name, "source"),
                problem,
                "use a file name, hf:<org>/<repo>/<path>[@rev] or https://...",
            )

    def buffer(self, name: str, buf: Buffer) -> None:
        at = ptr("buffers", name)
        if name in self.m.states:
            self.err(
                at,
                f"buffer {short(name)!r} has the name of a state",
                "rename one: index_into and of name a buffer or a state",
            )
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
        elif self.group_ok(buf.group, at + "/group"):
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
                at + "/of", f"unknown buffer or state {short(of)!r}", "name an export buffer or a state"
            )
        elif of == name or target.kind == "peer" or not target.export:
            self.err(
                at + "/of",
                f"of {short(of)!r} is not an export buffer",
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

    def group_ok(self, name: str, at: str) -> bool:
        """`group_ref`, and False (counted as following) for a group whose size is < 1."""
        if not self.group_ref(name, at):
            return False
        return not self.followed(("group", name))

    def rank_table(self, group: str, count: int, at: str) -> None:
        if self.group_ok(group, at + "/group") and count != self.groups[group]:
            self.err(
                at,
                f"{count} entries for group {short(group)!r} of {self.groups[group]} ranks",
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
                f"fill {buf.fill!r} again (first at {short_pointer(first)})",
                "each fill role appears at most once",
            )
        wanted = "input" if buf.fill in INPUT_FILLS else "output"
        dtypes = ("f32",) if buf.fill in FLOAT_FILLS else ("i32", "i64")
        if buf.kind != wanted or buf.dtype not in dtypes:
            self.err(
                at + "/fill",
                f"fill {buf.fill!r} on {buf.kind} buffer of {buf.dtype}",
                f"fill {buf.fill!r} belongs on an {'/'.join(dtypes)} {wanted} buffer",
            )

    def domain(self, name: str, buf: Buffer, dom: Domain, at: str) -> None:
        integer = buf.dtype in DTYPE_RANGE
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
            value = self.at_max(bound) if self.range(bound, at) is not None else None
            if value is None:
                return None
        else:
            value = bound
        if integer and not DTYPE_RANGE[dtype][0] <= value <= DTYPE_RANGE[dtype][1]:
            self.err(at, f"bound {value} does not fit {dtype}", f"keep it within {dtype}'s range")
        return value

    def index_domain(self, name: str, buf: Buffer, dom: Domain, at: str, integer: bool) -> None:
        target = dom.index_into or ""  # NOTE: the caller checked it is set
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
                f"index_into {short(target)!r} is not another buffer or a state",
                "name the buffer or state the elements index",
            )
        if dom.stride is not None and dom.stride < 1:
            self.err(at + "/stride", f"stride {dom.stride} < 1", "use a stride >= 1")
