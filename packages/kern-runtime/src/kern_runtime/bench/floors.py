"""The manifest arithmetic of `kern bench`'s floors: the weight and KV bytes a decode step reads,
and the GEMM-only manifest whose step GEMMs make the cuBLASLt floor (from the measured manifest,
`--floor-manifest`, or its all-cuBLASLt sibling)."""

from __future__ import annotations

from pathlib import Path

from kern_manifest import Batch, BufArg, Buffer, Call, Manifest, Program, StateArg, Var, VarArg

from ..errors import InputFileError, ManifestParseError, ManifestVerifyError, ServingRolesError
from ..roles import read_manifest, serving_roles
from .options import BenchError

__all__ = [
    "decode_weight_bytes",
    "extern_calls",
    "find_floor_manifest",
    "floor_manifest",
    "gemm_only_manifest",
    "kv_bytes_per_token",
    "no_floor_note",
    "step_program",
]


def step_program(manifest: Manifest) -> str:
    """The manifest's decode step program (its serving roles')."""
    return serving_roles(manifest).step_program


def extern_calls(manifest: Manifest, program: str) -> list[Call]:
    """The calls of `program` whose op runs only extern (cuBLASLt) launches."""
    extern = {n for n, op in manifest.ops.items() if all(la.entry.startswith("extern:") for la in op.impl.launches)}
    return [c for c in manifest.programs[program].calls if c.op in extern]


def decode_weight_bytes(manifest: Manifest, program: str) -> int:
    """Bytes of the weight buffers the program's calls read (GEMMs, extern or ours, and norms),
    each buffer counted once. NOTE: a table read only through a gather (an untied embedding)
    counts whole, so for such a model this is an upper bound of the bytes a step moves."""
    buffers = manifest.buffers
    names = {a.buf for c in manifest.programs[program].calls for a in c.args
             if isinstance(a, BufArg) and buffers[a.buf].kind == "weight"}
    return sum(buffers[n].nbytes({}) for n in names)


def gemm_only_manifest(manifest: Manifest, program: str) -> Manifest:
    """A manifest whose one graph program is `program`'s extern (GEMM) calls alone.

    Weight buffers keep their binds (so a resident runtime's weights are claimed as they are);
    activations a GEMM reads become inputs, the ones it writes workspace.

    Raises:
        BenchError: the program has no extern call.
    """
    calls = extern_calls(manifest, program)
    if not calls:
        raise BenchError(f"program {program!r} has no extern (GEMM) call to time")
    buffers = _gemm_buffers(manifest, calls)
    used_vars = {v for b in buffers.values() for d in b.shape for v in d.vars}
    used_vars |= {a.var for c in calls for a in c.args if isinstance(a, VarArg)}
    return Manifest(
        schema_version=manifest.schema_version,
        model=f"{manifest.model}-gemms",
        vars={v: Var(max=1) for v in sorted(used_vars)},
        buffers=buffers,
        modules={},
        ops={o: manifest.ops[o] for o in sorted({c.op for c in calls})},
        programs={"gemms": Program(batch=Batch(groups=1, rows=1), graph=True, calls=tuple(calls))},
    )


def _gemm_buffers(manifest: Manifest, calls: list[Call]) -> dict[str, Buffer]:
    written: set[str] = set()
    read: set[str] = set()
    for c in calls:
        params = manifest.ops[c.op].params
        for p, a in zip(params, c.args, strict=True):
            if isinstance(a, BufArg):
                (written if p.writes else read).add(a.buf)
    buffers: dict[str, Buffer] = {}
    for name in sorted(read | written):
        b = manifest.buffers[name]
        kind = b.kind if b.kind == "weight" else "workspace" if name in written else "input"
        buffers[name] = b.model_copy(update={"fill": None, "domain": None, "kind": kind})
    return buffers


def kv_bytes_per_token(manifest: Manifest, program: str) -> int:
    """Bytes per token of the paged states (`bytes_per_token`) the program's calls use: what a
    step reads per token of context."""
    states = manifest.states
    used = {a.state for c in manifest.programs[program].calls for a in c.args if isinstance(a, StateArg)}
    return sum(states[n].bytes_per_token or 0 for n in used if n in states)


def _weight_specs(manifest: Manifest) -> dict[str, tuple[object, ...]]:
    return {n: (b.dtype, b.shape, b.bind) for n, b in manifest.buffers.items() if b.kind == "weight"}


def find_floor_manifest(manifest: Manifest, path: Path) -> Path | None:
    """The GEMM floor's manifest when the measured one runs no GEMM through cuBLASLt: of the
    manifests beside `path` with the same weight buffers (names, dtypes, shapes, binds: the same
    checkpoint), the one whose step program has the most extern GEMM calls (the all-cuBLASLt
    variant; the first by name on a tie). None when no such manifest has any."""
    want = _weight_specs(manifest)
    best: tuple[int, Path] | None = None
    for other in sorted(path.parent.glob("*.json")):
        if other.resolve() == path.resolve():
            continue
        try:
            m = read_manifest(other)
            n = len(extern_calls(m, step_program(m))) if _weight_specs(m) == want else 0
        except (InputFileError, ManifestParseError, ManifestVerifyError, ServingRolesError):
            continue
        if n and (best is None or n > best[0]):
            best = (n, other)
    return best[1] if best is not None else None


def floor_manifest(manifest: Manifest, path: Path, given: Path | None) -> Manifest | None:
    """The manifest whose step GEMMs make the floor: `given` (--floor-manifest), else the measured
    one when its step has extern GEMMs, else the sibling `find_floor_manifest` finds; None when
    there is none (a step over weights no cuBLASLt GEMM of ours reads, as an FP8 one's).

    Raises:
        BenchError: `given` has no GEMMs in its step.
    """
    if given is None and not extern_calls(manifest, step_program(manifest)):
        given = find_floor_manifest(manifest, path)
        if given is None:
            return None
    floor = read_manifest(given) if given is not None else manifest
    gemm_only_manifest(floor, step_program(floor))  # NOTE: refuse a floor without GEMMs before timing
    return floor


def no_floor_note(manifest: Manifest, path: Path) -> str:
    """The report's note when `floor_manifest` found none."""
    return (f"no GEMM-only floor: program {step_program(manifest)!r} runs no GEMM through cuBLASLt and no manifest "
            f"beside {path} has the same weights and GEMM calls (--floor-manifest names one)")
