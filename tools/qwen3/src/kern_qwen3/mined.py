"""Mined facts for the generator: what a capture of our Qwen3 kernels says about their entries,
parameter tables, literals, grids and wiring, asserted before a manifest is written.

    facts = mined_facts(Path("cap"))             # raises WiringError listing every failed check
    problems = check_against(manifest, facts)    # [] when the manifest launches what was mined

The capture is any `kern-mine capture` dump (a pid<N> dir or a root holding one) of a process that
runs our kernels (tools/donor/run_donor.py does). Only launches of our entries are read (the
entries and parameter types come from tools/kernels-src, the provider's own sources); GEMMs and
framework kernels are ignored. The provider's knowledge used here: a forward starts at
`kern_embed`, a decode forward is one that runs `kern_attn_decode_partial` or `kern_argmax_partial`,
runs of `kern_copy_*` are the `start` program and `kern_rope_table` the `load` program, and the
role of each kernel parameter (ROLES, checked against the sources). The token count of a forward
is its `kern_embed` grid.x. Everything else is mined: per program the launch sequence; per launch
the module hash, the parameter offsets and sizes, each scalar's literal (or its fit in t), the grid
fitted by kern_mining.fit over every launch of the entry (so decode reuses what prefill pins down);
and the wiring (docs/qwen3.md) is asserted on the pointers: one fused qkv buffer read by q/k
norm-rope, KV write and attention (q/k/v are views at fixed offsets inside it), the residual at
one address through all layers, per-layer weights distinct and fixed, one KV state shared by KV
write and attention at per-layer offsets, partial buffers shared by the two decode attention and
the two argmax stages, the step carries shared by start, decode and `kern_decode_advance`.
kern_mining.analyze runs on the same launches and its forwards are compared (a note when they
differ).
"""

from __future__ import annotations

import math
import re
import struct
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kern_mining.analyze import Analysis, analyze
from kern_mining.dump import Dump, RecordedLaunch, load_dump
from kern_mining.fit import Fit, fit_samples

__all__ = [
    "KERNELS_SRC",
    "ROLES",
    "CaptureShapeError",
    "GeneratorConstants",
    "GridFact",
    "LaunchFact",
    "MinedError",
    "MinedQwen3",
    "ParamFact",
    "ProgramFacts",
    "Sample",
    "WiringError",
    "check_against",
    "constants_problems",
    "entry_param_types",
    "generator_constants",
    "mined_facts",
]

KERNELS_SRC = Path("tools/kernels-src")
"""The product's kernel sources, relative to the working directory (the repository root)."""

ROLES: dict[str, tuple[str, ...]] = {
    "kern_embed": ("ids", "table", "out", "hidden"),
    "kern_rmsnorm": ("x", "w", "out", "hidden", "eps"),
    "kern_add_rmsnorm": ("res", "y", "w", "out", "hidden", "eps"),
    "kern_qk_norm_rope": ("qkv", "wq", "wk", "pos", "cos", "sin", "nq", "nkv", "head_dim", "eps"),
    "kern_kv_write": ("qkv", "kv", "slots", "nq", "nkv", "head_dim", "page_tokens", "page_stride"),
    "kern_attn_decode_partial": ("qkv", "kv", "block_table", "seq_len", "part_o", "part_lse", "nq",
                                 "nkv", "head_dim", "page_tokens", "page_stride", "splits", "scale"),
    "kern_attn_decode_reduce": ("part_o", "part_lse", "out", "nq", "head_dim", "splits"),
    "kern_prefill_attn": ("qkv", "kv", "block_table", "seq_len", "out", "pf_o", "pf_lse", "rows", "nq",
                          "nkv", "head_dim", "page_tokens", "page_stride", "scale"),
    "kern_prefill_combine": ("pf_o", "pf_lse", "seq_len", "out", "rows", "nq", "nkv", "head_dim"),
    "kern_silu_mul": ("gu", "out", "inter"),
    "kern_argmax_partial": ("logits", "pval", "pidx", "vocab"),
    "kern_argmax_final": ("pval", "pidx", "next", "argmax_parts"),
    "kern_decode_advance": ("next", "ids", "pos", "slots", "seq_len", "block_table", "page_tokens"),
    "kern_copy_i64": ("src", "dst", "copy_rows"),
    "kern_copy_i32": ("src", "dst", "copy_rows"),
    "kern_rope_table": ("cos", "sin", "max_pos", "half_dim", "theta"),
    "kern_gemv_bf16_s4": ("x", "w", "y", "gemv_rows", "gemv_n", "gemv_k", "gemv_y_stride"),
}
"""Parameter roles of each entry, in ABI order; a scalar role names the model number it carries."""

DECODE_MARKERS = frozenset({"kern_attn_decode_partial", "kern_argmax_partial"})
START_ENTRIES = frozenset({"kern_copy_i64", "kern_copy_i32"})
LOAD_ENTRIES = frozenset({"kern_rope_table"})
SITE_SCALARS = frozenset({"rows", "gemv_rows", "gemv_n", "gemv_k", "gemv_y_stride"})
"""Scalars that belong to one call site (vary with t or with the GEMV's shape): not model numbers
that every kernel must agree on."""
PARAM_BYTES = {"ptr": 8, "i32": 4, "i64": 8, "f32": 4, "u8": 1}


class MinedError(Exception):
    """Base of this module's errors."""


class CaptureShapeError(MinedError):
    """The capture holds no forward pass of our kernels, or launches that do not match the sources."""


