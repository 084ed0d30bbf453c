"""`kern bench`: decode and prefill timings of one manifest on one GPU, beside floors measured in
the same run (`bench_session`).

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
per prefill of n tokens: `prefill_ms@<n>` / `ttft_ms@<n>` (the chunk program as a turn runs it;
medians of `prefill_reps`) and `compute_floor_ms@<n>` (the forward's FLOPs / `gemm_rate_bf16`, a
bf16 8192^3 GEMM through the runtime's cuBLASLt); `gemm_floor_ms_per_step` (the step's GEMM calls
alone through cuBLASLt in one graph; from the all-cuBLASLt sibling manifest when the step has
none); `weight_bytes_per_step`. The breakdown times each call of the step eagerly at its contexts
(`Runtime.time_calls`), per call kind. The compiled PyTorch peer's rows come from
`kern_runtime.bench.peer`; the report's files from `kern_runtime.bench.report`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from kern_pool import Capacity

from ..loading import LoadError, LoadInputs, LoadOptions, check_inputs, ensure_kernels
from ..providers import ProviderError, find
from ..runtime import Runtime
from . import measure
from .driver import Driver
from .floors import decode_weight_bytes, floor_manifest, kv_bytes_per_token, no_floor_note
from .options import BREAKDOWN_RUNS, PROMPT_VOCAB, BenchOptions, bench_capacity, check_bench_options
from .report import Report, checkpoint_config, compute_floor_rows, floor_rows, row

__all__ = ["bench_session"]


def bench_session(load: LoadOptions, options: BenchOptions, log: Callable[[str], None] = lambda s: None) -> Report:
    """Measure the yardsticks, load once, then decode at each context (and the breakdown), each
    prefill, and the GEMM-only floor: the extern GEMM calls of `options.floor_manifest`'s step
    (default: the measured manifest, or, when its step runs no GEMM through cuBLASLt, its
    all-cuBLASLt sibling: `find_floor_manifest`; none, and a note says so, when there is no such
    manifest). `load.weights` must be given.

    Raises:
        BenchError: bad options (see `check_bench_options`), or a floor without GEMMs.
        LoadError: no weights, a missing manifest or kernels that cannot be had.
        kern_runtime errors: the manifest, weights, capacity, or a failure on the GPU.
    """
    check_bench_options(options)
    inputs = check_inputs(load)
    floor = floor_manifest(inputs.manifest, load.manifest, options.floor_manifest)
    capacity = bench_capacity(load, options, inputs.roles)
    if inputs.weights is None:
        raise LoadError("kern bench needs weights: pass --weights or use default_weights()")
    weights = inputs.weights
    ensure_kernels(inputs.manifest, load.kernels, load.kernel_sources, log)
    rng = np.random.default_rng(0)
    report = Report([row("weight_bytes_per_step", decode_weight_bytes(inputs.manifest, inputs.roles.step_program) / 1e9,
                         "GB")], title=f"{inputs.manifest.model}: decode ms/token")
    copy, gemm = measure.yardsticks(load.kernels, load.gpu, inputs.manifest.schema_version, log)
    pool = inputs.roles.whole_pages(capacity)
    rt = Runtime.open(inputs.manifest, load.kernels, weights, gpu=load.gpu, capacity=Capacity(tokens=pool, seqs=1),
                      log=log)
    try:
        s = Driver(rt, inputs.roles, capacity)
        _decode_and_breakdown(s, options, report, rng, log)
        for n in options.prefill:
            log(f"prefill of {n} tokens")
            report.rows += measure.prefill_rows(s, n, options.prefill_reps, PROMPT_VOCAB, options.chunk, rng)
        if floor is None:
            report.notes.append(no_floor_note(inputs.manifest, load.manifest))
        else:
            log("GEMM-only floor")
            report.rows.append(measure.gemm_floor(s, floor, load.kernels, weights, load.gpu, options.steps))
    finally:
        rt.close()
    _floors(inputs, load.weights or weights, options, (copy, gemm), report)
    return report


def _decode_and_breakdown(s: Driver, options: BenchOptions, report: Report, rng: np.random.Generator,
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


def _floors(inputs: LoadInputs, weights: Sequence[Path], options: BenchOptions, rates: tuple[float, float],
            report: Report) -> None:
    """The bandwidth floors at the copy rate, and the compute floors at the GEMM rate (`rates`)."""
    copy, gemm = rates
    step = inputs.roles.step_program
    report.rows += floor_rows(decode_weight_bytes(inputs.manifest, step), kv_bytes_per_token(inputs.manifest, step),
                              options.contexts, copy)
    config = checkpoint_config(weights)
    if config is None:
        report.notes.append("no compute floor: the weights have no config.json beside them")
        return
    try:
        provider = find(inputs.manifest)
    except ProviderError as exc:
        report.notes.append(f"no compute floor: {exc}")
        return
    try:
        report.rows += compute_floor_rows(provider.prefill_flops, config, options.prefill, gemm)
    except provider.errors as exc:
        report.notes.append(f"no compute floor: {exc}")
