"""The A/B workload: a pure function of a seed, both manifests' serving roles and the options.

Each run is one sequence: random prompt ids from the token domain both manifests take, a prefill
chunk size, and random decode ids that are fed in turn whatever either side predicts (teacher
forcing), so A and B see the same inputs on every row. Even runs draw the prompt length uniformly
from [1, capacity - decode steps], odd runs from the structural boundaries (a page +-1, a chunk
+-1, the chunk program's rows max, the most the capacity allows). Chunk sizes come from {rows max,
512, one page, random}; each run also names the other chunking the noise pass uses.

Where both manifests have a batched decode step, batches follow: each is 2 to `max_rows` sequences
(the fewer rows of the two) of different prompt lengths, one chunk size, the same number of
teacher-forced decode ids per row and greedy sampling, drawn from a generator of its own so the
runs stay what they are without batches. Every sequence of a batch holds pages of its own: the
prompts, the decode ids and a page's slack per sequence fit in the capacity together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..roles import ServingRoles
from .options import AbOptions, AbTestError

__all__ = ["Batch", "Run", "draw_batches", "draw_workload", "noise_chunk", "token_top"]


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


@dataclass(frozen=True, slots=True)
class Batch:
    """Sequences decoded together through the batched step.

    Attributes:
        prompts: each sequence's prompt ids (all of different lengths).
        chunk: the prefill chunk size of every sequence.
        decode: each sequence's decode ids, as many for each.
        noise_chunk: the chunk size of A's noise pass over the same prompts.
    """

    prompts: tuple[tuple[int, ...], ...]
    chunk: int
    decode: tuple[tuple[int, ...], ...]
    noise_chunk: int

    @property
    def steps(self) -> int:
        """Batched steps issued: the prompts' last tokens, then each decode id."""
        return len(self.decode[0]) + 1

    @property
    def rows(self) -> int:
        """Rows of evidence: one per sequence and step."""
        return len(self.prompts) * self.steps


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


BATCH_SALT = 0xBA7C
"""Mixed into the seed of the batches' generator (the runs' draws stay as they are)."""


def _prompt_room(capacity: int, n: int, steps: int, page: int) -> int:
    """The longest prompt each of n sequences may take so that their pages fit the capacity."""
    return (capacity - n * (page - 1) - n * steps) // n


def _most_rows(capacity: int, steps: int, page: int, max_rows: int) -> int:
    """The most sequences a batch can hold with different prompt lengths (below 2: no batch)."""
    return max((n for n in range(2, max_rows + 1) if _prompt_room(capacity, n, steps, page) >= n), default=0)


def _batch(rng: np.random.Generator, top: int, steps: int, n: int, room: int, rows_max: int, page: int) -> Batch:
    lengths = rng.choice(np.arange(1, room + 1), size=n, replace=False)
    prompts = tuple(tuple(int(t) for t in rng.integers(0, top + 1, size=int(k))) for k in lengths)
    decode = tuple(tuple(int(t) for t in rng.integers(0, top + 1, size=steps)) for _ in range(n))
    chunk = _chunk(rng, rows_max, page)
    return Batch(prompts, chunk, decode, noise_chunk(int(lengths.max()), chunk, rows_max))


def draw_batches(seed: int, a: ServingRoles, b: ServingRoles, options: AbOptions) -> tuple[Batch, ...]:
    """The batches of one A/B test: one per 4 runs (at least 1), none unless both manifests have
    a batched step and the capacity holds 2 sequences (same arguments, same batches).

    Raises:
        AbTestError: as `token_top`.
    """
    if a.rows is None or b.rows is None:
        return ()
    top = token_top(a, b)
    rows_max, max_rows = min(a.chunk_max, b.chunk_max), min(a.rows.max_rows, b.rows.max_rows)
    page = max(a.page_tokens, b.page_tokens)
    rng = np.random.default_rng([seed, BATCH_SALT])
    out: list[Batch] = []
    for _ in range(max(1, options.runs // 4)):
        steps = int(rng.integers(max(1, options.decode_steps // 2), options.decode_steps + 1))
        most = _most_rows(options.capacity, steps, page, max_rows)
        if most < 2:
            return tuple(out)
        n = int(rng.integers(2, most + 1))
        out.append(_batch(rng, top, steps, n, _prompt_room(options.capacity, n, steps, page), rows_max, page))
    return tuple(out)