class WiringError(MinedError):
    """The mined pointers contradict the hand wiring; `problems` lists every failed assertion."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(f"{len(problems)} wiring assertion(s) failed: " + "; ".join(problems[:5]))


# ------------------------------------------------------------------------------ records


@dataclass(frozen=True, slots=True)
class Sample:
    """One launch of one call site: its forward's token count, grid, raw parameter values
    (unsigned little-endian) and, per parameter, the allocation start of a pointer (else None)."""

    forward: int
    tokens: int
    grid: tuple[int, int, int]
    values: tuple[int, ...]
    ranges: tuple[int | None, ...]
    range_ends: tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class ParamFact:
    """One parameter: layout from the capture, type and role from the sources, and its literal
    (a scalar constant across forwards) or fit (a scalar that varies with t)."""

    index: int
    offset: int
    size: int
    type: str
    role: str
    literal: int | float | None
    fit: Fit | None


@dataclass(frozen=True, slots=True)
class GridFact:
    """One grid axis: the fit over every launch of the entry, and the values seen at this site."""

    fit: Fit
    observed: tuple[tuple[int, int], ...]

    @property
    def expr(self) -> object:
        """The manifest expression of the fit, or None when the fit has no manifest spelling."""
        match self.fit.form:
            case "const":
                return self.fit.c
            case "tokens":
                return "tokens"
            case "mul":
                return {"mul": ["tokens", self.fit.a]}
            case "ceil_div":
                return {"ceil_div": ["tokens", self.fit.c]}
            case "mul_ceil_div":
                return {"mul": [self.fit.a, {"ceil_div": ["tokens", self.fit.c]}]}
            case "ceil_div_mul":
                return {"ceil_div": [{"mul": ["tokens", self.fit.a]}, self.fit.c]}
            case _:
                values = {v for _, v in self.observed}
                return values.pop() if len(values) == 1 else None


@dataclass(frozen=True, slots=True)
class LaunchFact:
    """One launch of a program, in order: entry, module hash, block, grid, parameter table."""

    entry: str
    ordinal: int
    module_sha256: str | None
    block: tuple[int, int, int]
    grid: tuple[GridFact, GridFact, GridFact]
    params: tuple[ParamFact, ...]
    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class ProgramFacts:
    """A program as the capture ran it: its launches and the token counts of its runs."""

    name: str
    launches: tuple[LaunchFact, ...]
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class MinedQwen3:
    """Everything mined from one capture; `scalars` are the named model numbers (eps, nq, ...),
    `wiring` the addresses-derived layout facts, `notes` what was dropped or disagreed."""

    dump: Path
    programs: Mapping[str, ProgramFacts]
    scalars: Mapping[str, int | float]
    wiring: Mapping[str, int]
    analyzer_tokens: tuple[int | None, ...]
    notes: tuple[str, ...]

    def launches_of(self, entry: str) -> list[LaunchFact]:
        """Every launch of `entry` in every program, in program order (load, prefill, start, decode)."""
        return [la for p in self.programs.values() for la in p.launches if la.entry == entry]

    def to_json(self) -> dict[str, object]:
        """A JSON-ready summary (launch sequences, grids, literals, wiring)."""
        return {
            "dump": str(self.dump),
            "scalars": dict(self.scalars),
            "wiring": dict(self.wiring),
            "analyzer_tokens": list(self.analyzer_tokens),
            "notes": list(self.notes),
            "programs": {
                name: {
                    "tokens": list(p.tokens),
                    "launches": [
                        {
                            "entry": la.entry,
                            "module_sha256": la.module_sha256,
                            "block": list(la.block),
                            "grid": [g.expr for g in la.grid],
                            "params": [
                                {"offset": q.offset, "size": q.size, "type": q.type, "role": q.role,
                                 "literal": q.literal,
                                 "fit": None if q.fit is None else q.fit.to_json()}
                                for q in la.params
                            ],
                        }
                        for la in p.launches
                    ],
                }
                for name, p in self.programs.items()
            },
        }


# ---------------------------------------------------------------------- kernel sources

_SIGNATURE = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(kern_\w+)\s*\(([^)]*)\)'
)


def _param_type(decl: str) -> str:
    if "*" in decl:
        return "ptr"
    words = decl.replace("const", " ").split()
    base = words[0] if words else ""
    types = {"int": "i32", "int32_t": "i32", "int64_t": "i64", "float": "f32", "bool": "u8",
             "uint8_t": "u8"}
    if base not in types:
        raise CaptureShapeError(f"kernel parameter {decl.strip()!r} has a type this tool does not know")
    return types[base]


def entry_param_types(src_dir: Path = KERNELS_SRC) -> dict[str, tuple[str, ...]]:
    """Each `kern_*` entry of the sources -> its parameter types ("ptr", "i32", "i64", "f32", "u8")."""
    out: dict[str, tuple[str, ...]] = {}
    for path in sorted(src_dir.glob("*.cu")):
        for name, params in _SIGNATURE.findall(path.read_text()):
            out[name] = tuple(_param_type(p) for p in params.split(",") if p.strip())
    return out


# ---------------------------------------------------------------------- segmentation


@dataclass
class _Run:
    program: str
    launches: list[RecordedLaunch]


def _segment(launches: Iterable[RecordedLaunch], notes: list[str]) -> list[_Run]:
    runs: list[_Run] = []
    stray: Counter[str] = Counter()
    for la in launches:
        if la.symbol in LOAD_ENTRIES:
            runs.append(_Run("load", [la]))
        elif la.symbol in START_ENTRIES:
            if runs and runs[-1].program == "start":
                runs[-1].launches.append(la)
            else:
                runs.append(_Run("start", [la]))
        elif la.symbol == "kern_embed":
            runs.append(_Run("forward", [la]))
        elif runs and runs[-1].program == "forward":
            runs[-1].launches.append(la)
        else:
            stray[la.symbol] += 1
    for symbol, n in sorted(stray.items()):
        notes.append(f"{n} launch(es) of {symbol} outside any forward were ignored")
    for run in runs:
        if run.program == "forward":
            decode = any(la.symbol in DECODE_MARKERS for la in run.launches)
            run.program = "decode" if decode else "prefill"
    return runs


def _usual(runs: list[_Run], program: str, notes: list[str]) -> list[_Run]:
    mine = [r for r in runs if r.program == program]
    shapes = Counter(tuple(la.symbol for la in r.launches) for r in mine)
    usual = shapes.most_common(1)[0][0]
    kept = [r for r in mine if tuple(la.symbol for la in r.launches) == usual]
    if len(kept) < len(mine):
        notes.append(f"{program}: {len(mine) - len(kept)} of {len(mine)} runs launch another "
                     f"sequence than the usual one and were left out")
    return kept


# ----------------------------------------------------------------------- per-launch facts


def _decode_scalar(kind: str, raw: int) -> int | float:
    if kind == "f32":
        return struct.unpack("<f", raw.to_bytes(4, "little"))[0]
    bits = PARAM_BYTES[kind] * 8
    return raw - (1 << bits) if raw >> (bits - 1) else raw


def _sample(la: RecordedLaunch, forward: int, tokens: int) -> Sample:
    """`forward` is the position of the run's first launch in time order."""
    assert isinstance(la.params, tuple)
    return Sample(
        forward=forward,
        tokens=tokens,
        grid=la.grid,
        values=tuple(p.value for p in la.params),
        ranges=tuple(p.pointer.range_start if p.pointer else None for p in la.params),
        range_ends=tuple(p.pointer.range_start + p.pointer.range_size if p.pointer else None
                         for p in la.params),
    )


