"""`kern bench`: decode and prefill timings of one manifest on one GPU, with a cuBLAS-only floor.

    kern bench [target] [--manifest M --kernels K --kernel-sources S --weights W...]
        [--contexts 128,8192] [--steps 256] [--chunk 2048] [--prefill 709] [--json out.json]

Rows (the bench convention: name, value, unit, target, peer):
- `decode_ms_per_token@ctx<c>`: median wall time of >= 200 single decode steps after a c-token
  prompt (and 10 warm-up steps: contexts c + 10 .. c + 10 + steps), each one replay + the 8-byte
  readback (+ the host writes of a host-fed manifest): what kern-run pays.
- `decode_fixed_ms_per_token@ctx<c>`: the same timing with every step at context c exactly: the
  session is rewound to the end of the prompt's prefill (untimed) before each step.
- `decode_gpu_ms_per_step@ctx<c>`: back-to-back replays of the same step graph, no readback, wall
  divided by the count: the GPU time of a step; `decode_host_gap_us@ctx<c>` the difference.
- `gemm_floor_ms_per_step`: the decode step's GEMM calls alone (same shapes, same weights, cublasLt)
  captured in one graph and replayed back to back.
- `prefill_ms@<n>` / `ttft_ms@<n>`: chunked prefill of an n-token prompt (the first n-1 tokens),
  and prefill plus the first decode step; medians of `--prefill-reps`.
- `weight_bytes_per_step`: bytes of the weight buffers the decode step reads, each once.
Peers measured outside kern (the copy-bandwidth floor, transformers) are added by
tools/gpu/qwen3_checks.py, which has torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kern_cli.config import KernTomlError, config_for
from kern_cli.console import fail, output_file_problem
from kern_cli.run import (
    LoadOptions,
    RunError,
    add_load_flags,
    check_inputs,
    default_weights,
    ensure_kernels,
    probe_gpu,
    resolve_load,
    runtime_input_errors,
)
from kern_manifest import DTYPE_BYTES

if TYPE_CHECKING:
    from kern_runtime import Session

__all__ = [
    "DEFAULT_BENCH_CHUNK",
    "DEFAULT_BENCH_STEPS",
    "MIN_STEPS",
    "BenchError",
    "Row",
    "bench_session",
    "check_bench_options",
    "decode_weight_bytes",
    "gemm_only_manifest",
    "register",
    "table",
]

Row = dict[str, Any]
MIN_STEPS = 200
DEFAULT_BENCH_STEPS = 256
DEFAULT_BENCH_CHUNK = 2048
PROMPT_VOCAB = 1000
"""Random prompt ids are drawn below this (every vocabulary has that many; timing ignores ids)."""


class BenchError(Exception):
    """Bad benchmark options (too few steps, a context beyond the manifest's reach)."""


def _row(name: str, value: float, unit: str, target: float | None = None, peer: str = "") -> Row:
    return {"name": name, "value": round(value, 4), "unit": unit, "target": target, "peer": peer}


def _extern_calls(manifest: Mapping[str, Any], program: str) -> list[dict[str, Any]]:
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
    calls = _extern_calls(manifest, program)
    if not calls:
        raise BenchError(f"program {program!r} has no extern (GEMM) call to time")
    ops = {c["op"] for c in calls}
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
    used_vars = {d for b in buffers.values() for d in b["shape"] if isinstance(d, str)}
    used_vars |= {a["var"] for c in calls for a in c["args"] if "var" in a}
    return {
        "schema_version": manifest["schema_version"],
        "model": f"{manifest['model']}-gemms",
        "vars": {v: {"max": 1} for v in sorted(used_vars)},
        "buffers": buffers,
        "modules": {},
        "ops": {o: manifest["ops"][o] for o in sorted(ops)},
        "programs": {"gemms": {"batch": {"groups": 1, "rows": 1}, "graph": True, "calls": calls}},
    }


def _median_ms(samples_ns: Sequence[int]) -> float:
    return statistics.median(samples_ns) / 1e6


def _prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return [int(x) for x in rng.integers(0, vocab, size=n)]


def _decode_rows(s: Session, ctx: int, steps: int, vocab: int, chunk: int, rng: np.random.Generator) -> list[Row]:
    s.prefill(_prompt(rng, ctx, vocab), chunk)
    for _ in range(10):
        s.step()
    samples: list[int] = []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        s.step()
        samples.append(time.perf_counter_ns() - t0)
    # NOTE: replaying one step graph with unchanged inputs recomputes the same position: its time
    # is the GPU time of a step at this context, with no host work in between.
    s.rt.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        s.rt.issue(s.roles.step_program, s.roles.step_vars)
    s.rt.synchronize()
    gpu_ms = (time.perf_counter_ns() - t0) / steps / 1e6
    per_token = _median_ms(samples)
    fixed: list[int] = []
    for _ in range(steps):
        s.rewind()
        s.rt.synchronize()
        t0 = time.perf_counter_ns()
        s.step()
        fixed.append(time.perf_counter_ns() - t0)
    return [
        _row(f"decode_ms_per_token@ctx{ctx}", per_token, "ms"),
        _row(f"decode_fixed_ms_per_token@ctx{ctx}", _median_ms(fixed), "ms",
             peer="every step at this context: rewound to the end of the prefill before each (untimed)"),
        _row(f"decode_gpu_ms_per_step@ctx{ctx}", gpu_ms, "ms"),
        _row(f"decode_host_gap_us@ctx{ctx}", (per_token - gpu_ms) * 1e3, "us",
             peer="per-token time minus back-to-back GPU time: readback + host feed + launch"),
    ]


def _prefill_rows(s: Session, n: int, reps: int, vocab: int, chunk: int, rng: np.random.Generator) -> list[Row]:
    prompt = _prompt(rng, n, vocab)
    pre: list[int] = []
    ttft: list[int] = []
    for _ in range(reps + 1):
        s.rt.synchronize()
        t0 = time.perf_counter_ns()
        s.prefill(prompt, chunk)
        s.rt.synchronize()
        t1 = time.perf_counter_ns()
        s.step()
        t2 = time.perf_counter_ns()
        pre.append(t1 - t0)
        ttft.append(t2 - t0)
    return [_row(f"prefill_ms@{n}", _median_ms(pre[1:]), "ms"), _row(f"ttft_ms@{n}", _median_ms(ttft[1:]), "ms")]


def _gemm_floor(s: Session, manifest: Mapping[str, Any], kernels: Path, weights: Sequence[Path], gpu: int,
                steps: int) -> Row:
    import kern_runtime as kr
    from kern_manifest import parse_manifest

    floor = gemm_only_manifest(manifest, _step_program(manifest))
    calls = len(floor["programs"]["gemms"]["calls"])
    gm = parse_manifest(json.dumps(floor))
    resident = s.rt.into_resident()
    try:
        rt = kr.Runtime.load(gm, kernels, gpu=gpu, capacity=kr.Capacity(tokens=16, seqs=1), over=resident)
    except BaseException:
        resident.close()
        raise
    try:
        rt.load_weights(kr.Safetensors.open([str(p) for p in weights]))
        vars_ = dict.fromkeys(gm.vars, 1)
        for _ in range(10):
            rt.issue("gemms", vars_)
        rt.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(steps):
            rt.issue("gemms", vars_)
        rt.synchronize()
        ms = (time.perf_counter_ns() - t0) / steps / 1e6
    finally:
        rt.close()
    return _row("gemm_floor_ms_per_step", ms, "ms",
                peer=f"cublasLt: {manifest['model']}'s {calls} step GEMM calls in one graph")


def check_bench_options(*, contexts: Sequence[int], steps: int, prefill: int, prefill_reps: int,
                        chunk: int, floor_manifest: Path | None) -> None:
    """Refuse benchmark options that cannot give a measurement (no GPU needed).

    Raises:
        BenchError: fewer than MIN_STEPS steps, a non-positive size, or a missing floor manifest.
    """
    if steps < MIN_STEPS:
        raise BenchError(f"--steps must be at least {MIN_STEPS} (the median needs them), got {steps}")
    if not contexts or min(contexts) < 1:
        raise BenchError(f"--contexts needs positive integers, got {list(contexts)}")
    for name, value in (("--prefill", prefill), ("--prefill-reps", prefill_reps), ("--chunk", chunk)):
        if value < 1:
            raise BenchError(f"{name} must be at least 1, got {value}")
    if floor_manifest is not None and not floor_manifest.is_file():
        raise BenchError(f"--floor-manifest {floor_manifest}: no such file")


def _capacity(load: LoadOptions, contexts: Sequence[int], steps: int, prefill: int) -> int:
    reach = max([*contexts, prefill]) + 2 * steps + 32  # NOTE: device-fed replays advance too
    return max(load.capacity or 0, -(-reach // 256) * 256)


def _weight_specs(manifest: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {n: (b["dtype"], tuple(b["shape"]), json.dumps(b.get("bind"), sort_keys=True))
            for n, b in manifest["buffers"].items() if b["kind"] == "weight"}


def find_floor_manifest(manifest: Mapping[str, Any], path: Path) -> Path | None:
    """The GEMM floor's manifest when the measured one runs no GEMM through cuBLASLt: of the
    manifests beside `path` with the same weight buffers (names, dtypes, shapes, binds: the same
    checkpoint), the one whose step program has the most extern GEMM calls (the all-cuBLASLt
    variant; the first by name on a tie). None when no such manifest has any."""
    import kern_runtime as kr

    want = _weight_specs(manifest)
    best: tuple[int, Path] | None = None
    for other in sorted(path.parent.glob("*.json")):
        if other.resolve() == path.resolve():
            continue
        try:
            m = kr.read_manifest(other)
            n = len(_extern_calls(m, _step_program(m))) if _weight_specs(m) == want else 0
        except (kr.InputFileError, kr.ManifestParseError, kr.ServingRolesError):
            continue
        if n and (best is None or n > best[0]):
            best = (n, other)
    return best[1] if best is not None else None


def _floor(manifest: Mapping[str, Any], path: Path, floor_manifest: Path | None) -> Mapping[str, Any]:
    """The manifest whose step GEMMs make the floor: --floor-manifest, else the measured one when
    its step has extern GEMMs, else the sibling `find_floor_manifest` finds.

    Raises:
        BenchError: no manifest to take the floor from.
    """
    import kern_runtime as kr

    if floor_manifest is None and not _extern_calls(manifest, _step_program(manifest)):
        floor_manifest = find_floor_manifest(manifest, path)
        if floor_manifest is None:
            raise BenchError(f"program {_step_program(manifest)!r} has no extern (GEMM) call to time, and no "
                             f"manifest beside {path} has the same weights and GEMM calls: pass --floor-manifest")
    floor = kr.read_manifest(floor_manifest) if floor_manifest is not None else manifest
    gemm_only_manifest(floor, _step_program(floor))  # NOTE: refuse a floor without GEMMs before timing
    return floor


def bench_session(
    load: LoadOptions,
    *,
    contexts: Sequence[int],
    steps: int,
    prefill: int,
    prefill_reps: int = 10,
    chunk: int = DEFAULT_BENCH_CHUNK,
    floor_manifest: Path | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> list[Row]:
    """Load once, measure decode at each context, prefill, then the GEMM-only floor: the extern
    GEMM calls of `floor_manifest`'s step (default: the measured manifest, or, when its step runs
    no GEMM through cuBLASLt, its all-cuBLASLt sibling: `find_floor_manifest`). `load.weights`
    must be given.

    Raises:
        BenchError: bad options (see `check_bench_options`), or a floor without GEMMs.
        RunError: a missing manifest or kernels that cannot be had.
        kern_runtime errors: the manifest, weights, capacity, or a failure on the GPU.
    """
    import kern_runtime as kr

    check_bench_options(contexts=contexts, steps=steps, prefill=prefill, prefill_reps=prefill_reps,
                        chunk=chunk, floor_manifest=floor_manifest)
    inputs = check_inputs(load)
    floor = _floor(inputs.manifest, load.manifest, floor_manifest)
    capacity = _capacity(load, contexts, steps, prefill)
    kr.check_capacity(inputs.roles, capacity)
    if inputs.weights is None:
        raise RunError("kern bench needs weights: pass --weights or use default_weights()")
    weights = inputs.weights
    ensure_kernels(inputs.manifest, load.kernels, load.kernel_sources, log)
    vocab = PROMPT_VOCAB
    rng = np.random.default_rng(0)
    rows = [_row("weight_bytes_per_step", decode_weight_bytes(inputs.manifest, inputs.roles.step_program) / 1e9, "GB")]
    s = kr.Session.open(load.manifest, load.kernels, weights, gpu=load.gpu, capacity=capacity, log=log,
                        roles=inputs.roles)
    try:
        for ctx in contexts:
            log(f"decode at context {ctx}")
            rows += _decode_rows(s, ctx, steps, vocab, chunk, rng)
        log(f"prefill of {prefill} tokens")
        rows += _prefill_rows(s, prefill, prefill_reps, vocab, chunk, rng)
        log("GEMM-only floor")
        rows.append(_gemm_floor(s, floor, load.kernels, weights, load.gpu, steps))
    finally:
        s.close()
    return rows


def _step_program(manifest: Mapping[str, Any]) -> str:
    import kern_runtime as kr

    return kr.serving_roles(manifest).step_program


def table(rows: Sequence[Row]) -> str:
    """Rows as an aligned text table."""
    keys = ["name", "value", "unit", "target", "peer"]
    cells = [["" if r.get(k) is None else str(r.get(k)) for k in keys] for r in rows]
    widths = [max([len(k), *(len(c[i]) for c in cells)]) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise BenchError(f"--contexts must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise BenchError(f"--contexts needs positive integers, got {text!r}")
    return values


def _bench_args(args: argparse.Namespace) -> tuple[LoadOptions, dict[str, Any]]:
    import kern_runtime as kr

    load = resolve_load(args, config_for(args.config, Path.cwd()))
    options: dict[str, Any] = {
        "contexts": _ints(args.contexts), "steps": DEFAULT_BENCH_STEPS if args.steps is None else args.steps,
        "prefill": args.prefill, "prefill_reps": args.prefill_reps,
        "chunk": DEFAULT_BENCH_CHUNK if args.chunk is None else args.chunk, "floor_manifest": args.floor_manifest,
    }
    check_bench_options(**options)
    if args.json is not None and (problem := output_file_problem(args.json)) is not None:
        raise BenchError(f"--json {problem}")
    inputs = check_inputs(load)
    _floor(inputs.manifest, load.manifest, args.floor_manifest)
    kr.check_capacity(inputs.roles, _capacity(load, options["contexts"], options["steps"], options["prefill"]))
    return load, options


def _handle(args: argparse.Namespace) -> int:
    from kern_runtime.errors import KernRuntimeError

    def log(msg: str) -> None:
        print(f"kern bench: {msg}", file=sys.stderr, flush=True)

    try:
        load, options = _bench_args(args)
        probe_gpu(load.gpu)
        if not load.weights:
            load = replace(load, weights=default_weights(log))
        rows = bench_session(load, **options, log=log)
    except (RunError, KernTomlError, BenchError, *runtime_input_errors()) as exc:
        return fail("kern bench", str(exc))
    except KernRuntimeError as exc:
        fail("kern bench", f"{type(exc).__name__}: {exc}")
        return 1
    print(table(rows))
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(rows, indent=2) + "\n")
        except OSError as exc:
            return fail("kern bench", f"--json {args.json}: {exc.strerror or exc}")
    return 0
    return 0


def register(subparsers: Any) -> None:
    """Add `kern bench` to the `kern` dispatcher."""
    p = subparsers.add_parser("bench", help="decode and prefill timings on one GPU",
                              description=__doc__.splitlines()[0] if __doc__ else None)
    add_load_flags(p, capacity_help="KV tokens at least (default: what the contexts, steps and prefill reach)")
    p.add_argument("--steps", type=int,
                   help=f"timed decode steps per context (>= {MIN_STEPS}, default {DEFAULT_BENCH_STEPS})")
    p.add_argument("--chunk", type=int, help=f"prefill chunk rows (default {DEFAULT_BENCH_CHUNK})")
    p.add_argument("--contexts", default="128,8192", help="decode contexts, comma separated")
    p.add_argument("--prefill", type=int, default=709, help="prompt tokens of the prefill timing")
    p.add_argument("--prefill-reps", type=int, default=10, help="prefill repetitions (median)")
    p.add_argument("--json", type=Path, help="write the rows as JSON here")
    p.add_argument("--floor-manifest", type=Path,
                   help="manifest whose step GEMMs (extern calls) make the cuBLAS floor (default: --manifest)")
    p.set_defaults(handler=_handle)
