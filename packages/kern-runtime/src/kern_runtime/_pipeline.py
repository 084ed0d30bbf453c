"""Decode steps kept in flight: `Pipeline` (made by `Engine.pipeline`), the `Launch` of a step it
issues, the `Hooks` it calls on its engine, and `pipelined`, a pipeline's steps one after
another."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from numpy.typing import NDArray

from ._leases import Sequence
from .batch import Sampled, Sampling
from .errors import EngineError

__all__ = ["Hooks", "Launch", "Pipeline", "pipelined"]


@dataclass(frozen=True, slots=True)
class Launch:
    """A decode step to issue: its program, vars, the outputs (name, count) to read back, and
    whether it is the batched step."""

    program: str
    vars: Mapping[str, int]
    reads: tuple[tuple[str, int], ...]
    rows: bool


@dataclass(frozen=True, slots=True)
class Hooks:
    """What a `Pipeline` calls on its engine: issue step k, apply a read-back, note that every
    issued one-row step was read (the row is seated), note the pipeline closed, and the backend's
    read-back (`Fetching`, or plain reads)."""

    issue: Callable[[Launch, list[Sequence], list[int], int], None]
    apply: Callable[[list[Sequence], list[Sampling], list[NDArray[Any]], bool], list[Sampled]]
    seated: Callable[[Sequence], None]
    closed: Callable[[Pipeline], None]
    fetch: Callable[[str, int], Any]
    fetched: Callable[[Any], NDArray[Any]]


class Pipeline:
    """Decode steps of fixed rows kept in flight, made by `Engine.pipeline`.

    `issue()` queues the next step of every row; the device feeds it each row's token from the
    step before, so it may be issued before that step is read back. `read()` reads the oldest
    step still in flight and appends its tokens to the sequences (as `Engine.decode`). Each step
    in flight holds its read-back copy of its own. While any step is in flight the engine refuses
    every call that touches the rows but the prefill of another sequence (queued behind the
    steps, which may still be read; `interrupt`: no more are issued); `close()` waits for the
    steps still in flight and drops them (the sequences stay at the steps read; their rows are
    seeded again on their next step). Any other engine call on rows ends an idle pipeline.
    """

    def __init__(self, hooks: Hooks, seqs: list[Sequence], sampling: list[Sampling], launch: Launch) -> None:
        self._hooks = hooks
        self._seqs = seqs
        self._sampling = sampling
        self._launch = launch
        self._kv0 = [q.kv for q in seqs]
        self._issued = 0
        self._pending: deque[list[Any]] = deque()
        self._open = True
        self._interrupted = False

    @property
    def seqs(self) -> tuple[Sequence, ...]:
        """The rows' sequences, in row order."""
        return tuple(self._seqs)

    @property
    def pending(self) -> int:
        """Steps issued and not read back yet."""
        return len(self._pending)

    @property
    def open(self) -> bool:
        """Whether more steps may be issued (not closed, and the engine did nothing else since)."""
        return self._open

    def issue(self) -> None:
        """Queue the next step of every row.

        Raises:
            EngineError: the pipeline is closed (or the engine ran other rows since), or a row's
                lease has no room for one more token.
        """
        if not self._open:
            raise EngineError("this pipeline is closed: start another with Engine.pipeline")
        k = self._issued
        short = [q.id for q, kv in zip(self._seqs, self._kv0, strict=True) if kv + k >= q.room]
        if short:
            raise EngineError(f"sequence {short[0]} has no room for another token: finish the turn and prefill again")
        self._hooks.issue(self._launch, self._seqs, self._kv0, k)
        self._pending.append([self._hooks.fetch(name, count) for name, count in self._launch.reads])
        self._issued += 1

    def read(self) -> list[Sampled]:
        """The oldest step in flight, read back: each row's result, its token appended.

        Raises:
            EngineError: no step in flight.
        """
        if not self._pending:
            raise EngineError("no decode step of this pipeline is in flight: issue one first")
        batch = self._pending.popleft()
        out = self._hooks.apply(self._seqs, self._sampling, [self._hooks.fetched(f) for f in batch], self._launch.rows)
        if not self._launch.rows and not self._pending and not self._interrupted:
            self._hooks.seated(self._seqs[0])  # NOTE: the host has read every issued step
        return out

    def interrupt(self) -> None:
        """Other work was queued behind the steps in flight: no more steps (they may still be
        read), and the one-row step's inputs are no longer this pipeline's row."""
        self._open = False
        self._interrupted = True

    def close(self) -> None:
        """Wait for the steps still in flight and drop their results; no more steps."""
        try:
            while self._pending:
                for f in self._pending.popleft():
                    self._hooks.fetched(f)
        finally:
            self._pending.clear()
            self._open = False
            self._hooks.closed(self)


def pipelined(pipe: Pipeline, steps: int) -> Iterator[list[Sampled]]:
    """`steps` steps of `pipe`, each issued before the one before it is read back."""
    try:
        for k in range(steps):
            if k == 0:
                pipe.issue()
            if k + 1 < steps:
                pipe.issue()
            yield pipe.read()
    finally:
        pipe.close()
