"""`kern bench`'s measurements on the GPU: decode and prefill loops over the bench's `Driver`,
the per-call breakdown of a step, the GEMM-only floor of a step, and the yardsticks of the floors
(a device copy, a bf16 GEMM through the runtime's cuBLASLt), each measured in the same run as the
timings it bounds."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kern_manifest import Manifest, parse_manifest
from kern_pool import Capacity

from ..probes import copy_rate
from .floors import gemm_only_manifest, step_program
from .report import CallTime, Row, row

if TYPE_CHECKING:
    from ..runtime import Runtime
    from .driver import Driver

__all__ = [
    "GEMM_RATE_REPS",
    "GEMM_RATE_SIZE",
    "WARMUP_STEPS",
    "breakdown_runs",
    "decode_rows",
    "gemm_floor",
    "gemm_rate",
    "gemm_rate_manifest",
    "prefill_rows",
    "prompt",
    "yardsticks",
]

WARMUP_STEPS = 10
GEMM_RATE_SIZE = 8192
GEMM_RATE_REPS = 20


def _median_ms(samples_ns: Sequence[int]) -> float:
    return statistics.median(samples_ns) / 1e6


def prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    """n random token ids below `vocab` (timing does not depend on them)."""
    return [int(x) for x in rng.integers(0, vocab, size=n)]


def _stepped_ns(s: Driver, steps: int, rewind: bool) -> list[int]:
    """Wall time of single steps, each replay + readback (+ host feed); `rewind`: every step at
    the end of the prefill (the rewind untimed)."""
    samples: list[int] = []
    for _ in range(steps):
        if rewind:
            s.rewind()
            s.rt.synchronize()
        t0 = time.perf_counter_ns()
        s.step()
        samples.append(time.perf_counter_ns() - t0)
    return samples


def _replays_ms(s: Driver, steps: int, fixed: bool) -> float:
    """Back-to-back replays of the step graph, no readback, wall over the count. `fixed`: the step
    seed program runs before each replay, so every one computes the position after the prefill
    (a device-fed manifest; a host-fed one recomputes its staged position anyway)."""
    seed = s.roles.start_program if fixed else None
    if fixed:
        s.rewind()
    s.rt.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        if seed is not None:
            s.rt.run(seed, {})
        s.rt.issue(s.roles.step_program, s.roles.step_vars)
    s.rt.synchronize()
    return (time.perf_counter_ns() - t0) / steps / 1e6


def decode_rows(s: Driver, ctx: int, steps: int, vocab: int, chunk: int, rng: np.random.Generator) -> list[Row]:
    """The decode rows at one context: prefill `ctx` tokens, warm up, then the host loop (walking),
    the step graph back to back as it feeds itself (walking on), the same at the context exactly,
    and single rewound steps. The row stays rewound to the end of the prefill."""
    s.prefill(prompt(rng, ctx, vocab), chunk)
    for _ in range(WARMUP_STEPS):
        s.step()
    per_token = _median_ms(_stepped_ns(s, steps, rewind=False))
    # NOTE: a device-fed step advances its own inputs: back-to-back replays walk on from here.
    gpu_ms = _replays_ms(s, steps, fixed=False)
    gpu_fixed = _replays_ms(s, steps, fixed=True)
    fixed = _median_ms(_stepped_ns(s, steps, rewind=True))
    s.rewind()
    fed = s.roles.start_program is not None
    return [
        row(f"decode_ms_per_token@ctx{ctx}", per_token, "ms",
            peer=f"replay + readback per step, contexts {ctx + WARMUP_STEPS}..{ctx + WARMUP_STEPS + steps - 1}"),
        row(f"decode_fixed_ms_per_token@ctx{ctx}", fixed, "ms",
            peer="replay + readback, every step rewound to the end of the prefill (untimed)"),
        row(f"decode_gpu_ms_per_step@ctx{ctx}", gpu_ms, "ms",
            peer="graph back to back, tokens fed in turn on the device" if fed
            else "graph back to back (host-fed: the same position)"),
        row(f"decode_gpu_fixed_ms_per_step@ctx{ctx}", gpu_fixed, "ms",
            peer="graph back to back at this context (+ the step seed's copies)" if fed
            else "graph back to back at this context"),
        row(f"decode_host_gap_us@ctx{ctx}", (per_token - gpu_ms) * 1e3, "us",
            peer="per-token time minus back-to-back GPU time: readback + host feed + launch"),
    ]


def breakdown_runs(s: Driver, runs: int, log: Callable[[str], None]) -> list[list[CallTime]]:
    """`runs` eager runs of the step at the position after the last prefill, each call timed
    apart (`Runtime.time_calls`); says through `log` when the host fell behind the GPU."""
    out: list[list[CallTime]] = []
    behind = 0
    for _ in range(runs):
        s.rewind()
        calls, held = s.rt.time_calls(s.roles.step_program, s.roles.step_vars, before=s.roles.start_program)
        out.append(calls)
        behind += not held
    if behind:
        log(f"breakdown: in {behind} of {runs} runs the host fell behind the GPU (some calls include host time)")
    s.rewind()
    return out


def prefill_rows(s: Driver, n: int, reps: int, vocab: int, chunk: int, rng: np.random.Generator) -> list[Row]:
    """Chunked prefill of an n-token prompt (its first n-1 tokens through the chunk program) and
    the time to the first token; medians of `reps` after one untimed run."""
    ids = prompt(rng, n, vocab)
    pre: list[int] = []
    ttft: list[int] = []
    for _ in range(reps + 1):
        s.rt.synchronize()
        t0 = time.perf_counter_ns()
        s.prefill(ids, chunk)
        s.rt.synchronize()
        t1 = time.perf_counter_ns()
        s.step()
        t2 = time.perf_counter_ns()
        pre.append(t1 - t0)
        ttft.append(t2 - t0)
    return [row(f"prefill_ms@{n}", _median_ms(pre[1:]), "ms", peer=f"chunks of {min(chunk, s.roles.chunk_max)}"),
            row(f"ttft_ms@{n}", _median_ms(ttft[1:]), "ms")]


def gemm_rate_manifest(size: int, schema_version: int) -> dict[str, Any]:
    """One bf16 GEMM C[size, size] = A @ W^T through the runtime's cuBLASLt, as a graph program."""
    sq = [size, size]
    return {
        "schema_version": schema_version, "model": f"bench-gemm-{size}",
        "buffers": {"a": {"dtype": "bf16", "shape": sq, "kind": "input"},
                    "w": {"dtype": "bf16", "shape": sq, "kind": "input"},
                    "c": {"dtype": "bf16", "shape": sq, "kind": "workspace"}},
        "modules": {},
        "ops": {"gemm": {"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32", "i32"],
                         "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn"}]}}},
        "programs": {"mm": {"graph": True, "calls": [{"op": "gemm", "label": "mm", "args": [
            {"buf": "a"}, {"buf": "w"}, {"buf": "c"}, {"i32": size}, {"i32": size}, {"i32": size}]}]}},
    }  # fmt: skip


