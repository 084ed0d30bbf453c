"""The manifest arithmetic of `kern bench`'s floors: the weight and KV bytes a decode step reads,
and the GEMM-only manifest whose step GEMMs make the cuBLASLt floor (from the measured manifest,
`--floor-manifest`, or its all-cuBLASLt sibling)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kern_manifest import DTYPE_BYTES

from ..errors import InputFileError, ManifestParseError, ServingRolesError
from ..roles import read_manifest, serving_roles
from .options import BenchError

__all__ = [
    "decode_weight_bytes",
    "extern_calls",
    "find_floor_manifest",
    "floor_manifest",
    "gemm_only_manifest",
    "kv_bytes_per_token",
    "step_program",
]


def step_program(manifest: Mapping[str, Any]) -> str:
    """The manifest's decode step program (its serving roles')."""
    return serving_roles(manifest).step_program


def extern_calls(manifest: Mapping[str, Any], program: str) -> list[dict[str, Any]]:
    """The calls of `program` whose op runs only extern (cuBLASLt) launches."""
    ops = manifest["ops"]
    extern = {n for n, op in ops.items() if all(la["entry"].startswith("extern:") for la in op["impl"]["launches"])}
    return [c for c in manifest["programs"][program]["calls"] if c["op"] in extern]


def _nbytes(buf: Mapping[str, Any], env: Mapping[str, int]) -> int:
    n = DTYPE_BYTES[buf["dtype"]]
    for d in buf["shape"]:
        n *= env[d] if isinstance(d, str) else int(d)
    return n


def decode_weight_bytes(manifest: Mapping[str, Any], program: str) -> int:
    """Bytes of the weight buffers the program's calls read (GEMMs, extern or ours, and norms),
    each buffer counted once. NOTE: a table read only through a gather (an untied embedding)
    counts whole, so for such a model this is an upper bound of the bytes a step moves."""
    buffers = manifest["buffers"]
    names = {a["buf"] for c in manifest["programs"][program]["calls"] for a in c["args"]
             if "buf" in a and buffers[a["buf"]]["kind"] == "weight"}
    return sum(_nbytes(buffers[n], {}) for n in names)


def gemm_only_manifest(manifest: Mapping[str, Any], program: str) -> dict[str, Any]:
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
    used_vars = {d for b in buffers.values() for d in b["shape"] if isinstance(d, str)}
    used_vars |= {a["var"] for c in calls for a in c["args"] if "var" in a}
    return {
        "schema_version": manifest["schema_version"],
        "model": f"{manifest['model']}-gemms",
        "vars": {v: {"max": 1} for v in sorted(used_vars)},
        "buffers": buffers,
        "modules": {},
        "ops": {o: manifest["ops"][o] for o in sorted({c["op"] for c in calls})},
        "programs": {"gemms": {"batch": {"groups": 1, "rows": 1}, "graph": True, "calls": calls}},
    }


def _gemm_buffers(manifest: Mapping[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    written: set[str] = set()
    read: set[str] = set()
    for c in calls:
        params = manifest["ops"][c["op"]]["params"]
        for p, a in zip(params, c["args"], strict=True):
            if "buf" in a:
                (written if p.startswith(("out", "inout")) else read).add(a["buf"])
    buffers: dict[str, Any] = {}
    for name in sorted(read | written):
        b = dict(manifest["buffers"][name])
        b.pop("fill", None)
        b.pop("domain", None)
        if b["kind"] != "weight":
            b["kind"] = "workspace" if name in written else "input"
        buffers[name] = b
    return buffers


def kv_bytes_per_token(manifest: Mapping[str, Any], program: str) -> int:
    """Bytes per token of the paged states (`bytes_per_token`) the program's calls use: what a
    step reads per token of context."""
    states = manifest.get("states", {})
    used = {a["state"] for c in manifest["programs"][program]["calls"] for a in c["args"] if "state" in a}
    return sum(int(states[n].get("bytes_per_token") or 0) for n in used if n in states)


def _weight_specs(manifest: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {n: (b["dtype"], tuple(b["shape"]), json.dumps(b.get("bind"), sort_keys=True))
            for n, b in manifest["buffers"].items() if b["kind"] == "weight"}


def find_floor_manifest(manifest: Mapping[str, Any], path: Path) -> Path | None:
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
        except (InputFileError, ManifestParseError, ServingRolesError):
            continue
        if n and (best is None or n > best[0]):
            best = (n, other)
    return best[1] if best is not None else None


def floor_manifest(manifest: Mapping[str, Any], path: Path, given: Path | None) -> Mapping[str, Any]:
    """The manifest whose step GEMMs make the floor: `given` (--floor-manifest), else the measured
    one when its step has extern GEMMs, else the sibling `find_floor_manifest` finds.

    Raises:
        BenchError: no manifest to take the floor from.
    """
    if given is None and not extern_calls(manifest, step_program(manifest)):
        given = find_floor_manifest(manifest, path)
        if given is None:
            raise BenchError(f"program {step_program(manifest)!r} has no extern (GEMM) call to time, and no "
                             f"manifest beside {path} has the same weights and GEMM calls: pass --floor-manifest")
    floor = read_manifest(given) if given is not None else manifest
    gemm_only_manifest(floor, step_program(floor))  # NOTE: refuse a floor without GEMMs before timing
    return floor
