"""The A/B workload: a pure function of a seed, both manifests' serving roles and the options.

Each run is one sequence: random prompt ids from the token domain both manifests take, a prefill
chunk size, and random decode ids that are fed in turn whatever either side predicts (teacher
forcing), so A and B see the same inputs on every row. Even runs draw the prompt length uniformly
from [1, capacity - decode steps], odd runs from the structural boundaries (a page +-1, a chunk
+-1, the chunk program's rows max, the most the capacity allows). Chunk sizes come from {rows max,
512, one page, random}; each run also names the other chunking the noise pass uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..roles import ServingRoles
from .options import AbOptions, AbTestError

__all__ = ["Run", "draw_workload", "noise_chunk", "token_top"]


@dataclass(frozen=True, slots=True)
class Run:
    """One sequence of the workload.

    Attributes:
        prompt: the prompt's token ids.
        chunk: the prefill chunk size (rows at most).
        decode: the token ids fed after the prompt, one per decode step.
        drawn: how the prompt length was drawn (`uniform`, `page+1`, `chunk-1`, `rows max`, ...).
        noise_chunk: the chunk size of A's noise pass over the same prompt.
    """

    prompt: tuple[int, ...]
    chunk: int
    decode: tuple[int, ...]
    drawn: str
    noise_chunk: int


def token_top(a: ServingRoles, b: ServingRoles) -> int:
    """The largest token id both manifests take (their token input's declared domain).

    Raises:
        AbTestError: neither manifest declares it.
    """
    tops = [t for t in (a.token_max, b.token_max) if t is not None]
    if not tops:
        raise AbTestError("neither manifest declares its token ids' domain (the token input's domain max)")
    return min(tops)


def noise_chunk(prompt_len: int, chunk: int, rows_max: int) -> int:
    """Another chunk size for the same prompt: half the rows the first chunk takes (at least 1), or
    2 when chunks of 1 row were drawn."""
    if chunk == 1:
        return min(2, rows_max)
    return max(1, min(chunk, prompt_len) // 2)


def _chunk(rng: np.random.Generator, rows_max: int, page: int) -> int:
    kind = int(rng.integers(0, 4))
    choices = (rows_max, min(512, rows_max), min(page, rows_max), int(rng.integers(1, rows_max + 1)))
    return choices[kind]


def _boundaries(rng: np.random.Generator, limit: int, chunk: int, rows_max: int,
                pages: tuple[int, ...]) -> dict[int, str]:
    """Structural lengths up to `limit`, each with the name of the boundary it sits on."""
    out: dict[int, str] = {}
    for unit, name in [*((p, "page") for p in pages), (chunk, "chunk")]:
        k = int(rng.integers(1, max(1, limit // unit) + 1)) * unit
        for d, sign in ((-1, "-1"), (0, ""), (1, "+1")):
            out.setdefault(k + d, name + sign)
    out.setdefault(rows_max, "rows max")
    out[limit] = "capacity"
    return {n: how for n, how in out.items() if 1 <= n <= limit}


def _length(rng: np.random.Generator, i: int, limit: int, chunk: int, rows_max: int,
            pages: tuple[int, ...]) -> tuple[int, str]:
    if i % 2 == 0:
        return int(rng.integers(1, limit + 1)), "uniform"
    found = _boundaries(rng, limit, chunk, rows_max, pages)
    n = sorted(found)[int(rng.integers(0, len(found)))]
    return n, found[n]


def draw_workload(seed: int, a: ServingRoles, b: ServingRoles, options: AbOptions) -> tuple[Run, ...]:
    """The runs of one A/B test (same arguments, same runs).

    Raises:
        AbTestError: neither manifest declares its token domain, or the capacity leaves no room for
            a prompt beside the decode steps.
    """
    top = token_top(a, b)
    limit = options.capacity - options.decode_steps
    if limit < 1:
        raise AbTestError(f"capacity {options.capacity} leaves no room for a prompt beside "
                          f"{options.decode_steps} decode steps")
    rows_max = min(a.chunk_max, b.chunk_max)
    pages = tuple(sorted({a.page_tokens, b.page_tokens}))
    rng = np.random.default_rng(seed)
    runs: list[Run] = []
    for i in range(options.runs):
        chunk = _chunk(rng, rows_max, pages[0])
        n, drawn = _length(rng, i, limit, chunk, rows_max, pages)
        steps = int(rng.integers(max(1, options.decode_steps // 2), options.decode_steps + 1))
        prompt = tuple(int(t) for t in rng.integers(0, top + 1, size=n))
        decode = tuple(int(t) for t in rng.integers(0, top + 1, size=steps))
        runs.append(Run(prompt, chunk, decode, drawn, noise_chunk(n, chunk, rows_max)))
    return tuple(runs)