def _bf16_noise(n: int) -> np.ndarray:
    """n bf16 bit patterns of N(0, 1) values (a tiled pool: the GEMM's time does not depend on them)."""
    pool = np.random.default_rng(1).standard_normal(1 << 20, dtype=np.float32)
    bits = (pool.view(np.uint32) + 0x8000) >> 16  # NOTE: round half up; exact rounding does not matter here
    return np.resize(bits.astype(np.uint16), n)


def gemm_rate(kernels: Path, gpu: int, schema_version: int, size: int = GEMM_RATE_SIZE,
              reps: int = GEMM_RATE_REPS) -> float:
    """bf16 FLOP/s of a size^3 GEMM through the runtime's cuBLASLt, replayed back to back."""
    from ..runtime import Runtime
    from ..weights import Safetensors

    manifest = parse_manifest(json.dumps(gemm_rate_manifest(size, schema_version)))
    with Runtime.load(manifest, kernels, gpu=gpu) as rt:
        rt.load_weights(Safetensors.parse(b"\x02\x00\x00\x00\x00\x00\x00\x00{}"))
        rt.write_input("a", _bf16_noise(size * size))
        rt.write_input("w", _bf16_noise(size * size)[::-1].copy())
        for _ in range(3):
            rt.issue("mm", {})
        rt.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            rt.issue("mm", {})
        rt.synchronize()
        seconds = (time.perf_counter_ns() - t0) / 1e9
    return 2.0 * size**3 * reps / seconds


def yardsticks(kernels: Path, gpu: int, schema_version: int, log: Callable[[str], None]) -> tuple[float, float]:
    """(device copy bytes/s, bf16 GEMM FLOP/s) of `gpu`, measured before the bench loads its runtime."""
    log("yardsticks: device copy, bf16 GEMM")
    return copy_rate(gpu), gemm_rate(kernels, gpu, schema_version)


def gemm_floor(s: Driver, manifest: Manifest, kernels: Path, weights: Sequence[Path], gpu: int,
               steps: int) -> Row:
    """The `gemm_floor_ms_per_step` row: the extern GEMM calls of `manifest`'s step alone in one graph,
    replayed `steps` times on a runtime over `s`'s resident weights (`Runtime.into_resident`)."""
    from ..runtime import Runtime
    from ..weights import Safetensors

    gm = gemm_only_manifest(manifest, step_program(manifest))
    calls = len(gm.programs["gemms"].calls)
    resident = s.rt.into_resident()
    try:
        rt = Runtime.load(gm, kernels, gpu=gpu, capacity=Capacity(tokens=16, seqs=1), over=resident)
    except BaseException:
        resident.close()
        raise
    try:
        rt.load_weights(Safetensors.open([str(p) for p in weights]))
        ms = _replayed_ms(rt, dict.fromkeys(gm.vars, 1), steps)
    finally:
        rt.close()
    return row("gemm_floor_ms_per_step", ms, "ms",
               peer=f"cublasLt: {manifest.model}'s {calls} step GEMM calls in one graph")


def _replayed_ms(rt: Runtime, vars_: dict[str, int], steps: int) -> float:
    for _ in range(10):
        rt.issue("gemms", vars_)
    rt.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        rt.issue("gemms", vars_)
    rt.synchronize()
    return (time.perf_counter_ns() - t0) / steps / 1e6
