"""The timing section of an A/B test, measured on each side while it is loaded: per-call times of
the chunk and step programs (`time_calls`, eager, a timing event between calls; the step seed
before each step run), the graph TPOT (the median of `iters` step replays, each synchronized, at a
fixed context), the batched step's (the same at `BATCH_ROWS` rows of that context, where both
sides have one and the capacity holds them) and prefill at a few lengths (the median of 3 after one
untimed run)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..bench.report import call_kinds
from .drive import Side, begin, prefill_row, stage_rows, stage_step
from .pair import Facts
from .rows import seat_batch, seed_rows
from .workload import Batch

__all__ = ["BATCH_ROWS", "CALL_RUNS", "CONTEXT", "PREFILL_LENGTHS", "Timing", "time_side"]

PREFILL_LENGTHS = (16, 128, 512, 2048)
"""Prompt lengths of the prefill timings (those the capacity holds)."""
CONTEXT = 128
"""The context the step is timed at (less where the capacity is smaller)."""
BATCH_ROWS = 8
"""Rows of the batched step's timing (fewer where the step or the capacity holds fewer, none below 2)."""
CALL_RUNS = 3
"""Eager runs each program's per-call times are the mean of."""
_REPS = 3

Kinds = tuple[tuple[str, float, float], ...]
"""(call kind, calls per run, microseconds per run), most first."""


@dataclass(frozen=True, slots=True)
class Timing:
    """One side's timings.

    Attributes:
        calls: per program timed call by call (by name): its call kinds.
        tpot_ms: the step graph's median replay, milliseconds.
        context: the context the step ran at.
        prefill_ms: prompt length -> prefill milliseconds.
        batched: the batched step's rows and median replay in milliseconds, each row at `context`;
            None: not timed.
    """

    calls: Mapping[str, Kinds]
    tpot_ms: float
    context: int
    prefill_ms: Mapping[int, float]
    batched: tuple[int, float] | None = None


def _prompt(n: int) -> list[int]:
    return [(7 * i + 3) % 1000 for i in range(n)]


def _calls(side: Side, f: Facts, programs: tuple[str, ...], context: int) -> dict[str, Kinds]:
    r = f.roles
    out: dict[str, Kinds] = {}
    if r.chunk_program in programs:
        rows = min(512, r.chunk_max, context)
        stage_rows(side, f, _prompt(rows), 0)
        runs = [side.time_calls(r.chunk_program, {r.chunk_var: rows})[0] for _ in range(CALL_RUNS)]
        out[r.chunk_program] = tuple(call_kinds(runs))
    if r.step_program in programs:
        stage_step(side, f, 1, context)
        runs = [side.time_calls(r.step_program, r.step_vars, before=r.start_program)[0] for _ in range(CALL_RUNS)]
        out[r.step_program] = tuple(call_kinds(runs))
    return out


def _tpot_ms(side: Side, f: Facts, context: int, iters: int) -> float:
    samples: list[float] = []
    for _ in range(iters + 1):
        stage_step(side, f, 1, context)
        side.synchronize()
        t0 = time.perf_counter()
        side.issue(f.roles.step_program, f.roles.step_vars)
        side.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples[1:])


def _prefill_ms(side: Side, f: Facts, n: int) -> float:
    samples: list[float] = []
    for _ in range(_REPS + 1):
        side.synchronize()
        t0 = time.perf_counter()
        prefill_row(side, f, _prompt(n), f.roles.chunk_max)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples[1:])


def _batch_rows(f: Facts, programs: tuple[str, ...], context: int) -> int:
    """The rows of the batched timing: 0 when there is none to time."""
    rows = f.roles.rows
    if rows is None or f.row_logits is None or rows.program not in programs:
        return 0
    per = f.roles.whole_pages(context + 1)
    n = min(BATCH_ROWS, rows.max_rows, f.capacity // per)
    return n if n >= 2 else 0


def _batched_ms(side: Side, f: Facts, n: int, context: int, iters: int) -> float:
    rows = f.roles.rows
    assert rows is not None
    prompts = tuple(tuple(_prompt(context + i)[i:]) for i in range(n))
    batch = Batch(prompts, f.roles.chunk_max, tuple(() for _ in prompts), f.roles.chunk_max)
    pages = seat_batch(side, f, batch, f.roles.chunk_max)
    samples: list[float] = []
    for _ in range(iters + 1):
        seed_rows(side, f, [p[-1] for p in prompts], [context - 1] * n, pages)
        side.synchronize()
        t0 = time.perf_counter()
        side.issue(rows.program, {rows.var: n})
        side.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples[1:])


def time_side(side: Side, f: Facts, programs: tuple[str, ...], iters: int) -> Timing:
    """`side`'s timings: `programs` (of its chunk and step) call by call, the TPOT over `iters`
    replays, the prefills the capacity holds (each reading its first row back), and the batched
    step over `iters` replays where `programs` has it."""
    context = min(CONTEXT, f.capacity - 1)
    begin(side, f)
    prefill_row(side, f, _prompt(context), f.roles.chunk_max)
    calls = _calls(side, f, programs, context)
    tpot = _tpot_ms(side, f, context, iters)
    prefill = {n: _prefill_ms(side, f, n) for n in PREFILL_LENGTHS if n < f.capacity}
    n = _batch_rows(f, programs, context)
    batched = (n, _batched_ms(side, f, n, context, iters)) if n else None
    return Timing(calls, tpot, context, prefill, batched)