def _param_facts(entry: str, la: RecordedLaunch, samples: Sequence[Sample], types: tuple[str, ...]) -> tuple[ParamFact, ...]:
    assert isinstance(la.params, tuple)
    out: list[ParamFact] = []
    for i, (p, kind) in enumerate(zip(la.params, types, strict=True)):
        literal: int | float | None = None
        fit: Fit | None = None
        if kind != "ptr":
            values = {s.values[i] for s in samples}
            if len(values) == 1:
                literal = _decode_scalar(kind, values.pop())
            elif kind != "f32":
                fit = fit_samples((s.tokens, int(_decode_scalar(kind, s.values[i]))) for s in samples)
        out.append(ParamFact(i, p.offset, p.size, kind, ROLES[entry][i], literal, fit))
    return tuple(out)


def _check_layout(entry: str, la: RecordedLaunch, types: dict[str, tuple[str, ...]], problems: list[str]) -> bool:
    if not isinstance(la.params, tuple):
        problems.append(f"{entry}: launched without a flat parameter layout ({la.params!r}); "
                        "launch it with kernelParams so the capture can record its arguments")
        return False
    want = types.get(entry)
    sizes = [p.size for p in la.params]
    if want is None or len(want) != len(sizes) or len(ROLES.get(entry, ())) != len(sizes):
        problems.append(f"{entry}: the capture has {len(sizes)} params, the sources declare "
                        f"{None if want is None else len(want)}; capture the donor built from these sources")
        return False
    bad = [i for i, (k, n) in enumerate(zip(want, sizes, strict=True)) if PARAM_BYTES[k] != n]
    if bad:
        problems.append(f"{entry}: param(s) {bad} have captured sizes {[sizes[i] for i in bad]}, "
                        f"not the sources' {[want[i] for i in bad]}")
        return False
    return True


def _entry_grids(runs: Sequence[_Run], tokens: Sequence[int]) -> dict[str, tuple[Fit, Fit, Fit]]:
    pooled: dict[str, list[list[tuple[int, int]]]] = defaultdict(lambda: [[], [], []])
    for run, t in zip(runs, tokens, strict=True):
        for la in run.launches:
            for axis in range(3):
                pooled[la.symbol][axis].append((t, la.grid[axis]))
    return {e: (fit_samples(a[0]), fit_samples(a[1]), fit_samples(a[2])) for e, a in pooled.items()}


def _program(
    name: str,
    runs: list[_Run],
    all_tokens: dict[int, int],
    grids: Mapping[str, tuple[Fit, Fit, Fit]],
    ctx: _Ctx,
) -> ProgramFacts:
    facts: list[LaunchFact] = []
    ordinals: Counter[str] = Counter()
    for j, la in enumerate(runs[0].launches):
        entry = la.symbol
        column = [r.launches[j] for r in runs]
        if not all(_check_layout(entry, c, ctx.types, ctx.problems) for c in column[:1]):
            continue
        samples = tuple(_sample(c, r.launches[0].index, all_tokens[id(r)]) for c, r in zip(column, runs, strict=True))
        observed = [tuple(sorted({(s.tokens, s.grid[a]) for s in samples})) for a in range(3)]
        fits = grids[entry]
        module = ctx.dump.modules.get(la.module) if la.module is not None else None
        blocks = Counter(c.block for c in column)
        facts.append(LaunchFact(
            entry=entry,
            ordinal=ordinals[entry],
            module_sha256=module.sha256 if module else None,
            block=blocks.most_common(1)[0][0],
            grid=(GridFact(fits[0], observed[0]), GridFact(fits[1], observed[1]),
                  GridFact(fits[2], observed[2])),
            params=_param_facts(entry, la, samples, ctx.types[entry]),
            samples=samples,
        ))
        ordinals[entry] += 1
    return ProgramFacts(name, tuple(facts), tuple(all_tokens[id(r)] for r in runs))


