"""Decode steps of many rows (`BatchedSteps`): the checks of a step's rows and of a ride, each step
seated and issued (the one-row step for one plain row, else the batched step at its graph bucket),
the pipeline of steps in flight and its claim on the rows, and each read-back applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from numpy.typing import NDArray

from ._backend import Fetching, launch
from ._leases import Leases, Sequence
from ._pipeline import Hooks, Launch, Pipeline
from ._seats import Seats
from .batch import Sampled, Sampling, bucket
from .errors import EngineError
from .roles import ServingRoles

if TYPE_CHECKING:
    from ._backend import Backend

__all__ = ["BatchedSteps"]


def _sampled(token: int, s: Sampling, i: int, lp: NDArray[Any] | None, top: NDArray[Any] | None) -> Sampled:
    """Row i's result: its token, and its logprobs as `s` asks."""
    pairs = tuple((int(top[i, j]), float(lp[i, 1 + j])) for j in range(s.logprobs)) \
        if top is not None and lp is not None and s.logprobs > 0 else ()
    return Sampled(token, float(lp[i, 0]) if lp is not None and s.logprobs >= 0 else None, pairs)


class BatchedSteps:
    """The engine's decode steps of given rows, and the one pipeline whose steps may be in
    flight."""

    def __init__(self, backend: Backend, roles: ServingRoles, eager: bool, seats: Seats, leases: Leases) -> None:
        self.backend = backend
        self.roles = roles
        self.seats = seats
        self.leases = leases
        self._eager = eager
        self._pipe: Pipeline | None = None
        self._hooks: Hooks | None = None

    # ---- checks ------------------------------------------------------------------------------

    def check_rows(self, seqs: list[Sequence], sampling: list[Sampling]) -> None:
        """Raises the engine's error when `seqs` cannot take one decode step with `sampling`."""
        if not seqs or len(seqs) != len(sampling):
            raise EngineError(f"decode needs one Sampling per sequence and at least one: got {len(seqs)} "
                              f"sequence(s) and {len(sampling)} Sampling(s)")
        if not all(isinstance(s, Sampling) for s in sampling):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise EngineError("decode takes one kern_runtime.Sampling per sequence")
        if len({s.id for s in seqs}) != len(seqs):
            raise EngineError("decode got a sequence twice: each row is one sequence")
        for seq in seqs:
            self.leases.mine(seq)
            if seq.lease is None:
                raise EngineError(f"sequence {seq.id} has no live turn: prefill a prompt first")
            if seq.kv >= seq.room:
                raise EngineError(f"sequence {seq.id} used its room of {seq.room} tokens: finish the turn and "
                                  "prefill again")
        rows = self.roles.rows
        if len(seqs) == 1 and sampling[0].plain:
            return
        if rows is None:
            raise EngineError("this manifest has no batched decode step (kern-qwen3 --rows R): only one greedy "
                              "sequence per step, without logprobs")
        if len(seqs) > rows.max_rows:
            raise EngineError(f"{len(seqs)} sequences exceed the batched step's {rows.max_rows} rows")
        over = [s.logprobs for s in sampling if s.logprobs > rows.top_n]
        if over:
            raise EngineError(f"logprobs {over[0]} exceeds this manifest's top-N bound of {rows.top_n}")

    def _check_ride(self, seqs: list[Sequence], sampling: list[Sampling], counts: list[int]) -> None:
        if len(counts) != len(seqs):
            raise EngineError(f"ride needs one row count per sequence: got {len(seqs)} sequence(s) and {len(counts)} "
                              "count(s)")
        self.check_rows(seqs, sampling)
        rows = self.roles.rows
        if rows is None:
            raise EngineError("this manifest has no batched decode step (kern-qwen3 --rows R): prefill the prompt")
        for seq, n in zip(seqs, counts, strict=True):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
                raise EngineError(f"sequence {seq.id} rides {n!r} rows: at least 1")
            if seq.kv + n > min(len(seq.tokens), seq.room):
                raise EngineError(f"sequence {seq.id} rides {n} rows from position {seq.kv}, past its "
                                  f"{len(seq.tokens)} tokens or its room of {seq.room}")
        if sum(counts) > rows.max_rows:
            raise EngineError(f"{sum(counts)} rows exceed the batched step's {rows.max_rows} rows")

    # ---- the pipeline ------------------------------------------------------------------------

    def claim(self, prefill: Sequence | None = None, *, dry: bool = False) -> None:
        """The rows are the caller's now: refused while a pipeline's steps are in flight (but for
        the prefill of a sequence that is not one of its rows: the pipeline then only reads back
        what it issued), and an idle pipeline ends (its rows' inputs may be rewritten). `dry`
        only checks."""
        pipe = self._pipe
        if pipe is None:
            return
        if pipe.pending and (prefill is None or prefill in pipe.seqs):
            raise EngineError(f"{pipe.pending} decode step(s) of a pipeline are in flight: read them or close it first")
        if dry:
            return
        if pipe.pending:
            pipe.interrupt()
        else:
            pipe.close()

    def open(self, seqs: list[Sequence], sampling: list[Sampling]) -> Pipeline:
        """A pipeline over checked rows, seated now (the engine's previous one ends)."""
        self.claim()
        launch = self._prepare(seqs, sampling)
        if self._hooks is None:
            fetch, fetched = self._fetchers()
            self._hooks = Hooks(self._issue_step, self._apply, self.seats.hold, self._pipe_closed, fetch, fetched)
        pipe = Pipeline(self._hooks, seqs, sampling, launch)
        self._pipe = pipe
        return pipe

    def close(self) -> None:
        """The pipeline (if any) closed: its steps in flight waited for and dropped."""
        if self._pipe is not None:
            self._pipe.close()

    def _pipe_closed(self, pipe: Pipeline) -> None:
        if self._pipe is pipe:
            self._pipe = None

    def _fetchers(self) -> tuple[Callable[[str, int], Any], Callable[[Any], NDArray[Any]]]:
        be = self.backend
        if isinstance(be, Fetching):
            return be.fetch_output, be.fetched
        return be.read_output, lambda got: got

    # ---- a step ------------------------------------------------------------------------------

    def _prepare(self, seqs: list[Sequence], sampling: list[Sampling], pos: list[int] | None = None) -> Launch:
        """Seats the step's rows (the one-row step for one plain sequence at its pending token,
        else the batched step, row i at position `pos[i]`, default its sequence's kv) and returns
        what to issue and read back."""
        r = self.roles
        if pos is None and len(seqs) == 1 and sampling[0].plain:
            self.seats.ensure(seqs[0])
            return Launch(r.step_program, r.step_vars, ((r.next_token, 1),), rows=False)
        rows = r.rows
        assert rows is not None
        n = len(seqs)
        b = bucket(n, rows.max_rows)
        if b > n and self.seats.pad is None:
            self.seats.pad = self.leases.room(lambda: self.backend.lease(1))
        self.seats.seat_rows(seqs, b, [s.kv for s in seqs] if pos is None else pos)
        self.seats.write_sampling(sampling, b)
        want = max(s.logprobs for s in sampling)
        reads = ((r.next_token, n), *(((rows.logprobs, n * (1 + rows.top_n)),) if want >= 0 else ()),
                 *(((rows.top_tokens, n * rows.top_n),) if want > 0 else ()))
        return Launch(rows.program, {rows.var: b}, reads, rows=True)

    def _issue_step(self, launch: Launch, seqs: list[Sequence], kv0: list[int], k: int) -> None:
        """Issues step k of a pipeline: the rows' KV positions recorded, the row state as the
        device will have fed it."""
        fed = self.seats.fed
        for i, seq in enumerate(seqs):
            assert seq.lease is not None
            seq.lease.kv_index(kv0[i] + k)
            if launch.rows:
                fed[i] = (seq, seq.lease, kv0[i] + k + 1)
        if not launch.rows:
            self.seats.vacate()
        self._launch(launch)
        if launch.rows:
            for i in range(len(seqs), len(fed)):
                fed[i] = None

    def _apply(self, seqs: list[Sequence], sampling: list[Sampling], got: list[NDArray[Any]],
               rows: bool) -> list[Sampled]:
        """One step's read-back applied: each sequence's token appended, its results."""
        n = len(seqs)
        tokens = got[0]
        lp = got[1].reshape(n, -1) if len(got) > 1 else None
        top = got[2].reshape(n, -1) if len(got) > 2 else None
        out: list[Sampled] = []
        for i, (seq, s) in enumerate(zip(seqs, sampling, strict=True)):
            token = int(tokens[i])
            out.append(_sampled(token, s, i, lp, top))
            seq.kv += 1
            seq.tokens.append(token)
            if rows:
                self.seats.unseat(seq)
        return out

    def _launch(self, step: Launch) -> None:
        launch(self.backend, step.program, step.vars, self._eager)

    # ---- a ride ------------------------------------------------------------------------------

    def ride(self, seqs: list[Sequence], sampling: list[Sampling], counts: list[int]) -> list[Sampled | None]:
        """One batched step in which `seqs[i]` takes `counts[i]` rows (`Engine.ride`), checked
        first."""
        self._check_ride(seqs, sampling, counts)
        self.claim()
        rows, pos, picks = self._ride_rows(seqs, sampling, counts)
        launch = self._prepare(rows, picks, pos)
        self._issue_rows(launch, rows, pos)
        got = [self.backend.read_output(name, count) for name, count in launch.reads]
        return self._apply_ride(seqs, sampling, counts, got)

    @staticmethod
    def _ride_rows(seqs: list[Sequence], sampling: list[Sampling],
                   counts: list[int]) -> tuple[list[Sequence], list[int], list[Sampling]]:
        """Each row's sequence, position and sampling: a sequence's rows in order, its sampling on
        the row of its last token (the rows that sample nothing are greedy)."""
        rows: list[Sequence] = []
        pos: list[int] = []
        picks: list[Sampling] = []
        plain = Sampling()
        for seq, s, n in zip(seqs, sampling, counts, strict=True):
            for q in range(seq.kv, seq.kv + n):
                rows.append(seq)
                pos.append(q)
                picks.append(s if q == len(seq.tokens) - 1 else plain)
        return rows, pos, picks

    def _issue_rows(self, launch: Launch, rows: list[Sequence], pos: list[int]) -> None:
        """Issues a ride's step: every row's KV position recorded; a row the device feeds its next
        token correctly (the row of a sequence's last token) is noted as fed, the others not."""
        fed = self.seats.fed
        for i, (seq, q) in enumerate(zip(rows, pos, strict=True)):
            assert seq.lease is not None
            seq.lease.kv_index(q)
            fed[i] = (seq, seq.lease, q + 1) if q == len(seq.tokens) - 1 else None
        for i in range(len(rows), len(fed)):
            fed[i] = None
        self._launch(launch)

    def _apply_ride(self, seqs: list[Sequence], sampling: list[Sampling], counts: list[int],
                    got: list[NDArray[Any]]) -> list[Sampled | None]:
        """A ride's read-back applied: each sequence's kv advanced, the token of each that reached
        its last token appended."""
        n = sum(counts)
        lp = got[1].reshape(n, -1) if len(got) > 1 else None
        top = got[2].reshape(n, -1) if len(got) > 2 else None
        out: list[Sampled | None] = []
        last = -1
        for seq, s, c in zip(seqs, sampling, counts, strict=True):
            last += c
            seq.kv += c
            self.seats.unseat(seq)
            if seq.kv < len(seq.tokens):
                out.append(None)
                continue
            res = _sampled(int(got[0][last]), s, last, lp, top)
            out.append(res)
            seq.tokens.append(res.token)
        return out
