"""One side of an A/B test: a run of the workload driven through the slice of `Runtime` that a
row needs (inputs written, programs run or issued, outputs read), plus zeroing and reading the
states.

A run starts from zeroed states with the block table of pages 0, 1, 2, ... (`block_table`). The prompt goes through the chunk program in the run's chunks: with a head program (and two
tokens or more) all of it, then the head computes the first row; else all but the last token, which
the step computes after the step seed (the start program) has taken it. Each decode id is then
staged at its position, the step seed run (as after an engine's prefill) and the step issued. Every
row reads the logits output (bf16 widened to float32 exactly) and the next-token output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..inputs import block_table, stage, widen
from ..roles import prefill_chunks
from .pair import Facts
from .workload import Run

__all__ = [
    "Record", "Side", "begin", "drive", "prefill_row", "read_states", "stage_rows", "stage_step", "step_row",
]


class Side(Protocol):
    """What the harness drives: `Runtime`'s slice that a row uses, states zeroed and read,
    per-call timing, and the hand-over of its weights to the next side."""

    def write_input(self, name: str, array: ArrayLike) -> None: ...

    def run(self, program: str, vars: Mapping[str, int]) -> None: ...

    def issue(self, program: str, vars: Mapping[str, int]) -> None: ...

    def read_output(self, name: str, count: int | None = None) -> NDArray[Any]: ...

    def read_workspace(self, name: str, count: int) -> NDArray[Any]:
        """The first `count` elements of a buffer that is no output (the batched step's logits),
        as `read_output` gives an output's."""
        ...

    def synchronize(self) -> None: ...

    def time_calls(self, program: str, vars: Mapping[str, int], *,
                   before: str | None = None) -> tuple[list[tuple[str, float]], bool]: ...

    def zero_states(self) -> None:
        """Zero every state a run can reach."""
        ...

    def read_state(self, name: str, start: int, nbytes: int) -> NDArray[np.uint8]: ...

    def into_resident(self) -> object:
        """Close this side, keeping its weights for the next side's load."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Record:
    """One run on one side.

    Attributes:
        logits: [rows, vocab] float32, one row per position computed (prompt's last, then each
            decode id's).
        dtype: the logits buffer's dtype (`bf16`, `f32`).
        tokens: the next-token output of each row.
        states: each state's bytes after the run, from its start.
    """

    logits: NDArray[np.float32]
    dtype: str
    tokens: NDArray[np.int64]
    states: Mapping[str, NDArray[np.uint8]]


def _pages(f: Facts) -> NDArray[np.int64]:
    return np.arange(f.roles.pages_of(f.capacity), dtype=np.int64)


def _row(side: Side, f: Facts) -> tuple[NDArray[np.float32], int]:
    logits = widen(np.asarray(side.read_output(f.logits))).reshape(-1)[: f.vocab]
    return logits, int(side.read_output(f.roles.next_token, 1)[0])


def begin(side: Side, f: Facts) -> None:
    """Zero the states and write the block table of pages 0, 1, 2, ..."""
    side.zero_states()
    side.write_input(f.roles.blocks, block_table(f.roles, f.capacity))


def prefill_row(side: Side, f: Facts, prompt: Sequence[int], chunk: int) -> tuple[NDArray[np.float32], int]:
    """Prefill `prompt` in chunks of at most `chunk` rows; the row of its last token."""
    r, n, pages = f.roles, len(prompt), _pages(f)
    head = r.head_program is not None and r.head_row is not None and n >= 2
    chunks = prefill_chunks(n, min(chunk, r.chunk_max), last=head)
    for a, b in chunks:
        stage(side, r, pages, prompt[a:b], a)
        side.run(r.chunk_program, {r.chunk_var: b - a})
    if head:
        assert r.head_program is not None and r.head_row is not None
        stage(side, r, pages, prompt[-1:], n - 1)
        side.write_input(r.head_row, np.array([chunks[-1][1] - chunks[-1][0] - 1], dtype=np.int64))
        side.issue(r.head_program, r.step_vars)
        return _row(side, f)
    return step_row(side, f, prompt[-1], n - 1)


def stage_rows(side: Side, f: Facts, ids: Sequence[int], start: int) -> None:
    """Stage `ids` at positions from `start` (a chunk's, or the step's, inputs)."""
    stage(side, f.roles, _pages(f), ids, start)


def stage_step(side: Side, f: Facts, token: int, pos: int) -> None:
    """Stage `token` at `pos` as the step's input (and run the step seed)."""
    r = f.roles
    stage_rows(side, f, [token], pos)
    if r.start_program is not None:
        side.run(r.start_program, {})


def step_row(side: Side, f: Facts, token: int, pos: int) -> tuple[NDArray[np.float32], int]:
    """Stage `token` at `pos` as the step's input and issue the step; its row."""
    stage_step(side, f, token, pos)
    side.issue(f.roles.step_program, f.roles.step_vars)
    return _row(side, f)


def read_states(side: Side, f: Facts) -> dict[str, NDArray[np.uint8]]:
    """Each state's bytes that a run can reach, from its start."""
    return {name: side.read_state(name, 0, nbytes) for name, nbytes in f.states.items()}


def drive(side: Side, f: Facts, run: Run, chunk: int, *, states: bool = True) -> Record:
    """`run` on `side` (prefill chunks of `chunk` rows) from zeroed states; the states read after
    it unless `states` is False (the record then holds none)."""
    begin(side, f)
    rows = [prefill_row(side, f, run.prompt, chunk)]
    n = len(run.prompt)
    rows += [step_row(side, f, t, n + i) for i, t in enumerate(run.decode)]
    images = read_states(side, f) if states else {}
    return Record(logits=np.stack([r[0] for r in rows]), dtype=f.manifest.buffers[f.logits].dtype,
                  tokens=np.array([r[1] for r in rows], dtype=np.int64), states=images)