@dataclass
class _Ctx:
    dump: Dump
    types: dict[str, tuple[str, ...]]
    problems: list[str]
    notes: list[str]


# ------------------------------------------------------------------------- model numbers


def _scalars(programs: Mapping[str, ProgramFacts], problems: list[str]) -> dict[str, int | float]:
    seen: dict[str, dict[int | float, list[str]]] = defaultdict(lambda: defaultdict(list))
    for prog in programs.values():
        for la in prog.launches:
            for q in la.params:
                if q.type != "ptr" and q.role not in SITE_SCALARS and q.literal is not None:
                    seen[q.role][q.literal].append(la.entry)
    out: dict[str, int | float] = {}
    for role, values in sorted(seen.items()):
        if len(values) > 1:
            parts = ", ".join(f"{v!r} in {sorted(set(e))}" for v, e in values.items())
            problems.append(f"{role} differs between kernels: {parts}")
        out[role] = next(iter(values))
    return out


# ------------------------------------------------------------------------------ wiring


def _by_entry(prog: ProgramFacts) -> dict[str, list[LaunchFact]]:
    out: dict[str, list[LaunchFact]] = defaultdict(list)
    for la in prog.launches:
        out[la.entry].append(la)
    return out


def _ptr(la: LaunchFact, role: str, k: int) -> int:
    return la.samples[k].values[ROLES[la.entry].index(role)]


def _runs(prog: ProgramFacts) -> range:
    return range(len(prog.tokens))


