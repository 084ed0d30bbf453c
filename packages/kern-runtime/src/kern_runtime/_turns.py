"""A turn's compute on the one-row path (`Turns`): the prompt's prefill chunks (the short ones
replayed from the backend's graph cache), the head program's first token or the pending token
seated, and the one-row decode step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ._backend import Caching, launch
from ._leases import Sequence
from ._seats import Seats
from .roles import ServingRoles, prefill_chunks

if TYPE_CHECKING:
    from ._backend import Backend
    from .engine import EngineConfig

__all__ = ["Turns"]


class Turns:
    """Runs the chunk, head, start and step programs of one sequence at a time."""

    def __init__(self, backend: Backend, roles: ServingRoles, config: EngineConfig, seats: Seats) -> None:
        self.backend = backend
        self.roles = roles
        self.seats = seats
        self._eager = config.eager
        self._chunk = min(config.chunk, roles.chunk_max)
        self._graph_rows = 0
        """Chunks of at most this many rows are issued (replayed from the backend's graph cache)."""
        if not config.eager and config.chunk_graphs and config.chunk_graph_rows and isinstance(backend, Caching):
            backend.cache_graphs(roles.chunk_program, config.chunk_graphs)
            self._graph_rows = config.chunk_graph_rows

    def prefill(self, seq: Sequence, *, first: bool) -> int | None:
        """`seq.tokens` from `seq.kv` on, its block table written first: with `first`, a head
        program and at least two tokens to prefill, through the last token and the head's first
        generated token (returned, appended); else up to the last token, which is seated."""
        self.seats.write_table(seq)
        if first and self.roles.head_program is not None and len(seq.tokens) - seq.kv >= 2:
            return self._prefill_head(seq)
        self._chunks(seq, last=False)
        seq.kv = len(seq.tokens) - 1
        self.seats.seat(seq)
        return None

    def step(self, seq: Sequence) -> int:
        """One step program of `seq` (re-seated when the row holds another): its token read back
        and appended."""
        lease = seq.lease
        assert lease is not None
        self.seats.ensure(seq)
        lease.kv_index(seq.kv)
        r = self.roles
        self._launch(r.step_program, r.step_vars)
        token = int(self.backend.read_output(r.next_token, 1)[0])
        seq.kv += 1
        self._took(seq, token)
        return token

    def _chunks(self, seq: Sequence, *, last: bool) -> int:
        """The prompt's tokens from `seq.kv` up to (not including) the last (`last`: through it) in
        chunks; the rows of the last chunk (0 for none)."""
        assert seq.lease is not None
        n, start = len(seq.tokens), seq.kv
        rows = 0
        for a, b in prefill_chunks(n - start, self._chunk, last=last):
            lo, hi = start + a, start + b
            seq.lease.kv_indices(lo, hi)
            self.seats.stage(seq, seq.tokens[lo:hi], lo)
            if hi - lo <= self._graph_rows:
                self.backend.issue(self.roles.chunk_program, {self.roles.chunk_var: hi - lo})
            else:
                self.backend.run(self.roles.chunk_program, {self.roles.chunk_var: hi - lo})
            rows = hi - lo
        return rows

    def _prefill_head(self, seq: Sequence) -> int:
        """The prompt's tokens from `seq.kv` through the last in chunks, then the head program over
        the last chunk's last row: the first generated token, read back and appended; the row then
        holds the sequence as after a step."""
        r = self.roles
        assert seq.lease is not None and r.head_program is not None and r.head_row is not None
        n = len(seq.tokens)
        rows = self._chunks(seq, last=True)
        self.seats.stage(seq, [seq.tokens[n - 1]], n - 1)
        self.backend.write_input(r.head_row, np.array([rows - 1], dtype=np.int64))
        self._launch(r.head_program, r.step_vars)
        token = int(self.backend.read_output(r.next_token, 1)[0])
        seq.kv = n
        self._took(seq, token)
        return token

    def _took(self, seq: Sequence, token: int) -> None:
        """`token`, just computed on the row at `seq.kv - 1`, appended; without a start program its
        input is staged for the next step now (unless the room is spent: the row is vacated)."""
        seq.tokens.append(token)
        self.seats.hold(seq)
        if self.roles.start_program is None:
            if seq.kv < seq.room:
                self.seats.stage(seq, [token], seq.kv)
            else:
                self.seats.vacate()

    def _launch(self, program: str, vars: Mapping[str, int]) -> None:
        launch(self.backend, program, vars, self._eager)
