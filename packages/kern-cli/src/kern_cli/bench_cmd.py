"""`kern bench`: decode and prefill timings of one manifest on one GPU, beside floors measured in
the same run and a compiled PyTorch peer on the same checkpoint (`kern bench serve`: serving
throughput and latency, kern_cli.bench_serve).

    kern bench [target] [--manifest M --kernels K --kernel-sources S --weights W...]
        [--contexts 128,2048,8192,32768] [--prefill 709,4096,16384] [--steps 256] [--chunk 2048]
        [--breakdown CONTEXTS|none] [--peer auto|on|off] [--out DIR] [--json rows.json]

Flags in, `kern_runtime.bench` called (`bench_session`: the rows, the floors, the breakdown; the
peer, `python -m kern_peer`, through `measure_peer`), the table out. Every flag and input is checked
before the GPU is looked for. kern's report is written before the peer runs (a peer that never
returns leaves it on disk). `--out DIR` writes bench.json, bench.txt, breakdown.md and bench.png
(`kern_runtime.bench.report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kern_cli.config import PEER_MODES, config_for
from kern_cli.console import (
    fail,
    first_paragraph,
    output_dir_problem,
    output_file_problem,
    positive_ints,
)
from kern_cli.options import Bar, add_load_flags, guarded, logger, resolve_load

if TYPE_CHECKING:
    from kern_manifest import Manifest
    from kern_runtime.bench import BenchOptions, PeerPlan, Report
    from kern_runtime.loading import LoadOptions

__all__ = ["DEFAULT_BENCH_CHUNK", "DEFAULT_BENCH_STEPS", "DEFAULT_CONTEXTS", "DEFAULT_PREFILL", "MIN_STEPS",
           "register"]

PROG = "kern bench"
MIN_STEPS = 200
DEFAULT_BENCH_STEPS = 256
DEFAULT_BENCH_CHUNK = 2048
DEFAULT_CONTEXTS = (128, 2048, 8192, 32768)
DEFAULT_PREFILL = (709, 4096, 16384)
# NOTE: the flags' defaults and help; kern_runtime.bench.options holds the same numbers (importing it
# here would load the runtime for every `kern` command), and test_bench_cmd checks that they agree.


def _ints(flag: str, text: str) -> tuple[int, ...]:
    from kern_runtime.bench import BenchError

    return positive_ints(flag, text, BenchError)


def _breakdown(text: str | None, contexts: tuple[int, ...]) -> tuple[int, ...]:
    if text is None:
        return tuple(sorted({min(contexts), max(contexts)}))
    return () if text.strip().lower() == "none" else _ints("--breakdown", text)


@dataclass(frozen=True, slots=True)
class _Plan:
    load: LoadOptions
    manifest: Manifest
    options: BenchOptions
    peer: PeerPlan
    out: Path | None
    json: Path | None


def _options(args: argparse.Namespace) -> BenchOptions:
    from kern_runtime.bench import BenchOptions

    contexts = _ints("--contexts", args.contexts)
    return BenchOptions(
        contexts=contexts, steps=DEFAULT_BENCH_STEPS if args.steps is None else args.steps,
        prefill=_ints("--prefill", args.prefill), prefill_reps=args.prefill_reps,
        chunk=DEFAULT_BENCH_CHUNK if args.chunk is None else args.chunk, floor_manifest=args.floor_manifest,
        breakdown=_breakdown(args.breakdown, contexts))


def _outputs(args: argparse.Namespace, out: Path | None) -> None:
    from kern_runtime.bench import BenchError

    if args.json is not None and (problem := output_file_problem(args.json)) is not None:
        raise BenchError(f"--json {problem}")
    if out is not None and (problem := output_dir_problem(out)) is not None:
        raise BenchError(f"--out {problem}")


def _bench_args(args: argparse.Namespace) -> _Plan:
    """Every check that needs no GPU: flags, kern.toml, inputs, floor, capacity, the peer."""
    import kern_runtime.bench as kb
    from kern_runtime.loading import check_inputs

    cfg = config_for(args.config, Path.cwd())
    load = resolve_load(args, cfg)
    options = _options(args)
    kb.check_bench_options(options)
    out = args.out if args.out is not None else cfg.bench.out
    _outputs(args, out)
    inputs = check_inputs(load)
    kb.floor_manifest(inputs.manifest, load.manifest, options.floor_manifest)
    kb.bench_capacity(load, options, inputs.roles)
    mode = args.peer or cfg.bench.peer or "auto"
    fp8 = any(b.dtype == "fp8e4m3" and b.bind is not None for b in inputs.manifest.buffers.values())
    peer = kb.plan_peer(mode, kb.checkpoint_config(load.weights), default_weights=not load.weights, fp8=fp8)
    return _Plan(load, inputs.manifest, options, peer, out, args.json)


def _write(plan: _Plan, report: Report, log: Callable[[str], None]) -> None:
    from kern_runtime.bench import write_report

    if plan.json is not None:
        plan.json.write_text(json.dumps(report.rows, indent=2) + "\n")
    if plan.out is not None:
        files = write_report(report, plan.out, log)
        log("wrote " + ", ".join(str(f) for f in files))


def _measure(plan: _Plan, log: Callable[[str], None]) -> tuple[Report, bool]:
    """kern's measurements, written at once (a peer that never returns leaves them on disk),
    then the peer's; False when the peer failed."""
    import kern_runtime.bench as kb
    from kern_runtime.loading import default_weights

    load = plan.load
    if not load.weights:
        load = dataclasses.replace(load, weights=default_weights(plan.manifest, log, Bar(sys.stderr)))
    report = kb.bench_session(load, plan.options, log=log)
    ok = True
    if plan.peer.run:
        _write(plan, report, log)
        ok = kb.measure_peer(report, load.weights, plan.options, load.gpu, log)
    if plan.peer.note:
        report.notes.append(plan.peer.note)
    return report, ok


def _bench(args: argparse.Namespace) -> int:
    from kern_runtime import loading

    log = logger(PROG)
    plan = _bench_args(args)
    loading.probe_gpu(plan.load.gpu)
    report, ok = _measure(plan, log)
    print(report.text())
    for note in report.notes:
        log(note)
    _write(plan, report, log)
    return 0 if ok else 1


def _handle(args: argparse.Namespace) -> int:
    from kern_runtime.bench import BenchError, PeerError

    try:
        return guarded(PROG, lambda: _bench(args), BenchError, PeerError)
    except BrokenPipeError:
        raise  # NOTE: a closed stdout (`| head`): quiet_ends exits 141
    except OSError as exc:
        return fail(PROG, f"writing the report: {exc.strerror or exc}")


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