class _Wiring:
    """The wiring assertions; each failure appends one line to `problems`."""

    def __init__(self, programs: Mapping[str, ProgramFacts], scalars: Mapping[str, int | float]) -> None:
        self.programs = programs
        self.scalars = scalars
        self.problems: list[str] = []
        self.facts: dict[str, int] = {}

    def same(self, what: str, pairs: Sequence[tuple[str, int]]) -> None:
        base_name, base = pairs[0]
        for name, addr in pairs[1:]:
            if addr != base:
                self.problems.append(f"{what}: {name} is at {addr:#x}, {addr - base:+d} bytes from "
                                     f"{base_name} at {base:#x}; they must be one buffer")

    def run(self) -> None:
        for name, prog in self.programs.items():
            if name in ("prefill", "decode"):
                self.forward(name, prog)
        self.weights_fixed()
        self.kv_layout()
        self.carries()
        self.rope_tables()

    def prefill_partials(self, where: str, by: Mapping[str, list[LaunchFact]], k: int) -> None:
        """kern_prefill_combine reads the partials and seq_len kern_prefill_attn was given and writes
        its output."""
        for a, c in zip(by.get("kern_prefill_attn", []), by.get("kern_prefill_combine", []), strict=False):
            for role in ("pf_o", "pf_lse", "seq_len", "out"):
                self.same(f"{where} layer {a.ordinal} prefill {role}",
                          [(f"prefill_attn.{role}", _ptr(a, role, k)), (f"prefill_combine.{role}", _ptr(c, role, k))])

    def forward(self, name: str, prog: ProgramFacts) -> None:
        by = _by_entry(prog)
        attn = by.get("kern_prefill_attn", []) + by.get("kern_attn_decode_partial", [])
        for k in _runs(prog):
            where = f"{name} run {k} (t={prog.tokens[k]})"
            self.qkv(where, by, attn, k, prog.tokens[k])
            res = [("kern_embed.out", _ptr(by["kern_embed"][0], "out", k))]
            res += [("kern_rmsnorm.x", _ptr(la, "x", k)) for la in by.get("kern_rmsnorm", [])]
            res += [(f"kern_add_rmsnorm#{la.ordinal}.res", _ptr(la, "res", k))
                    for la in by.get("kern_add_rmsnorm", [])]
            self.same(f"{where} residual", res)
            self.weights_distinct(where, by, k)
            for kw, at in zip(by.get("kern_kv_write", []), attn, strict=False):
                self.same(f"{where} layer {kw.ordinal} KV state",
                          [("kern_kv_write.kv", _ptr(kw, "kv", k)), (f"{at.entry}.kv", _ptr(at, "kv", k))])
            self.prefill_partials(where, by, k)
            for p, r in zip(by.get("kern_attn_decode_partial", []), by.get("kern_attn_decode_reduce", []),
                            strict=False):
                for role in ("part_o", "part_lse"):
                    self.same(f"{where} layer {p.ordinal} decode {role}",
                              [(f"partial.{role}", _ptr(p, role, k)), (f"reduce.{role}", _ptr(r, role, k))])
            if "kern_argmax_partial" in by and "kern_argmax_final" in by:
                a, b = by["kern_argmax_partial"][0], by["kern_argmax_final"][0]
                for role in ("pval", "pidx"):
                    self.same(f"{where} argmax {role}",
                              [(f"argmax_partial.{role}", _ptr(a, role, k)), (f"argmax_final.{role}", _ptr(b, role, k))])

    def qkv(self, where: str, by: Mapping[str, list[LaunchFact]], attn: Sequence[LaunchFact], k: int, t: int) -> None:
        users = [(f"kern_qk_norm_rope#{la.ordinal}", la) for la in by.get("kern_qk_norm_rope", [])]
        users += [(f"kern_kv_write#{la.ordinal}", la) for la in by.get("kern_kv_write", [])]
        users += [(f"{la.entry}#{la.ordinal}", la) for la in attn]
        if not users:
            return
        self.same(f"{where} fused qkv (q, k, v are views at fixed offsets inside it)",
                  [(n, _ptr(la, "qkv", k)) for n, la in users])
        nq, nkv, d = (int(self.scalars.get(n, 0)) for n in ("nq", "nkv", "head_dim"))
        row = (nq + 2 * nkv) * d * 2
        self.facts.update(qkv_q_offset=0, qkv_k_offset=nq * d * 2, qkv_v_offset=(nq + nkv) * d * 2,
                          qkv_row_bytes=row)
        la = users[0][1]
        i = ROLES[la.entry].index("qkv")
        end = la.samples[k].range_ends[i]
        addr = la.samples[k].values[i]
        if end is not None and addr + t * row > end:
            self.problems.append(f"{where}: the fused qkv buffer at {addr:#x} ends {end - addr} bytes "
                                 f"later, short of {t} rows of {row} bytes")

    def weight_roles(self, by: Mapping[str, list[LaunchFact]], k: int) -> list[tuple[str, int]]:
        out = [("embed", _ptr(by["kern_embed"][0], "table", k))]
        out += [("l0.in_norm", _ptr(la, "w", k)) for la in by.get("kern_rmsnorm", [])]
        for la in by.get("kern_add_rmsnorm", []):
            layer, second = divmod(la.ordinal, 2)
            out.append((f"l{layer + 1}.in_norm" if second else f"l{layer}.post_norm", _ptr(la, "w", k)))
        for la in by.get("kern_qk_norm_rope", []):
            out += [(f"l{la.ordinal}.q_norm", _ptr(la, "wq", k)), (f"l{la.ordinal}.k_norm", _ptr(la, "wk", k))]
        return out

    def weights_distinct(self, where: str, by: Mapping[str, list[LaunchFact]], k: int) -> None:
        owners: dict[int, list[str]] = defaultdict(list)
        for role, addr in self.weight_roles(by, k):
            owners[addr].append(role)
        for addr, roles in owners.items():
            if len(roles) > 1:
                self.problems.append(f"{where}: weights {', '.join(roles)} share {addr:#x}; "
                                     "per-layer weights must be distinct")

    def weights_fixed(self) -> None:
        where: dict[str, set[int]] = defaultdict(set)
        layers = int(self.scalars.get("layers", 0))
        for name in ("prefill", "decode"):
            prog = self.programs.get(name)
            if prog is None:
                continue
            by = _by_entry(prog)
            for k in _runs(prog):
                for role, addr in self.weight_roles(by, k):
                    if name == "decode" and role == f"l{layers}.in_norm":
                        role = "final_norm"
                    where[role].add(addr)
        for role, addrs in sorted(where.items()):
            if len(addrs) > 1:
                self.problems.append(f"weight {role} moves between forwards: "
                                     f"{', '.join(hex(a) for a in sorted(addrs))}")

    def kv_layout(self) -> None:
        p, nkv, d = (int(self.scalars.get(n, 0)) for n in ("page_tokens", "nkv", "head_dim"))
        layers = int(self.scalars.get("layers", 0))
        layer_bytes = 2 * p * nkv * d * 2
        stride = int(self.scalars.get("page_stride", 0))
        if stride != layers * layer_bytes // 2:
            self.problems.append(f"page_stride {stride} is not layers x 2 x page_tokens x nkv x "
                                 f"head_dim = {layers * layer_bytes // 2}")
        bases: set[int] = set()
        for name in ("prefill", "decode"):
            prog = self.programs.get(name)
            if prog is None:
                continue
            writes = _by_entry(prog).get("kern_kv_write", [])
            for k in _runs(prog):
                base = _ptr(writes[0], "kv", k) if writes else 0
                bases.add(base)
                i = ROLES["kern_kv_write"].index("kv")
                for la in writes:
                    addr = _ptr(la, "kv", k)
                    if addr - base != la.ordinal * layer_bytes:
                        self.problems.append(
                            f"{name} run {k}: layer {la.ordinal}'s KV is {addr - base:+d} bytes from layer 0's, "
                            f"not {la.ordinal * layer_bytes} ([page][layer][k|v][P][NKV][D])")
                    if la.samples[k].ranges[i] != writes[0].samples[k].ranges[i]:
                        self.problems.append(f"{name} run {k}: layer {la.ordinal}'s KV lies in another "
                                             "allocation than layer 0's; the KV state is one pool")
        if len(bases) > 1:
            self.problems.append(f"the KV state moves between forwards: {sorted(hex(b) for b in bases)}")
        self.facts.update(kv_layer_bytes=layer_bytes, kv_bytes_per_token=layers * 2 * nkv * d * 2)

    def carries(self) -> None:
        dec = self.programs.get("decode")
        if dec is None or "kern_decode_advance" not in (by := _by_entry(dec)):
            return
        adv = by["kern_decode_advance"][0]
        users = {"ids": [("kern_embed.ids", by["kern_embed"][0], "ids")],
                 "pos": [(f"kern_qk_norm_rope#{la.ordinal}.pos", la, "pos") for la in by.get("kern_qk_norm_rope", [])],
                 "slots": [(f"kern_kv_write#{la.ordinal}.slots", la, "slots") for la in by.get("kern_kv_write", [])],
                 "seq_len": [(f"kern_attn_decode_partial#{la.ordinal}.seq_len", la, "seq_len")
                             for la in by.get("kern_attn_decode_partial", [])],
                 "block_table": [(f"kern_attn_decode_partial#{la.ordinal}.block_table", la, "block_table")
                                 for la in by.get("kern_attn_decode_partial", [])]}
        if "kern_argmax_final" in by:
            users["next"] = [("kern_argmax_final.next", by["kern_argmax_final"][0], "next")]
        for k in _runs(dec):
            for role, group in users.items():
                self.same(f"decode run {k} step carry {role}",
                          [(f"kern_decode_advance.{role}", _ptr(adv, role, k))]
                          + [(n, _ptr(la, r, k)) for n, la, r in group])
        start = self.programs.get("start")
        if start is None:
            return
        dsts = {_ptr(la, "dst", k) for la in start.launches for k in _runs(start)}
        carried = {_ptr(adv, r, k) for r in ("ids", "pos", "slots", "seq_len") for k in _runs(dec)}
        if dsts != carried:
            self.problems.append(f"start copies into {sorted(hex(a) for a in dsts)}, decode advances "
                                 f"{sorted(hex(a) for a in carried)}: they must be the same carries")

    def rope_tables(self) -> None:
        load = self.programs.get("load")
        if load is None:
            return
        tables = {(_ptr(la, "cos", k), _ptr(la, "sin", k)) for la in load.launches for k in _runs(load)}
        for name in ("prefill", "decode"):
            prog = self.programs.get(name)
            for la in _by_entry(prog).get("kern_qk_norm_rope", []) if prog else []:
                for k in _runs(prog) if prog else []:
                    got = (_ptr(la, "cos", k), _ptr(la, "sin", k))
                    if got not in tables:
                        self.problems.append(f"{name} run {k}: kern_qk_norm_rope#{la.ordinal} reads rope "
                                             f"tables {got[0]:#x}/{got[1]:#x} that kern_rope_table never wrote")
                        return


