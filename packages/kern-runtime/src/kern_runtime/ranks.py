"""A tensor-parallel group held by this process, run as one engine over its ranks.

The ranks' runtimes are loaded and joined (`kern_runtime.loading.load_ranks`), or any backend per
rank (the interpreter's, on the CPU). `Ranks` makes one `Engine` per rank and runs each operation
on every engine at once, one thread per rank, so each rank's collectives meet the others' on the
GPUs. The engines see the same prompts over pools of the same size, so they make the same memory
decisions (leases, prefix reuse, eviction); every rank's argmax reads the same gathered logits, so
their tokens are equal. A rank that differs is a broken manifest: `RanksDisagreeError`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from collections.abc import Sequence as Seq
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

from .engine import Backend, Bound, Engine, EngineConfig, Sequence, Turn
from .errors import ApiError, EngineError, RanksDisagreeError
from .roles import ServingRoles

__all__ = ["RankedSequence", "Ranks", "TurnRunner"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RankedSequence:
    """One conversation of the group: its sequence on each rank's engine, rank order."""

    seqs: tuple[Sequence, ...]

    @property
    def tokens(self) -> list[int]:
        """The conversation's tokens so far (every rank holds the same)."""
        return self.seqs[0].tokens


class TurnRunner(Protocol):
    """What runs a conversation's turns: an `Engine`, or `Ranks` (the engine over a group)."""

    def sequence(self, tokens: Seq[int] = ()) -> Any: ...

    def turn(self, seq: Any, prompt: Seq[int], steps: int, *, stop: Collection[int] = (),
             room: int | None = None, on_token: Callable[[int], None] | None = None) -> Turn: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


class Ranks:
    """One `Engine` per rank of a tensor-parallel group, every call run on all of them at once.

    Make with `Ranks(backends, roles, config)` over the ranks' loaded and joined runtimes (rank
    order); `closer` runs last at `close()` (closing the runtimes, when the caller hands them over).
    """

    def __init__(self, backends: Seq[Backend], roles: ServingRoles, config: EngineConfig | None = None,
                 *, closer: Callable[[], None] | None = None) -> None:
        """Bind every rank's backend.

        Raises:
            ApiError: no backend, or one `Engine` refuses (see `Engine`).
        """
        if not backends:
            raise ApiError("a tensor-parallel group needs at least one rank")
        self.roles = roles
        self.engines = [Engine(b, roles, config) for b in backends]
        self._threads: ThreadPoolExecutor | None = ThreadPoolExecutor(len(backends), thread_name_prefix="kern-rank")
        self._closer = closer

    @property
    def size(self) -> int:
        """The ranks in the group."""
        return len(self.engines)

    def sequence(self, tokens: Seq[int] = ()) -> RankedSequence:
        """A new conversation on every rank (its tokens so far, no KV yet)."""
        return RankedSequence(tuple(e.sequence(tokens) for e in self.engines))

    def release(self, seq: RankedSequence) -> None:
        """Forget `seq` on every rank (its live leases go back).

        Raises:
            EngineError: a sequence of another group, or released.
        """
        self._mine(seq)
        self._each(lambda r, e: e.release(seq.seqs[r]))  # NOTE: on each rank's thread, its context current

    def turn(self, seq: RankedSequence, prompt: Seq[int], steps: int, *, stop: Collection[int] = (),
             room: int | None = None, on_token: Callable[[int], None] | None = None) -> Turn:
        """`Engine.turn` on every rank at once; `on_token` sees rank 0's tokens as they are read.
        The turn is rank 0's (every rank's tokens and prefill, checked equal) with the slowest
        rank's times.

        Raises:
            as `Engine.turn` (the lowest failing rank's error; a bad prompt or size fails on every
            rank before any program runs).
            RanksDisagreeError: a rank generated other tokens, or prefilled otherwise, than rank 0.
        """
        self._mine(seq)
        prompt = list(prompt)
        turns = self._each(lambda r, e: e.turn(seq.seqs[r], prompt, steps, stop=stop, room=room,
                                               on_token=on_token if r == 0 else None))
        self._agree(turns)
        return Turn(turns[0].tokens, turns[0].prefill, max(t.ttft_ms for t in turns),
                    max(t.decode_ms_per_token for t in turns))

    def close(self) -> None:
        """Close every rank's engine (each on its rank's thread), then run `closer`."""
        threads, self._threads = self._threads, None
        if threads is None:
            return
        try:
            self._run(threads, lambda _r, e: e.close())
        finally:
            threads.shutdown()
            if self._closer is not None:
                self._closer()

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _mine(self, seq: RankedSequence) -> None:
        if len(seq.seqs) != len(self.engines):
            raise EngineError(f"a sequence of {len(seq.seqs)} ranks is not this group's ({len(self.engines)} ranks)")

    def _each(self, fn: Callable[[int, Engine], T]) -> list[T]:
        if self._threads is None:
            raise EngineError("the group is closed")
        return self._run(self._threads, fn)

    def _run(self, threads: ThreadPoolExecutor, fn: Callable[[int, Engine], T]) -> list[T]:
        def one(r: int) -> T:
            engine = self.engines[r]
            if isinstance(engine.backend, Bound):
                engine.backend.make_current()
            return fn(r, engine)

        futures = [threads.submit(one, r) for r in range(len(self.engines))]
        wait(futures)
        for f in futures:  # NOTE: the lowest rank's error: a bad input fails every rank alike
            if (exc := f.exception()) is not None:
                raise exc
        return [f.result() for f in futures]

    @staticmethod
    def _agree(turns: Seq[Turn]) -> None:
        first = turns[0]
        tokens = [r for r, t in enumerate(turns) if t.tokens != first.tokens]
        if tokens:
            raise RanksDisagreeError(f"ranks {tokens} generated other tokens than rank 0: the tensor-parallel "
                                     "manifest or its collectives are wrong")
        prefills = [r for r, t in enumerate(turns) if t.prefill != first.prefill]
        if prefills:
            raise RanksDisagreeError(f"ranks {prefills} prefilled otherwise than rank 0 "
                                     f"({turns[prefills[0]].prefill} against {first.prefill}): their pools differ")
