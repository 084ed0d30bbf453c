"""`kern bench`: decode and prefill timings of one manifest on one GPU, beside floors measured in
the same run and a compiled PyTorch peer on the same checkpoint (`kern bench serve`: serving
throughput and latency, kern_cli.bench_serve).

    kern bench [target] [--manifest M --kernels K --kernel-sources S --weights W...]
        [--contexts 128,2048,8192,32768] [--prefill 709,4096,16384] [--steps 256] [--chunk 2048]
        [--breakdown CONTEXTS|none] [--peer auto|on|off] [--out DIR] [--json rows.json]

Rows (the bench convention: name, value, unit, target, peer), per decode context c:
- `decode_gpu_ms_per_step@ctx<c>`: the step graph replayed back to back after a c-token prompt,
  wall over the count: in a device-fed manifest the tokens are fed in turn on the device, the
  sequence growing as in decoding; `decode_gpu_fixed_ms_per_step@ctx<c>`: the same with every
  replay at context c (the step seed program before each one);
- `decode_ms_per_token@ctx<c>` / `decode_fixed_ms_per_token@ctx<c>`: single steps, each one
  replay + the 8-byte readback (what kern-run pays), walking / rewound to context c before each;
  `decode_host_gap_us@ctx<c>` the per-token time less the back-to-back one;
- `bandwidth_floor_ms_per_step@ctx<c>`: (weight bytes + c tokens of KV) / the device copy rate
  (`copy_bandwidth_rw`, `kern_runtime.copy_rate`);
per prefill of n tokens: `prefill_ms@<n>` / `ttft_ms@<n>` (the chunk program as Session runs it;
medians of `--prefill-reps`) and `compute_floor_ms@<n>` (the forward's FLOPs / `gemm_rate_bf16`, a
bf16 8192^3 GEMM through the runtime's cuBLASLt); `gemm_floor_ms_per_step` (the step's GEMM calls
alone through cuBLASLt in one graph; from the all-cuBLASLt sibling manifest when the step has
none); `weight_bytes_per_step`; and the peer's `peer_*` rows (`python -m kern_peer`, kern_cli.
bench_peer), its values also in the peer column of kern's rows. `--breakdown` times each call of
the step eagerly at those contexts (`Runtime.time_calls`), per call kind. `--out DIR` writes
bench.json, bench.txt, breakdown.md and bench.png (kern_cli.bench_report).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kern_cli import bench_measure as measure
from kern_cli.bench_peer import PEER_MODES, PeerError, PeerPlan, peer_command, plan_peer, run_peer
from kern_cli.bench_report import (
    Report,
    Row,
    checkpoint_config,
    compute_floor_rows,
    floor_rows,
    peer_rows,
    row,
    table,
    write_report,
)
from kern_cli.config import KernTomlError, config_for
from kern_cli.console import (
    fail,
    first_paragraph,
    output_dir_problem,
    output_file_problem,
    positive_ints,
)
from kern_cli.run import (
    LoadOptions,
    RunError,
    add_load_flags,
    check_inputs,
    default_weights,
    ensure_kernels,
    family,
    probe_gpu,
    resolve_load,
    runtime_input_errors,
)
from kern_manifest import DTYPE_BYTES

if TYPE_CHECKING:
    from kern_runtime import ServingRoles, Session

__all__ = [
    "BREAKDOWN_RUNS",
    "DEFAULT_BENCH_CHUNK",
    "DEFAULT_BENCH_STEPS",
    "DEFAULT_CONTEXTS",
    "DEFAULT_PREFILL",
    "MIN_STEPS",
    "BenchError",
    "BenchOptions",
    "Row",
    "bench_session",
    "check_bench_options",
    "decode_weight_bytes",
    "find_floor_manifest",
    "gemm_only_manifest",
    "kv_bytes_per_token",
    "register",
    "table",
]

MIN_STEPS = 200
DEFAULT_BENCH_STEPS = 256
DEFAULT_BENCH_CHUNK = 2048
DEFAULT_CONTEXTS = (128, 2048, 8192, 32768)
DEFAULT_PREFILL = (709, 4096, 16384)
BREAKDOWN_RUNS = 5
PROMPT_VOCAB = 1000
"""Random prompt ids are drawn below this (every vocabulary has that many; timing ignores ids)."""


class BenchError(Exception):
    """Bad benchmark options (too few steps, a context beyond the manifest's reach)."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What one `kern bench` run measures (checked by `check_bench_options`)."""

    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    steps: int = DEFAULT_BENCH_STEPS
    prefill: tuple[int, ...] = DEFAULT_PREFILL
    prefill_reps: int = 10
    chunk: int = DEFAULT_BENCH_CHUNK
    floor_manifest: Path | None = None
    breakdown: tuple[int, ...] = ()
    """Decode contexts whose step is also timed call by call."""


_row = row


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


def kv_bytes_per_token(manifest: Mapping[str, Any], program: str) -> int:
    """Bytes per token of the paged states (`bytes_per_token`) the program's calls use: what a
    step reads per token of context."""
    states = manifest.get("states", {})
    used = {a["state"] for c in manifest["programs"][program]["calls"] for a in c["args"] if "state" in a}
    return sum(int(states[n].get("bytes_per_token") or 0) for n in used if n in states)


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
    return row("gemm_floor_ms_per_step", ms, "ms",
               peer=f"cublasLt: {manifest['model']}'s {calls} step GEMM calls in one graph")


def check_bench_options(options: BenchOptions) -> None:
    """Refuse benchmark options that cannot give a measurement (no GPU needed).

    Raises:
        BenchError: fewer than MIN_STEPS steps, a non-positive size, or a missing floor manifest.
    """
    o = options
    if o.steps < MIN_STEPS:
        raise BenchError(f"--steps must be at least {MIN_STEPS} (the median needs them), got {o.steps}")
    for name, values in (("--contexts", o.contexts), ("--prefill", o.prefill)):
        if not values or min(values) < 1:
            raise BenchError(f"{name} needs positive integers, got {list(values)}")
    if o.breakdown and min(o.breakdown) < 1:
        raise BenchError(f"--breakdown needs positive integers, got {list(o.breakdown)}")
    for name, value in (("--prefill-reps", o.prefill_reps), ("--chunk", o.chunk)):
        if value < 1:
            raise BenchError(f"{name} must be at least 1, got {value}")
    if o.floor_manifest is not None and not o.floor_manifest.is_file():
        raise BenchError(f"--floor-manifest {o.floor_manifest}: no such file")


def _capacity(load: LoadOptions, options: BenchOptions, roles: ServingRoles) -> int:
    """The KV capacity the timings need (at least --capacity), checked against the model.

    Raises:
        BenchError: the contexts, prefills and steps reach past the model's positions.
        kern_runtime.SessionError: --capacity itself is past them.
    """
    import kern_runtime as kr

    o = options
    reach = max([*o.contexts, *o.prefill, *o.breakdown]) + 2 * o.steps + 32  # NOTE: device-fed replays advance too
    most = roles.reach(reach)
    if reach > most:
        raise BenchError(f"the contexts, prefills and breakdown reach {reach} positions with 2 x --steps {o.steps} "
                         f"and 32 more; the model holds {most}")
    capacity = max(load.capacity or 0, -(-reach // 256) * 256)
    if load.capacity is None:
        capacity = min(capacity, roles.reach(capacity))
    kr.check_capacity(roles, capacity)
    return capacity


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


def _yardsticks(load: LoadOptions, schema_version: int, log: Callable[[str], None]) -> tuple[float, float]:
    """(device copy bytes/s, bf16 GEMM FLOP/s), measured before the session loads."""
    import kern_runtime as kr

    log("yardsticks: device copy, bf16 GEMM")
    return kr.copy_rate(load.gpu), measure.gemm_rate(load.kernels, load.gpu, schema_version)


def _decode_and_breakdown(s: Session, options: BenchOptions, report: Report, rng: np.random.Generator,
                          log: Callable[[str], None]) -> None:
    o = options
    for ctx in sorted({*o.contexts, *o.breakdown}):
        log(f"decode at context {ctx}")
        rows = measure.decode_rows(s, ctx, o.steps, PROMPT_VOCAB, o.chunk, rng)
        if ctx in o.contexts:
            report.rows += rows
        if ctx in o.breakdown:
            log(f"breakdown at context {ctx}")
            report.breakdown[ctx] = measure.breakdown_runs(s, BREAKDOWN_RUNS, log)
            report.replay_ms[ctx] = next(r["value"] for r in rows if r["name"].startswith("decode_gpu_fixed_"))


def _floors(inputs: Any, weights: Sequence[Path], options: BenchOptions, copy: float, gemm: float,
            report: Report) -> None:
    step = inputs.roles.step_program
    report.rows += floor_rows(decode_weight_bytes(inputs.manifest, step), kv_bytes_per_token(inputs.manifest, step),
                              options.contexts, copy)
    from kern_runtime import ProviderError

    config = checkpoint_config(weights)
    if config is None:
        report.notes.append("no compute floor: the weights have no config.json beside them")
        return
    try:
        provider = family(inputs.manifest)
    except ProviderError as exc:
        report.notes.append(f"no compute floor: {exc}")
        return
    try:
        report.rows += compute_floor_rows(provider.prefill_flops, config, options.prefill, gemm)
    except provider.errors as exc:
        report.notes.append(f"no compute floor: {exc}")


def bench_session(load: LoadOptions, options: BenchOptions, log: Callable[[str], None] = lambda s: None) -> Report:
    """Measure the yardsticks, load once, then decode at each context (and the breakdown), each
    prefill, and the GEMM-only floor: the extern GEMM calls of `options.floor_manifest`'s step
    (default: the measured manifest, or, when its step runs no GEMM through cuBLASLt, its
    all-cuBLASLt sibling: `find_floor_manifest`). `load.weights` must be given.

    Raises:
        BenchError: bad options (see `check_bench_options`), or a floor without GEMMs.
        RunError: a missing manifest or kernels that cannot be had.
        kern_runtime errors: the manifest, weights, capacity, or a failure on the GPU.
    """
    import kern_runtime as kr

    check_bench_options(options)
    inputs = check_inputs(load)
    floor = _floor(inputs.manifest, load.manifest, options.floor_manifest)
    capacity = _capacity(load, options, inputs.roles)
    if inputs.weights is None:
        raise RunError("kern bench needs weights: pass --weights or use default_weights()")
    weights = inputs.weights
    ensure_kernels(inputs.manifest, load.kernels, load.kernel_sources, log)
    rng = np.random.default_rng(0)
    report = Report([row("weight_bytes_per_step", decode_weight_bytes(inputs.manifest, inputs.roles.step_program) / 1e9,
                         "GB")], title=f"{inputs.manifest['model']}: decode ms/token")
    copy, gemm = _yardsticks(load, int(inputs.manifest["schema_version"]), log)
    s = kr.Session.open(load.manifest, load.kernels, weights, gpu=load.gpu, capacity=capacity, log=log,
                        roles=inputs.roles)
    try:
        _decode_and_breakdown(s, options, report, rng, log)
        for n in options.prefill:
            log(f"prefill of {n} tokens")
            report.rows += measure.prefill_rows(s, n, options.prefill_reps, PROMPT_VOCAB, options.chunk, rng)
        log("GEMM-only floor")
        report.rows.append(_gemm_floor(s, floor, load.kernels, weights, load.gpu, options.steps))
    finally:
        s.close()
    _floors(inputs, load.weights or weights, options, copy, gemm, report)
    return report


def _step_program(manifest: Mapping[str, Any]) -> str:
    import kern_runtime as kr

    return kr.serving_roles(manifest).step_program


# --------------------------------------------------------------------------------------------
# Command line.


def _ints(flag: str, text: str) -> tuple[int, ...]:
    return positive_ints(flag, text, BenchError)


def _breakdown(text: str | None, contexts: tuple[int, ...]) -> tuple[int, ...]:
    if text is None:
        return tuple(sorted({min(contexts), max(contexts)}))
    return () if text.strip().lower() == "none" else _ints("--breakdown", text)


@dataclass(frozen=True, slots=True)
class _Plan:
    load: LoadOptions
    manifest: Mapping[str, Any]
    options: BenchOptions
    peer: PeerPlan
    out: Path | None
    json: Path | None


def _options(args: argparse.Namespace) -> BenchOptions:
    contexts = _ints("--contexts", args.contexts)
    return BenchOptions(
        contexts=contexts, steps=DEFAULT_BENCH_STEPS if args.steps is None else args.steps,
        prefill=_ints("--prefill", args.prefill), prefill_reps=args.prefill_reps,
        chunk=DEFAULT_BENCH_CHUNK if args.chunk is None else args.chunk, floor_manifest=args.floor_manifest,
        breakdown=_breakdown(args.breakdown, contexts))


def _outputs(args: argparse.Namespace, out: Path | None) -> None:
    if args.json is not None and (problem := output_file_problem(args.json)) is not None:
        raise BenchError(f"--json {problem}")
    if out is not None and (problem := output_dir_problem(out)) is not None:
        raise BenchError(f"--out {problem}")


def _bench_args(args: argparse.Namespace) -> _Plan:
    """Every check that needs no GPU: flags, kern.toml, inputs, floor, capacity, the peer."""

    cfg = config_for(args.config, Path.cwd())
    load = resolve_load(args, cfg)
    options = _options(args)
    check_bench_options(options)
    out = args.out if args.out is not None else cfg.bench.out
    _outputs(args, out)
    inputs = check_inputs(load)
    _floor(inputs.manifest, load.manifest, options.floor_manifest)
    _capacity(load, options, inputs.roles)
    mode = args.peer or cfg.bench.peer or "auto"
    peer = plan_peer(mode, checkpoint_config(load.weights), default_weights=not load.weights)
    return _Plan(load, inputs.manifest, options, peer, out, args.json)


def _run_peer(plan: _Plan, weights: Sequence[Path], report: Report, log: Callable[[str], None]) -> bool:
    """Runs the peer into `report`; False (with a note) when it failed."""
    import tempfile

    o = plan.options
    log("the compiled PyTorch peer (python -m kern_peer)")
    with tempfile.TemporaryDirectory(prefix="kern-bench-peer-") as tmp:
        result_path = Path(tmp) / "peer.json"
        cmd = peer_command(weights, contexts=o.contexts, prefill=o.prefill, steps=o.steps, gpu=plan.load.gpu,
                           out=result_path)
        try:
            result = run_peer(cmd, result_path, o.contexts, o.prefill)
        except PeerError as exc:
            report.notes.append(str(exc))
            return False
    report.peer = result
    report.rows += peer_rows(result, report.rows)
    return True


def _write(plan: _Plan, report: Report, log: Callable[[str], None]) -> None:
    if plan.json is not None:
        plan.json.write_text(json.dumps(report.rows, indent=2) + "\n")
    if plan.out is not None:
        files = write_report(report, plan.out, log)
        log("wrote " + ", ".join(str(f) for f in files))


def _measure(plan: _Plan, log: Callable[[str], None]) -> tuple[Report, bool]:
    """kern's measurements, written at once (a peer that never returns leaves them on disk),
    then the peer's; False when the peer failed."""
    load = plan.load
    if not load.weights:
        load = replace(load, weights=default_weights(plan.manifest, log))
    report = bench_session(load, plan.options, log=log)
    ok = True
    if plan.peer.run:
        _write(plan, report, log)
        ok = _run_peer(plan, load.weights, report, log)
    if plan.peer.note:
        report.notes.append(plan.peer.note)
    return report, ok


def _handle(args: argparse.Namespace) -> int:
    from kern_runtime.errors import KernRuntimeError

    def log(msg: str) -> None:
        print(f"kern bench: {msg}", file=sys.stderr, flush=True)

    try:
        plan = _bench_args(args)
        probe_gpu(plan.load.gpu)
        report, ok = _measure(plan, log)
        print(report.text())
        for note in report.notes:
            log(note)
        _write(plan, report, log)
    except (RunError, KernTomlError, BenchError, PeerError, *runtime_input_errors()) as exc:
        return fail("kern bench", str(exc))
    except KernRuntimeError as exc:
        fail("kern bench", f"{type(exc).__name__}: {exc}")
        return 1
    except BrokenPipeError:
        raise  # NOTE: a closed stdout (`| head`): quiet_ends exits 141
    except OSError as exc:
        return fail("kern bench", f"writing the report: {exc.strerror or exc}")
    return 0 if ok else 1


_EPILOG = ("kern bench serve [flags]: continuous batching throughput and latency of kern serve's engine, "
           "--clients at once (default 1, 8, 32 and 64) beside one row; see kern bench serve --help.")


def register(subparsers: Any) -> None:
    """Add `kern bench` to the `kern` dispatcher."""
    p = subparsers.add_parser("bench", help="decode and prefill timings on one GPU, floors and a PyTorch peer; "
                              "kern bench serve: serving throughput and latency",
                              description=first_paragraph(__doc__), epilog=_EPILOG)
    add_load_flags(p, capacity_help="KV tokens at least (default: what the contexts, steps and prefill reach)")
    p.add_argument("--steps", type=int,
                   help=f"timed decode steps per context (>= {MIN_STEPS}, default {DEFAULT_BENCH_STEPS})")
    p.add_argument("--chunk", type=int, help=f"prefill chunk rows (default {DEFAULT_BENCH_CHUNK})")
    p.add_argument("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)), help="decode contexts, comma separated")
    p.add_argument("--prefill", default=",".join(map(str, DEFAULT_PREFILL)),
                   help="prompt lengths of the prefill timings, comma separated")
    p.add_argument("--prefill-reps", type=int, default=10, help="prefill repetitions (median)")
    p.add_argument("--breakdown", metavar="CONTEXTS",
                   help="contexts whose step is timed call by call (default: the least and the most of "
                        "--contexts; none: no breakdown)")
    p.add_argument("--peer", choices=PEER_MODES,
                   help="the compiled PyTorch peer: on, off, or auto (when torch is there; default, or "
                        "kern.toml [bench] peer)")
    p.add_argument("--out", type=Path, help="write bench.json, bench.txt, breakdown.md and bench.png here "
                                            "(default: kern.toml [bench] out)")
    p.add_argument("--json", type=Path, help="write the rows as JSON here")
    p.add_argument("--floor-manifest", type=Path,
                   help="manifest whose step GEMMs (extern calls) make the cuBLAS floor (default: --manifest)")
    p.set_defaults(handler=_handle)