# ----------------------------------------------------------------------------- entry


def _analyzer_tokens(dump: Dump, ours: tuple[RecordedLaunch, ...], analysis: Analysis | None,
                     notes: list[str]) -> tuple[int | None, ...]:
    if analysis is None:
        try:
            analysis = analyze(replace(dump, launches=ours))
        except (ValueError, IndexError, ZeroDivisionError) as exc:
            # NOTE: a cross-check only; the mined facts do not depend on it.
            notes.append(f"kern_mining.analyze failed on our launches: {type(exc).__name__}: {exc}")
            return ()
    return tuple(f.tokens for f in analysis.forwards)


def mined_facts(capture_dir: Path, analysis: Analysis | None = None, *,
                src_dir: Path = KERNELS_SRC) -> MinedQwen3:
    """Mine our kernels' facts from a capture and assert the hand wiring on its pointers.

    Args:
        capture_dir: a pid<N> dump or a capture root holding one.
        analysis: kern_mining's analysis of the same launches (only its forwards' token counts are
            compared); computed over our kernels' launches when not given.
        src_dir: the kernel sources the captured process ran (entries, parameter types).

    Raises:
        kern_mining.DumpError: the dump cannot be read (see kern_mining.load_dump).
        CaptureShapeError: no forward of our kernels, or launches that disagree with the sources.
        WiringError: the pointers contradict the wiring; `problems` lists every failed assertion.
    """
    dump = load_dump(capture_dir)
    types = entry_param_types(src_dir)
    ours = tuple(la for la in dump.launches if la.symbol in ROLES)
    notes: list[str] = list(dump.notes)
    runs = _segment(ours, notes)
    if not any(r.program in ("prefill", "decode") for r in runs):
        raise CaptureShapeError(f"{capture_dir}: no forward pass of our kernels (no kern_embed among "
                                f"{len(ours)} launches of ours); capture tools/donor/run_donor.py")
    ctx = _Ctx(dump, types, [], notes)
    # NOTE: load and start runs have no token count; 1 keeps their grids' observed values exact.
    tokens = {id(r): r.launches[0].grid[0] if r.program in ("prefill", "decode") else 1 for r in runs}
    grids = _entry_grids(runs, [tokens[id(r)] for r in runs])
    programs = {name: _program(name, _usual(runs, name, notes), tokens, grids, ctx)
                for name in ("load", "prefill", "start", "decode") if any(r.program == name for r in runs)}
    if ctx.problems:
        raise CaptureShapeError("; ".join(ctx.problems))
    problems: list[str] = []
    scalars = _scalars(programs, problems)
    writes = [la for la in programs["decode" if "decode" in programs else "prefill"].launches
              if la.entry == "kern_kv_write"]
    scalars["layers"] = len(writes)
    prefill = programs.get("prefill")
    rows = [(la.entry, q.fit) for la in (prefill.launches if prefill else ())
            if la.entry in ("kern_prefill_attn", "kern_prefill_combine") for q in la.params if q.role == "rows"]
    problems += [f"{entry} rows fit {fit.render()}, not the chunk's token count t"
                 for entry, fit in rows[:2] if fit is not None and fit.form != "tokens"]
    wiring = _Wiring(programs, scalars)
    wiring.run()
    problems += wiring.problems
    if problems:
        raise WiringError(problems)
    ana = _analyzer_tokens(dump, ours, analysis, notes)
    mine = tuple(r.launches[0].grid[0] for r in runs if r.program in ("prefill", "decode"))
    if ana and ana[-len(mine):] != mine:
        notes.append(f"kern_mining.analyze found forwards of {list(ana)} tokens; kern_embed says {list(mine)}")
    return MinedQwen3(dump.path, MappingProxyType(programs), MappingProxyType(scalars),
                      MappingProxyType(wiring.facts), ana, tuple(notes))


