"""One greedy generation on every rank of a tensor-parallel group held by this process.

The runtimes are loaded and joined (`kern_runtime.loading.load_ranks`); each rank runs the same
`Session` on its own thread (prefill, then decode steps), so each rank's collectives meet the
others' on the GPUs. Every rank's argmax reads the same gathered logits: their tokens must be equal.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .errors import RanksDisagreeError
from .roles import ServingRoles
from .runtime import Runtime
from .session import Session, check_capacity, check_prompt

__all__ = ["RankRun", "RanksRun", "generate_ranks"]


@dataclass(frozen=True, slots=True)
class RankRun:
    """One rank's generation: its tokens, and its prefill and decode wall times in seconds."""

    tokens: list[int]
    prefill_s: float
    decode_s: float


@dataclass(frozen=True, slots=True)
class RanksRun:
    """The group's generation: rank 0's tokens (every rank's, checked) and the slowest rank's
    prefill and decode times in seconds."""

    tokens: list[int]
    prefill_s: float
    decode_s: float


def _rank(rt: Runtime, roles: ServingRoles, capacity: int, prompt: Sequence[int], steps: int,
          chunk: int, eager: bool) -> RankRun:
    rt.make_current()
    s = Session(rt, roles, capacity)
    if not eager:
        rt.capture_graph(roles.step_program, roles.step_vars)
    t1 = time.perf_counter()
    s.prefill(prompt, chunk)
    rt.synchronize()
    t2 = time.perf_counter()
    tokens = list(s.decode(steps, eager))
    return RankRun(tokens, t2 - t1, time.perf_counter() - t2)


def generate_ranks(runtimes: Sequence[Runtime], roles: ServingRoles, capacity: int, prompt: Sequence[int],
                   steps: int, *, chunk: int, eager: bool = False) -> RanksRun:
    """Prefill `prompt` in chunks of `chunk` and decode `steps` tokens on every rank at once.

    Raises:
        SessionError: a bad prompt or capacity (as `Session`), before any rank runs.
        RanksDisagreeError: a rank generated other tokens than rank 0.
    """
    check_capacity(roles, capacity)
    check_prompt(roles, capacity, prompt)
    with ThreadPoolExecutor(max_workers=len(runtimes)) as pool:
        futures = [pool.submit(_rank, rt, roles, capacity, prompt, steps, chunk, eager) for rt in runtimes]
        runs = [f.result() for f in futures]
    differ = [r for r, run in enumerate(runs) if run.tokens != runs[0].tokens]
    if differ:
        raise RanksDisagreeError(f"ranks {differ} generated other tokens than rank 0: the tensor-parallel "
                                 "manifest or its collectives are wrong")
    return RanksRun(runs[0].tokens, max(r.prefill_s for r in runs), max(r.decode_s for r in runs))
