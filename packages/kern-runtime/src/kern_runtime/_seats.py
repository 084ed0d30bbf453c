"""What the step programs' inputs on the device hold, and the writes that change them (`Seats`):
the one-row step's seated sequence, the block-table rows and the leases they were written from,
the batched step's rows as the device fed them, its padding lease and its sampling inputs."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from kern_pool import Lease

from ._leases import Sequence
from .batch import Sampling, sampling_params
from .inputs import stage
from .roles import ServingRoles

if TYPE_CHECKING:
    from ._backend import Backend

__all__ = ["Seats"]


class Seats:
    """The step inputs on the device: a row is written only when what it holds differs from what
    the step needs (the sequence, its lease, its position, the rows' sampling)."""

    def __init__(self, backend: Backend, roles: ServingRoles) -> None:
        self.backend = backend
        self.roles = roles
        self._seated: tuple[Sequence, Lease] | None = None
        self._pages: tuple[Lease, NDArray[np.int64]] | None = None
        """The last lease staged or seated, and its pages as an array."""
        rows = roles.rows.max_rows if roles.rows is not None else 0
        self.fed: list[tuple[Sequence, Lease, int] | None] = [None] * rows
        """Each batched row's sequence, lease and next position as the device feeds it (None: the
        next step seeds the row from the host)."""
        # NOTE: the host's copy of the rows' block table; -1 (no page) until a row is written, so
        # the first step writes every row it uses whatever the device buffer held before
        self._table = np.full((rows, roles.blocks_len), -1, dtype=np.int32)
        self._table_of: list[Lease | None] = [None] * rows
        """The lease whose pages each device block-table row holds."""
        self.pad: Lease | None = None
        """The one-page lease of the batched step's padding rows, once a step needed one."""
        self.sampling: tuple[tuple[Sampling, ...], int] | None = None
        """The rows' sampling and the bucket the device's sampling inputs hold."""

    # ---- the one-row step --------------------------------------------------------------------

    def seated(self, seq: Sequence) -> bool:
        """Whether the row holds `seq`'s inputs at its live lease."""
        return self._seated is not None and self._seated[0] is seq and self._seated[1] is seq.lease

    def hold(self, seq: Sequence) -> None:
        """The row holds `seq`'s inputs now."""
        assert seq.lease is not None
        self._seated = (seq, seq.lease)

    def unseat(self, seq: Sequence) -> None:
        """The row no longer holds `seq`'s inputs (the next step of any sequence re-seats)."""
        if self._seated is not None and self._seated[0] is seq:
            self._seated = None

    def vacate(self) -> None:
        """The row holds no sequence's inputs."""
        self._seated = None

    def ensure(self, seq: Sequence) -> None:
        """`seq` seated on the row (its block table written, its pending token staged) unless it
        is already."""
        if not self.seated(seq):
            self.write_table(seq)
            self.seat(seq)

    def seat(self, seq: Sequence) -> None:
        """Put `seq`'s pending token on the row (its block table is written)."""
        assert seq.lease is not None
        self.stage(seq, [seq.tokens[seq.kv]], seq.kv)
        if self.roles.start_program is not None:
            self.backend.run(self.roles.start_program, {})
        self._seated = (seq, seq.lease)

    def page_ids(self, lease: Lease) -> NDArray[np.int64]:
        """The lease's pages in token order, as an array made once per lease (a live lease's pages
        never change; sealing only moves them into its chain)."""
        held = self._pages
        if held is None or held[0] is not lease:
            held = self._pages = (lease, np.asarray(lease.pages, dtype=np.int64))
        return held[1]

    def write_table(self, seq: Sequence) -> None:
        """The row's block table: the lease's pages, padded with its first page (its table_row)."""
        assert seq.lease is not None
        pages = self.page_ids(seq.lease)
        n = self.roles.blocks_len
        table = np.full(n, pages[0], dtype=np.int32)
        k = min(n, len(pages))
        table[:k] = pages[:k]
        self.backend.write_input(self.roles.blocks, table)
        if self.fed:
            self._table[0] = table
            self._table_of[0] = seq.lease

    def stage(self, seq: Sequence, ids: Seq[int], start: int) -> None:
        """`ids` at positions from `start` of `seq` on the row's token, position and slot inputs."""
        assert seq.lease is not None
        stage(self.backend, self.roles, self.page_ids(seq.lease), ids, start)

    # ---- the batched step --------------------------------------------------------------------

    def seat_rows(self, seqs: list[Sequence], b: int, pos: list[int]) -> None:
        """Writes the block-table rows whose lease changed, and seeds the rows whose sequence or
        position (`pos[i]`) differs from what the device fed them (the b - len(seqs) rows after
        the sequences are padding on the engine's one-page lease, seeded every time)."""
        rows = self.roles.rows
        assert rows is not None
        leases = self._row_leases(seqs, b)
        valid = np.zeros(rows.max_rows, dtype=np.int32)
        changed: list[int] = []
        for i, lease in enumerate(leases):
            held = self.fed[i]
            if i >= len(seqs) or held is None or held[0] is not seqs[i] or held[1] is not lease or held[2] != pos[i]:
                valid[i] = 1
            if self._table_of[i] is not lease:
                self._table[i] = self._table_row(lease)
                self._table_of[i] = lease
                changed.append(i)
        if changed:
            self.backend.write_input(self.roles.blocks, self._table[: changed[-1] + 1])
            if changed[0] == 0:
                self._seated = None
        if valid.any():
            self._stage_rows(seqs, leases, valid, pos)

    def _table_row(self, lease: Lease) -> NDArray[np.int32]:
        """A lease's block-table row at the table's width (padded with its first page)."""
        pages = lease.table_row()
        n = self.roles.blocks_len
        row = np.full(n, pages[0], dtype=np.int32)
        row[: min(n, len(pages))] = pages[:n]
        return row

    def _row_leases(self, seqs: list[Sequence], b: int) -> list[Lease]:
        """Each of the b rows' lease: the sequences', then the padding lease."""
        out: list[Lease] = []
        for seq in seqs:
            assert seq.lease is not None
            out.append(seq.lease)
        if b > len(seqs):
            assert self.pad is not None
            out += [self.pad] * (b - len(seqs))
        return out

    def _stage_rows(self, seqs: list[Sequence], leases: list[Lease], valid: NDArray[np.int32],
                    at: list[int]) -> None:
        """The rows' token, position (`at[i]` for row i's sequence), slot and length inputs, then
        the row seed program (it copies the rows marked in `valid` into the row carries)."""
        rows = self.roles.rows
        assert rows is not None
        n, p = len(seqs), self.roles.page_tokens
        pos = at[:n] + [0] * (len(leases) - n)
        slots = [lease.kv_index(q) if i < n else lease.pages[0] * p
                 for i, (lease, q) in enumerate(zip(leases, pos, strict=True))]
        r = self.roles
        self.backend.write_input(r.token, np.array([s.tokens[q] for s, q in zip(seqs, pos, strict=False)]
                                                   + [0] * (len(leases) - n), dtype=np.int64))
        self.backend.write_input(r.position, np.array(pos, dtype=np.int64))
        self.backend.write_input(r.slot, np.array(slots, dtype=np.int64))
        self.backend.write_input(r.seq_len, np.array(pos, dtype=np.int32) + 1)
        self.backend.write_input(rows.valid, valid)
        self.backend.run(rows.seed_program, {})

    def write_sampling(self, sampling: list[Sampling], b: int) -> None:
        """The rows' sampling inputs at bucket `b`, unless the device holds them already."""
        rows = self.roles.rows
        assert rows is not None
        params = (tuple(sampling), b)
        if params != self.sampling:
            prm, seeds = sampling_params(sampling, rows, b - len(sampling))
            self.backend.write_input(rows.sampling, prm)
            self.backend.write_input(rows.seed, seeds)
            self.sampling = params

    def close(self) -> None:
        """The padding lease given back."""
        if self.pad is not None:
            self.pad.release()
            self.pad = None