@dataclass(frozen=True, slots=True)
class GeneratorConstants:
    """The numbers the generator hard-codes, as the capture shows them."""

    page_tokens: int
    decode_splits: int
    prefill_bm: int | None
    argmax_parts: int
    entry_modules: Mapping[str, str]
    """entry -> sha256 of the captured module that defines it."""


def _prefill_bm(fit: Fit, scalars: Mapping[str, int | float]) -> int | None:
    """PREFILL_BM from the fit of kern_prefill_attn's grid.x = ceil(t * group / PREFILL_BM)."""
    group = int(scalars.get("nq", 0)) // max(1, int(scalars.get("nkv", 1)))
    if fit.form == "ceil_div" and fit.c is not None:
        return fit.c * group
    if fit.form == "ceil_div_mul" and fit.a and fit.c is not None and fit.c * group % fit.a == 0:
        return fit.c * group // fit.a
    return None


def generator_constants(facts: MinedQwen3) -> GeneratorConstants:
    """PAGE_TOKENS, DECODE_SPLITS, PREFILL_BM (kern_prefill_attn's packed rows per block: the
    divisor of its grid.x ceil_div(t * group, PREFILL_BM), with group = nq / nkv; None when the
    capture never ran prefill attention or the fit is neither ceil_div nor ceil_div_mul) and
    ARGMAX_PARTS as mined, and the module hash behind each entry.

    Raises:
        CaptureShapeError: the capture ran no decode attention or argmax (no splits, no parts).
    """
    sc = facts.scalars
    missing = [k for k in ("page_tokens", "splits", "argmax_parts") if k not in sc]
    if missing:
        raise CaptureShapeError(f"the capture pins no {', '.join(missing)}: capture decode steps too")
    bm: int | None = None
    shas: dict[str, str] = {}
    for prog in facts.programs.values():
        for la in prog.launches:
            if la.module_sha256:
                shas[la.entry] = la.module_sha256
            if la.entry == "kern_prefill_attn":
                bm = _prefill_bm(la.grid[0].fit, sc)
    return GeneratorConstants(int(sc["page_tokens"]), int(sc["splits"]), bm, int(sc["argmax_parts"]),
                              MappingProxyType(shas))


def constants_problems(consts: GeneratorConstants) -> list[str]:
    """Where the generator's constants (PAGE_TOKENS, DECODE_SPLITS, PREFILL_BM, ARGMAX_PARTS)
    differ from the mined ones; empty: they agree."""
    from kern_qwen3.entries import ARGMAX_PARTS, DECODE_SPLITS, PREFILL_BM
    from kern_qwen3.shape import PAGE_TOKENS

    ours = {"page_tokens": PAGE_TOKENS, "decode_splits": DECODE_SPLITS, "argmax_parts": ARGMAX_PARTS}
    problems = [f"{k} is {v} here but {getattr(consts, k)} in the capture"
                for k, v in ours.items() if getattr(consts, k) != v]
    if consts.prefill_bm is not None and consts.prefill_bm != PREFILL_BM:
        problems.append(f"prefill_bm is {PREFILL_BM} here but {consts.prefill_bm} in the capture")
    return problems


# --------------------------------------------------------------------------- check_against


