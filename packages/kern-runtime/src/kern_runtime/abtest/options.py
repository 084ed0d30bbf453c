"""What one `kern test` run asks for (`AbOptions`), checked before any GPU is looked for."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ApiError

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_DECODE_STEPS",
    "DEFAULT_ITERS",
    "DEFAULT_LOGIT_KL",
    "DEFAULT_RUNS",
    "DEFAULT_SEED",
    "AbOptions",
    "AbTestError",
    "check_options",
]

DEFAULT_SEED = 0x5EED
DEFAULT_RUNS = 16
DEFAULT_DECODE_STEPS = 16
DEFAULT_LOGIT_KL = 0.01
"""Nats: a row whose KL(A || B) is above this carries evidence; an argmax flip on it fails."""
DEFAULT_CAPACITY = 4096
DEFAULT_ITERS = 20


class AbTestError(ApiError):
    """`kern test` cannot start: a bad option, or two manifests that cannot be compared (different
    models or vocabularies, no common program) (caller)."""


@dataclass(frozen=True, slots=True)
class AbOptions:
    """One A/B test: the workload's seed and size, the evidence threshold, the stages to run.

    Attributes:
        seed: the workload's seed (same seed, same workload).
        runs: sequences in the workload, half of uniform length, half on structural boundaries.
        decode_steps: the most teacher-forced decode steps of a run (each run takes
            `decode_steps // 2` to `decode_steps`).
        logit_kl: KL(A || B) in nats above which a row carries evidence (see the ladder).
        capacity: KV tokens of one sequence; a run's prompt and decode steps fit in it.
        noise: run A against itself with another chunking (the noise band).
        perf: time the programs both manifests run.
        iters: step replays the graph TPOT is the median of.
    """

    seed: int = DEFAULT_SEED
    runs: int = DEFAULT_RUNS
    decode_steps: int = DEFAULT_DECODE_STEPS
    logit_kl: float = DEFAULT_LOGIT_KL
    capacity: int = DEFAULT_CAPACITY
    noise: bool = True
    perf: bool = True
    iters: int = DEFAULT_ITERS


def check_options(options: AbOptions) -> None:
    """Refuse options that cannot make a workload or a verdict (no GPU needed).

    Raises:
        AbTestError: a negative seed, a count below 1, a threshold that is not a positive finite
            number, or a capacity with no room for a prompt beside the decode steps.
    """
    o = options
    if o.seed < 0:
        raise AbTestError(f"--seed must not be negative, got {o.seed}")
    for flag, value in (("--runs", o.runs), ("--decode-steps", o.decode_steps), ("--iters", o.iters)):
        if value < 1:
            raise AbTestError(f"{flag} must be at least 1, got {value}")
    if not (math.isfinite(o.logit_kl) and o.logit_kl > 0):
        raise AbTestError(f"--logit-kl must be a positive number of nats, got {o.logit_kl}")
    if o.capacity <= o.decode_steps:
        raise AbTestError(f"--capacity {o.capacity} leaves no room for a prompt beside --decode-steps "
                          f"{o.decode_steps}: pass a larger capacity or fewer steps")
