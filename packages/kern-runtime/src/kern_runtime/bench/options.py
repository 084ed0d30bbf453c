"""What one `kern bench` run measures (`BenchOptions`), checked before the GPU is looked for, and
the KV capacity its timings need."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ApiError
from ..inputs import check_capacity
from ..loading import LoadOptions
from ..roles import ServingRoles

__all__ = [
    "BREAKDOWN_RUNS",
    "DEFAULT_BENCH_CHUNK",
    "DEFAULT_BENCH_STEPS",
    "DEFAULT_CONTEXTS",
    "DEFAULT_PREFILL",
    "MIN_STEPS",
    "PROMPT_VOCAB",
    "BenchError",
    "BenchOptions",
    "bench_capacity",
    "check_bench_options",
]

MIN_STEPS = 200
DEFAULT_BENCH_STEPS = 256
DEFAULT_BENCH_CHUNK = 2048
DEFAULT_CONTEXTS = (128, 2048, 8192, 32768)
DEFAULT_PREFILL = (709, 4096, 16384)
BREAKDOWN_RUNS = 5
PROMPT_VOCAB = 1000
"""Random prompt ids are drawn below this (every vocabulary has that many; timing ignores ids)."""


class BenchError(ApiError):
    """Bad benchmark options (too few steps, a context beyond the manifest's reach), a floor that
    cannot be taken, or a serving request that was refused or failed (caller)."""


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


def bench_capacity(load: LoadOptions, options: BenchOptions, roles: ServingRoles) -> int:
    """The KV capacity the timings need (at least `load.capacity`), checked against the model.

    Raises:
        BenchError: the contexts, prefills and steps reach past the model's positions.
        PromptError: `load.capacity` itself is past them.
    """
    o = options
    reach = max([*o.contexts, *o.prefill, *o.breakdown]) + 2 * o.steps + 32  # NOTE: device-fed replays advance too
    most = roles.reach(reach)
    if reach > most:
        raise BenchError(f"the contexts, prefills and breakdown reach {reach} positions with 2 x --steps {o.steps} "
                         f"and 32 more; the model holds {most}")
    capacity = max(load.capacity or 0, -(-reach // 256) * 256)
    if load.capacity is None:
        capacity = min(capacity, roles.reach(capacity))
    check_capacity(roles, capacity)
    return capacity
