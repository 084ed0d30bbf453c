"""A batch of the workload on one side, through the batched decode step (`ServingRoles.rows`).

From zeroed states, each sequence takes pages of its own (sequence i's after sequence i - 1's, as
many as its prompt and decode ids need) and its prompt but the last token goes through the chunk
program in the batch's chunks, its block table on the chunk's row. The block-table rows then hold
every sequence's pages (padded with its first page, as the engine writes them), the rows take
greedy sampling, and each batched step is seeded from the host: every row's input (the prompt's
last token, then each decode id: teacher forcing) staged at its position, the row seed program run
over all rows, and the step issued at as many rows as sequences. Each step reads every row's logits
(the batched step's [rows, vocab] buffer) and next token; the record's rows are step by step, row
by row within a step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from ..batch import Sampling, sampling_params
from ..inputs import stage, widen
from ..roles import RowRoles, prefill_chunks
from .drive import Record, Side, begin, read_states
from .pair import Facts
from .workload import Batch

__all__ = ["batch_pages", "drive_batch", "seat_batch", "seed_rows"]


def _rows(f: Facts) -> RowRoles:
    assert f.roles.rows is not None and f.row_logits is not None  # NOTE: the harness drives batches only then
    return f.roles.rows


def batch_pages(f: Facts, batch: Batch) -> list[NDArray[np.int64]]:
    """Each sequence's pages in token order: consecutive, sequence i's after sequence i - 1's."""
    p, steps, start = f.roles.page_tokens, len(batch.decode[0]), 0
    out: list[NDArray[np.int64]] = []
    for prompt in batch.prompts:
        need = -(-(len(prompt) + steps) // p)
        out.append(np.arange(start, start + need, dtype=np.int64))
        start += need
    return out


def _table(f: Facts, pages: Sequence[NDArray[np.int64]]) -> NDArray[np.int32]:
    table = np.zeros((len(pages), f.roles.blocks_len), dtype=np.int32)
    for i, own in enumerate(pages):
        table[i] = own[0]
        table[i, : len(own)] = own
    return table


def _prefill(side: Side, f: Facts, batch: Batch, chunk: int, table: NDArray[np.int32],
             pages: Sequence[NDArray[np.int64]]) -> None:
    r = f.roles
    for i, prompt in enumerate(batch.prompts):
        side.write_input(r.blocks, table[i])
        for a, b in prefill_chunks(len(prompt), min(chunk, r.chunk_max)):
            stage(side, r, pages[i], prompt[a:b], a)
            side.run(r.chunk_program, {r.chunk_var: b - a})


def seed_rows(side: Side, f: Facts, ids: Sequence[int], pos: Sequence[int], pages: Sequence[NDArray[np.int64]]) -> None:
    """Every row's input staged at its position, then the row seed program over all of them."""
    r, rows, p = f.roles, _rows(f), f.roles.page_tokens
    at = np.asarray(pos, dtype=np.int64)
    slots = [int(own[q // p]) * p + q % p for own, q in zip(pages, pos, strict=True)]
    side.write_input(r.token, np.asarray(ids, dtype=np.int64))
    side.write_input(r.position, at)
    side.write_input(r.slot, np.asarray(slots, dtype=np.int64))
    side.write_input(r.seq_len, (at + 1).astype(np.int32))
    side.write_input(rows.valid, (np.arange(rows.max_rows) < len(ids)).astype(np.int32))
    side.run(rows.seed_program, {})


def _step(side: Side, f: Facts, n: int) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    rows = _rows(f)
    assert f.row_logits is not None
    side.issue(rows.program, {rows.var: n})
    logits = widen(np.asarray(side.read_workspace(f.row_logits, n * f.vocab))).reshape(n, f.vocab)
    return logits, np.asarray(side.read_output(f.roles.next_token, n), dtype=np.int64)[:n]


def seat_batch(side: Side, f: Facts, batch: Batch, chunk: int) -> list[NDArray[np.int64]]:
    """From zeroed states: `batch`'s prompts but their last tokens prefilled (chunks of `chunk`
    rows), the block-table rows of every sequence and greedy sampling written; each sequence's
    pages."""
    rows = _rows(f)
    begin(side, f)
    pages = batch_pages(f, batch)
    table = _table(f, pages)
    _prefill(side, f, batch, chunk, table, pages)
    side.write_input(f.roles.blocks, table)
    prm, seeds = sampling_params([Sampling()] * len(batch.prompts), rows, 0)
    side.write_input(rows.sampling, prm)
    side.write_input(rows.seed, seeds)
    return pages


def drive_batch(side: Side, f: Facts, batch: Batch, chunk: int, *, states: bool = True) -> Record:
    """`batch` on `side` (prefill chunks of `chunk` rows) from zeroed states, through the batched
    step; the states read after it unless `states` is False (the record then holds none)."""
    n = len(batch.prompts)
    pages = seat_batch(side, f, batch, chunk)
    got: list[tuple[NDArray[np.float32], NDArray[np.int64]]] = []
    for k in range(batch.steps):
        ids = [p[-1] if k == 0 else d[k - 1] for p, d in zip(batch.prompts, batch.decode, strict=True)]
        seed_rows(side, f, ids, [len(p) - 1 + k for p in batch.prompts], pages)
        got.append(_step(side, f, n))
    assert f.row_logits is not None
    return Record(logits=np.concatenate([g[0] for g in got]), dtype=f.manifest.buffers[f.row_logits].dtype,
                  tokens=np.concatenate([g[1] for g in got]), states=read_states(side, f) if states else {})