def _eval(expr: object, t: int) -> int | None:
    if isinstance(expr, bool):
        return None
    if isinstance(expr, int):
        return expr
    if expr == "tokens" or expr == {"var": "tokens"}:
        return t
    if isinstance(expr, Mapping) and len(expr) == 1:
        op, args = next(iter(expr.items()))
        vals = [_eval(a, t) for a in args] if isinstance(args, list) else []
        if len(vals) != 2 or None in vals:
            return None
        a, b = vals[0] or 0, vals[1] or 0
        ops = {"add": lambda: a + b, "mul": lambda: a * b, "min": lambda: min(a, b),
               "max": lambda: max(a, b), "ceil_div": lambda: -(-a // b) if b else None}
        return ops[op]() if op in ops else None
    return None


@dataclass(frozen=True)
class _Expanded:
    entry: str
    module: str | None
    grid: Sequence[object]
    block: Sequence[int]
    types: Sequence[str]
    args: Sequence[Mapping[str, Any]]
    label: str


def _expand(manifest: Mapping[str, Any], program: str) -> list[_Expanded]:
    ops = manifest.get("ops", {})
    out: list[_Expanded] = []
    for call in manifest["programs"][program]["calls"]:
        op = ops[call["op"]]
        for launch in op["impl"]["launches"]:
            if str(launch.get("entry", "")).startswith("extern:"):
                continue
            args = launch.get("args")
            resolved = call["args"] if args is None else [
                call["args"][a["param"]] if "param" in a else a for a in args]
            out.append(_Expanded(launch["entry"], launch.get("module"), launch["grid"],
                                 launch.get("block", [1, 1, 1]), launch.get("params", op["params"]),
                                 resolved, call["label"]))
    return out


_LITERAL_TYPES = ("i32", "i64", "f32", "u8", "u32", "u64")


def _type_bytes(param_type: str) -> int:
    for name, n in (("i32", 4), ("i64", 8), ("f32", 4), ("u8", 1), ("u32", 4), ("u64", 8)):
        if param_type == name:
            return n
    return 8  # NOTE: buffers and states are device pointers


def _f32_bits(v: float) -> bytes:
    return struct.pack("<f", v)


def _literal_problem(where: str, arg: Mapping[str, Any], q: ParamFact, la: LaunchFact) -> str | None:
    if "var" in arg or "expr" in arg:
        expr = arg.get("var", arg.get("expr"))
        bad = [s.tokens for s in la.samples
               if _eval(expr, s.tokens) != _decode_scalar(q.type, s.values[q.index])]
        return f"{where} param {q.index} ({q.role}): manifest {arg}, mined values differ at t={bad[:3]}" if bad else None
    kind = next((k for k in _LITERAL_TYPES if k in arg), None)
    if kind is None:
        return None
    value = arg[kind]
    if q.literal is None:
        return f"{where} param {q.index} ({q.role}): manifest literal {value!r}, mined value varies ({q.fit})"
    if kind == "f32" and q.type == "f32":
        same = _f32_bits(float(value)) == _f32_bits(float(q.literal)) or (
            math.isnan(float(value)) and math.isnan(float(q.literal)))
    else:
        same = int(value) == q.literal
    return None if same else f"{where} param {q.index} ({q.role}): manifest {kind} {value!r}, mined {q.literal!r}"


def _compare_launch(where: str, m: _Expanded, la: LaunchFact, manifest: Mapping[str, Any],
                    kv_base: int | None) -> list[str]:
    out: list[str] = []
    sha = manifest.get("modules", {}).get(m.module, {}).get("sha256") if m.module else None
    if la.module_sha256 and sha and sha != la.module_sha256:
        out.append(f"module {m.module} pins sha256 {sha[:12]}, the capture ran {la.module_sha256[:12]} "
                   f"(first at {where})")
    if list(m.block) != list(la.block):
        out.append(f"{where}: block {list(m.block)}, mined {list(la.block)}")
    for axis, (expr, g) in enumerate(zip(m.grid, la.grid, strict=True)):
        bad = [(t, v) for t, v in g.observed if _eval(expr, t) != v]
        if bad:
            out.append(f"{where}: grid[{axis}] = {expr!r} gives {[_eval(expr, t) for t, _ in bad[:3]]} "
                       f"at t={[t for t, _ in bad[:3]]}, mined {[v for _, v in bad[:3]]} (fit {g.fit.render()})")
    sizes = [_type_bytes(t) for t in m.types]
    mined = [q.size for q in la.params]
    if sizes != mined:
        out.append(f"{where}: param sizes {sizes}, mined {mined}")
        return out
    for q, arg in zip(la.params, m.args, strict=False):
        problem = _literal_problem(where, arg, q, la)
        if problem:
            out.append(problem)
        if "state" in arg and kv_base is not None:
            offs = {s.values[q.index] - kv_base for s in la.samples}
            want = int(arg.get("offset", 0))
            if offs != {want}:
                out.append(f"{where} param {q.index}: state offset {want}, mined {sorted(offs)}")
    return out


def check_against(manifest_json: Mapping[str, Any], facts: MinedQwen3) -> list[str]:
    """Mismatches between a manifest's launches and the mined facts, one line each ([] = agree).

    Compared per program the capture ran (load, prefill, start, decode): the sequence of our
    entries (extern GEMMs skipped), then per launch the module hash, block, grid (the manifest's
    expression evaluated at every token count the capture saw), parameter sizes, every literal
    argument and `tokens`-valued argument, and state byte offsets (relative to layer 0's KV);
    and the KV state's bytes_per_token.
    """
    problems: list[str] = []
    programs = manifest_json.get("programs", {})
    kv_base: int | None = None
    for prog in facts.programs.values():
        for la in prog.launches:
            if la.entry == "kern_kv_write" and la.ordinal == 0:
                kv_base = la.samples[0].values[ROLES[la.entry].index("kv")]
    for name, prog in facts.programs.items():
        if name not in programs:
            problems.append(f"the manifest has no {name!r} program; the capture ran one")
            continue
        try:
            expanded = _expand(manifest_json, name)
        except (KeyError, TypeError, IndexError) as exc:
            problems.append(f"{name}: cannot expand the manifest's calls ({type(exc).__name__}: {exc})")
            continue
        want = [m.entry for m in expanded]
        got = [la.entry for la in prog.launches]
        if want != got:
            k = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
            problems.append(f"{name}: launch {k} is {want[k] if k < len(want) else 'missing'} in the manifest, "
                            f"{got[k] if k < len(got) else 'missing'} in the capture "
                            f"({len(want)} vs {len(got)} launches)")
            continue
        for m, la in zip(expanded, prog.launches, strict=True):
            for p in _compare_launch(f"{name}/{m.label}/{m.entry}", m, la, manifest_json, kv_base):
                if not p.startswith("module ") or not any(q.startswith(p.split(" (first")[0]) for q in problems):
                    problems.append(p)
    bpt = manifest_json.get("states", {}).get("kv", {}).get("bytes_per_token")
    mined_bpt = facts.wiring.get("kv_bytes_per_token")
    if bpt is not None and mined_bpt is not None and bpt != mined_bpt:
        problems.append(f"states.kv.bytes_per_token {bpt}, mined {mined_bpt}")
    return problems
