"""The engine: many sequences on one runtime, their KV memory from the pool, prefixes reused.

An `Engine` owns a backend (a `Runtime`, or anything with its sequence and program calls: the
`Backend` protocol) and a `kern_pool.KVCache` over it (the prefix index of resident checkpoints
and parked copies, the reuse decision, eviction and parking to the host tier when the backend has
one). A `Sequence` is one conversation's row: its tokens and,
while a turn runs, a lease whose pages make the block table.

A turn: `prefill(seq, prompt, room)` reuses the prompt's longest cached proper prefix (the index:
a resident checkpoint is restored at the hit's length, a parked copy is woken first; or a live
sequence sharing the prefix is forked; or the sequence's own live lease continues in place), so
only the rest goes through the chunk program (with `first=True` and a manifest with a head
program, the last prompt token too, and the head computes the first token); then `step(seq)`
decodes, and `finish(seq)` retires the lease into the index. When the pool is busy, the coldest index entries are parked to the host
tier (dropped when it is full, or when there is none) until the lease fits. The decisions are
the cache manager's (`kern_pool.KVCache`: decide, acquire, keep_woken, retire, room); the engine
keeps the sequences and runs the programs.

The one-row decode step seats one sequence at a time (its block table, its staged token, the
device carries) and re-seats when another sequence steps. `decode(seqs, sampling)` runs one step
of many sequences as the manifest's batched step (`ServingRoles.rows`): sequence i on row i of
the smallest graph bucket that holds them, rows past them padding on a one-page lease of the
engine's; a row is seeded from the host only when its sequence or position differs from what the
device fed it, a block-table row is written only when its lease changed, and the rows' sampling
inputs only when a row's `Sampling` or the bucket changed. `pipeline(seqs, sampling)` keeps steps of
fixed rows in flight: `Pipeline.issue` queues the next step before the last one is read back (the
device feeds each row its token), `Pipeline.read` reads the oldest; while steps are in flight the
engine refuses every call that would touch their rows (step, decode, finish, release, a prefill of
one of them), and a prefill of another sequence queues behind them (the pipeline issues no more).

Riding: `begin(seq, prompt, room)` makes the prompt a sequence's tokens with the lease `prefill`
would give it (its cached prefix reused the same way) and computes nothing; `ride(seqs, sampling,
counts)` then runs one batched step in which sequence i takes counts[i] rows, its tokens from
`seq.kv` on at their own positions, slots and lengths and its block-table row, seeded from the host
(the `valid` mask). The step writes the KV of every row before any row's attention reads it, so a
prompt's rows attend to each other as a chunk would; the row of a sequence's last token samples its
next token (a decode row is one such row), the other rows' samples are dropped. The weights are
read once for the decode rows and the prompt tokens together.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

import kern_pool
from kern_pool import Capacity, Checkpoint, Hit, Lease, Parked, Prefix
from kern_pool.cache import (
    CacheCounters,
    CacheFull,
    KVCache,
    Reuse,
    Source,
    lease_tokens,
)

from .batch import Sampled, Sampling, bucket, sampling_params
from .errors import ApiError, EngineError
from .roles import ServingRoles, prefill_chunks, read_manifest, serving_roles
from .session import check_prompt, stage

__all__ = ["Backend", "Bound", "Caching", "Counters", "Engine", "EngineConfig", "Fetching", "Pipeline", "Prefilled", "Sequence", "Turn"]

T = TypeVar("T")


class Backend(Protocol):
    """What the engine calls: `Runtime`'s sequence memory and program calls (a CPU interpreter
    implements the same for tests)."""

    @property
    def pool(self) -> kern_pool.Pool: ...

    def lease(self, tokens: int) -> Lease: ...

    def retire(self, lease: Lease, length: int) -> Checkpoint: ...

    def checkpoint(self, lease: Lease, length: int) -> Checkpoint: ...

    def restore(self, checkpoint: Checkpoint, length: int, tokens: int) -> Lease: ...

    def fork(self, parent: Lease, length: int, tokens: int) -> Lease: ...

    def park(self, checkpoint: Checkpoint) -> Parked: ...

    def wake_now(self, parked: Parked, length: int, tokens: int) -> Lease: ...

    def settle(self) -> None: ...

    def write_input(self, name: str, array: ArrayLike) -> None: ...

    def run(self, program: str, vars: Mapping[str, int]) -> None: ...

    def issue(self, program: str, vars: Mapping[str, int]) -> None: ...

    def read_output(self, name: str, count: int | None = None) -> NDArray[Any]: ...

    def synchronize(self) -> None: ...


@runtime_checkable
class Bound(Protocol):
    """A backend on a CUDA context (`Runtime`): a thread that drives it makes the context current
    first (`make_current`)."""

    def make_current(self) -> None: ...


@runtime_checkable
class Fetching(Protocol):
    """A backend that can read an output back without waiting for later work (`Runtime`'s
    `fetch_output` / `fetched`); the engine's pipelined steps use it when the backend has it."""

    def fetch_output(self, name: str, count: int | None = None) -> Any: ...

    def fetched(self, fetch: Any) -> NDArray[Any]: ...


@runtime_checkable
class Caching(Protocol):
    """A backend that replays programs it declares no graph for from graphs it captures on demand
    (`Runtime.cache_graphs`); the engine's short prefill chunks use it when the backend has it."""

    def cache_graphs(self, program: str, limit: int) -> None: ...


@dataclass(frozen=True, slots=True)
class _Launch:
    """A decode step to issue: its program, vars, the outputs (name, count) to read back, and
    whether it is the batched step."""

    program: str
    vars: Mapping[str, int]
    reads: tuple[tuple[str, int], ...]
    rows: bool


@dataclass(frozen=True, slots=True)
class _Hooks:
    """What a `Pipeline` calls on its engine: issue step k, apply a read-back, note that every
    issued one-row step was read (the row is seated), note the pipeline closed, and the backend's
    read-back (`Fetching`, or plain reads)."""

    issue: Callable[[_Launch, list[Sequence], list[int], int], None]
    apply: Callable[[list[Sequence], list[Sampling], list[NDArray[Any]], bool], list[Sampled]]
    seated: Callable[[Sequence], None]
    closed: Callable[[Pipeline], None]
    fetch: Callable[[str, int], Any]
    fetched: Callable[[Any], NDArray[Any]]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the engine runs turns.

    Attributes:
        chunk: prefill chunk rows (clamped to the chunk program's rows var max).
        eager: decode call by call instead of replaying the step graph (chunks run eagerly too).
        park: park evicted entries to the backend's host tier (needs one); else drop them.
        chunk_graphs: graphs of the chunk program kept by length on a backend that caches graphs
            (`Caching`: `Runtime.cache_graphs`), each captured on its length's second use, the
            least recently used destroyed past this many; 0: every chunk runs eagerly.
        chunk_graph_rows: only chunks of at most this many rows replay from those graphs (a short
            chunk's host enqueue outlasts its GPU time; a long one's does not, and every new
            length would cost a capture).
    """

    chunk: int = 2048
    eager: bool = False
    park: bool = False
    chunk_graphs: int = 32
    chunk_graph_rows: int = 512


@dataclass(slots=True)
class Counters(CacheCounters):
    """What the engine did since it was made (for reports and tests); parks, wakes, evictions and
    dropped entries are counted by its cache manager."""

    turns: int = 0
    reused: int = 0
    prefilled: int = 0
    heads: int = 0
    """Prefills whose first generated token came from the head program."""


@dataclass(frozen=True, slots=True)
class Prefilled:
    """A prompt's prefill: `reused` tokens came from `source`, `prefilled` were computed (the last
    prompt token included: the chunks and the head compute it, or else the first decode step)."""

    reused: int
    prefilled: int
    source: Source
    first: int | None = None
    """The first generated token, when the head program computed it (already appended to the
    sequence's tokens, as a step's); None: the first `step` computes it."""


@dataclass(frozen=True, slots=True)
class Turn:
    """A finished turn: the generated tokens, its prefill, and its times."""

    tokens: list[int]
    prefill: Prefilled
    ttft_ms: float
    """Prefill up to the first token read back (its head, or else the first step)."""
    decode_ms_per_token: float
    """Mean time of the steps after the first (0 with one step)."""


@dataclass(eq=False, slots=True)
class Sequence:
    """One conversation's row. Made by `Engine.sequence` / `Engine.branch`.

    Attributes:
        id: the engine's number for it.
        tokens: the conversation so far: the tokens with KV, then (after a step) the pending one.
        kv: tokens whose KV the live lease holds (0 without one).
        lease: the live lease while a turn runs, else None.
    """

    id: int
    tokens: list[int] = field(default_factory=list[int])
    kv: int = 0
    lease: Lease | None = None
    room: int = 0
    """Positions the live lease may write (its tokens), 0 without one."""


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

    def __init__(self, hooks: _Hooks, seqs: list[Sequence], sampling: list[Sampling], launch: _Launch) -> None:
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


def _sampled(token: int, s: Sampling, i: int, lp: NDArray[Any] | None, top: NDArray[Any] | None) -> Sampled:
    """Row i's result: its token, and its logprobs as `s` asks."""
    pairs = tuple((int(top[i, j]), float(lp[i, 1 + j])) for j in range(s.logprobs)) \
        if top is not None and lp is not None and s.logprobs > 0 else ()
    return Sampled(token, float(lp[i, 0]) if lp is not None and s.logprobs >= 0 else None, pairs)


def _steps(pipe: Pipeline, steps: int) -> Iterator[list[Sampled]]:
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


class Engine:
    """Many sequences on one backend, their prefixes kept in a `kern_pool.Prefix` index.

    Make with `Engine(backend, roles, config)` over a loaded runtime, or `Engine.open(...)` to load
    one. Close with `close()` (or use as a context manager): every lease and index entry is
    released, and an engine that loaded its runtime closes it.
    """

    def __init__(self, backend: Backend, roles: ServingRoles, config: EngineConfig | None = None,
                 *, closer: Callable[[], None] | None = None) -> None:
        """Bind a backend whose pool's page size is the block table's stride.

        Raises:
            ApiError: the pool's page size differs from the manifest's block-table stride, or a
                chunk below 1.
        """
        cfg = config or EngineConfig()
        pool = backend.pool
        if pool.unit != roles.page_tokens:
            raise ApiError(f"the pool's pages hold {pool.unit} tokens; the block table's stride is {roles.page_tokens}")
        if cfg.chunk < 1:
            raise ApiError(f"the prefill chunk must be at least 1 row, got {cfg.chunk}")
        for name in ("chunk_graphs", "chunk_graph_rows"):
            value = getattr(cfg, name)
            if type(value) is not int or value < 0:
                raise ApiError(f"EngineConfig.{name} must be an int >= 0, got {value!r}")
        self.backend = backend
        self.roles = roles
        self.config = cfg
        self.counters = Counters()
        self.cache = KVCache(backend, park=cfg.park, counters=self.counters)
        self.reach = min(roles.reach(pool.pages_max * pool.unit), pool.row_pages * pool.unit,
                         pool.pages_max * pool.unit)
        self._chunk = min(cfg.chunk, roles.chunk_max)
        self._seqs: dict[int, Sequence] = {}
        self._next = 0
        self._seated: tuple[Sequence, Lease] | None = None
        self._pages: tuple[Lease, NDArray[np.int64]] | None = None
        """The last lease staged or seated, and its pages as an array."""
        self._closer = closer
        self._closed = False
        rows = roles.rows.max_rows if roles.rows is not None else 0
        self._rows: list[tuple[Sequence, Lease, int] | None] = [None] * rows
        # NOTE: the host's copy of the rows' block table; -1 (no page) until a row is written, so
        # the first step writes every row it uses whatever the device buffer held before
        self._table = np.full((rows, roles.blocks_len), -1, dtype=np.int32)
        self._table_of: list[Lease | None] = [None] * rows
        """The lease whose pages each device block-table row holds."""
        self._pad: Lease | None = None
        self._params: tuple[tuple[Sampling, ...], int] | None = None
        """The rows' sampling and the bucket the device's sampling inputs hold."""
        self._pipe: Pipeline | None = None
        self._hooks: _Hooks | None = None
        self._graph_rows = 0
        """Chunks of at most this many rows are issued (replayed from the backend's graph cache)."""
        if not cfg.eager and cfg.chunk_graphs and cfg.chunk_graph_rows and isinstance(backend, Caching):
            backend.cache_graphs(roles.chunk_program, cfg.chunk_graphs)
            self._graph_rows = cfg.chunk_graph_rows

    @property
    def prefix(self) -> Prefix[Checkpoint, Parked]:
        """The cache manager's prefix index (its entries, for reports and tests)."""
        return self.cache.prefix

    @classmethod
    def open(cls, manifest: str | os.PathLike[str], kernels: str | os.PathLike[str],
             weights: Seq[str | os.PathLike[str]], *, gpu: int, tokens: int, seqs: int = 1,
             host_bytes: int = 0, config: EngineConfig | None = None,
             log: Callable[[str], None] = lambda s: None, progress: Callable[[int, int], None] | None = None,
             roles: ServingRoles | None = None) -> Engine:
        """Load a runtime whose pool holds `tokens` KV tokens (rounded up to whole pages) for
        `seqs` live sequences, its weights (.safetensors files) and, with `host_bytes`, a host
        tier of that many pinned bytes (evicted entries are parked there); return its engine.

        Raises:
            ServingRolesError, ManifestParseError, InputFileError: the manifest file.
            EngineError: `tokens` below 1 (the pool may hold more than one sequence reaches).
            NoDriverError and other kern_runtime errors: at load.
        """
        from .runtime import Runtime
        from .weights import Safetensors

        roles = roles or serving_roles(read_manifest(Path(manifest)))
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise EngineError(f"the pool must hold at least 1 token, got {tokens!r}")
        pages = -(-tokens // roles.page_tokens) * roles.page_tokens
        rt = Runtime.load(manifest, kernels, gpu=gpu, capacity=Capacity(tokens=pages, seqs=seqs))
        try:
            log(rt.summary())
            rt.load_weights(Safetensors.open([str(p) for p in weights]), threads=8, progress=progress)
            if host_bytes:
                rt.enable_host_tier(host_bytes)
            base = config or EngineConfig()
            return cls(rt, roles, replace(base, park=base.park or host_bytes > 0), closer=rt.close)
        except BaseException:
            rt.close()
            raise

    # ---- sequences ---------------------------------------------------------------------------

    def sequence(self, tokens: Seq[int] = ()) -> Sequence:
        """A new conversation (its tokens so far, no KV yet)."""
        self._live()
        seq = Sequence(self._next, list(tokens))
        self._next += 1
        self._seqs[seq.id] = seq
        return seq

    def branch(self, seq: Sequence, length: int) -> Sequence:
        """A new conversation continuing from `seq`'s first `length` tokens (any earlier turn);
        its next prefill reuses them (forked from `seq` while it is live, else from the index).

        Raises:
            EngineError: a sequence of another engine or released, or length not in
                [1, len(seq.tokens)].
        """
        self._mine(seq)
        if not 1 <= length <= len(seq.tokens):
            raise EngineError(f"branch length {length} is not in [1, {len(seq.tokens)}]")
        return self.sequence(seq.tokens[:length])

    def release(self, seq: Sequence) -> None:
        """Forget `seq`: its live lease goes back (nothing is kept in the index).

        Raises:
            EngineError: a sequence of another engine or released.
        """
        self._mine(seq)
        self._claim()
        self._drop_lease(seq)
        del self._seqs[seq.id]

    @property
    def sequences(self) -> list[Sequence]:
        """The open sequences, oldest first."""
        return list(self._seqs.values())

    # ---- a turn ------------------------------------------------------------------------------

    def prefill(self, seq: Sequence, prompt: Seq[int], room: int, *, first: bool = False) -> Prefilled:
        """Make `prompt` (the whole conversation so far) `seq`'s tokens: reuse its longest cached
        proper prefix, prefill the rest but the last token through the chunk program, and stage
        that last token for the first decode step. The lease holds the prompt and `room` steps.
        With `first`, a manifest with a head program and at least two tokens to prefill, the chunks
        take the last token too and the head computes the first generated token: it is read back
        and appended as a step's would be (`Prefilled.first`; the lease then has room for `room`
        - 1 more steps). While a pipeline's steps are in flight, a sequence that is not one of its
        rows may be prefilled (the prefill queues behind them); the pipeline then issues no more
        steps.

        Raises:
            SessionError: an empty prompt or ids outside the model's tokens.
            EngineError: a foreign or released sequence, a row of a pipeline with steps in flight,
                room below 1, more tokens than the model, the pool or a block-table row hold, or
                no room while live sequences hold the pool. Nothing changed then but what
                eviction parked or dropped.
        """
        self._mine(seq)
        prompt = list(prompt)
        decision = self._reuse(seq, prompt, room)
        seq.tokens = prompt
        n = len(prompt)
        self._write_table(seq)
        token = None
        if first and self.roles.head_program is not None and n - seq.kv >= 2:
            token = self._prefill_head(seq)
        else:
            self._prefill_rest(seq)
            self._seat(seq)
        if decision.source is Source.PARKED:
            self._keep_woken(seq, decision.length)
        done = Prefilled(decision.length, n - decision.length, decision.source, token)
        self.counters.reused += done.reused
        self.counters.prefilled += done.prefilled
        return done

    def begin(self, seq: Sequence, prompt: Seq[int], room: int) -> Prefilled:
        """Make `prompt` (the whole conversation so far) `seq`'s tokens with a lease for it and
        `room` steps, reusing its longest cached proper prefix as `prefill` does, and compute
        nothing: `seq.kv` is the reused length, and the rest (the last token included) is for
        `ride` to run as rows of batched steps.

        Raises:
            as `prefill`; EngineError: also a manifest without a batched step.
        """
        self._mine(seq)
        if self.roles.rows is None:
            raise EngineError("this manifest has no batched decode step (kern-qwen3 --rows R): prefill the prompt")
        prompt = list(prompt)
        decision = self._reuse(seq, prompt, room)
        if decision.source is Source.CONTINUE:
            seq.kv = decision.length
        self._unseat(seq)
        seq.tokens = prompt
        if decision.source is Source.PARKED:
            self._keep_woken(seq, decision.length)
        done = Prefilled(decision.length, len(prompt) - decision.length, decision.source)
        self.counters.reused += done.reused
        self.counters.prefilled += done.prefilled
        return done

    def ride(self, seqs: Seq[Sequence], sampling: Seq[Sampling], counts: Seq[int]) -> list[Sampled | None]:
        """One step of the batched program in which `seqs[i]` takes `counts[i]` rows: its tokens
        `seq.tokens[seq.kv : seq.kv + counts[i]]` at their positions (their KV written in this
        step); its kv advances by `counts[i]`. A sequence whose rows reach its last token samples
        its next token from that row (`sampling[i]`), appended, and gets its `Sampled`; the others
        get None (their rows' samples are dropped). `decode` is the case of one row each.

        Raises:
            EngineError: no sequences, a length mismatch, a foreign, released, repeated or
                unprefilled sequence, a count below 1 or past the sequence's tokens or its room,
                more rows than the batched step holds, logprobs above its top-N bound, no batched
                step, or steps of a pipeline in flight. Nothing changed then.
        """
        seqs, sampling, counts = list(seqs), list(sampling), list(counts)
        self._check_ride(seqs, sampling, counts)
        self._claim()
        rows, pos, picks = self._ride_rows(seqs, sampling, counts)
        launch = self._prepare(rows, picks, pos)
        self._issue_rows(launch, rows, pos)
        got = [self.backend.read_output(name, count) for name, count in launch.reads]
        return self._apply_ride(seqs, sampling, counts, got)

    def step(self, seq: Sequence) -> int:
        """One decode step of `seq` (re-seating it on the row when another sequence stepped):
        issue the step program, read the next token, append it.

        Raises:
            EngineError: a foreign or released sequence, no live lease (prefill first), or the
                lease's room is spent.
        """
        self._mine(seq)
        lease = seq.lease
        if lease is None:
            raise EngineError(f"sequence {seq.id} has no live turn: prefill a prompt first")
        if seq.kv >= seq.room:
            raise EngineError(f"sequence {seq.id} used its room of {seq.room} tokens: finish the turn and prefill again")
        self._claim()
        if self._seated is None or self._seated[0] is not seq or self._seated[1] is not lease:
            self._write_table(seq)
            self._seat(seq)
        lease.kv_index(seq.kv)
        r = self.roles
        if self.config.eager:
            self.backend.run(r.step_program, r.step_vars)
        else:
            self.backend.issue(r.step_program, r.step_vars)
        token = int(self.backend.read_output(r.next_token, 1)[0])
        seq.kv += 1
        seq.tokens.append(token)
        if r.start_program is None:
            if seq.kv < seq.room:
                self._stage(seq, [token], seq.kv)
            else:
                self._seated = None
        return token

    def decode(self, seqs: Seq[Sequence], sampling: Seq[Sampling]) -> list[Sampled]:
        """One decode step of every sequence in `seqs` (prefilled, distinct), `sampling[i]` for
        `seqs[i]`: the one-row step when there is one sequence, greedy, without logprobs; else one
        step of the batched program at the smallest graph bucket >= len(seqs). Appends each token.

        Raises:
            EngineError: no sequences, a length mismatch, a foreign, released, unprefilled or
                repeated sequence, a spent room, more rows than the batched step holds, logprobs
                above its top-N bound, no batched step in the manifest, or steps of a pipeline in
                flight. Nothing changed then.
        """
        seqs, sampling = list(seqs), list(sampling)
        self._check_rows(seqs, sampling)
        if len(seqs) == 1 and sampling[0].plain:
            return [Sampled(self.step(seqs[0]), None, ())]
        pipe = self._open(seqs, sampling)
        pipe.issue()
        out = pipe.read()
        pipe.close()
        return out

    def decode_steps(self, seqs: Seq[Sequence], sampling: Seq[Sampling], steps: int) -> Iterator[list[Sampled]]:
        """`steps` decode steps of `seqs` (as `decode`), pipelined: step k + 1 is issued before step
        k's tokens are read back (the device feeds each row its next inputs), so the host's work
        per step hides behind the GPU's. Yields each step's results; stopping early (closing the
        iterator) leaves the sequences at the steps yielded.

        Raises:
            EngineError: as `decode` (checked before anything runs), steps below 1, or a sequence
                without room for `steps` more tokens.
        """
        seqs, sampling = list(seqs), list(sampling)
        self._check_rows(seqs, sampling)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise EngineError(f"decode_steps needs at least 1 step, got {steps!r}")
        short = [s.id for s in seqs if s.kv + steps > s.room]
        if short:
            raise EngineError(f"sequence {short[0]} has no room for {steps} more tokens: prefill with more room")
        if len(seqs) == 1 and sampling[0].plain and self.roles.start_program is None:
            return (self.decode([seqs[0]], sampling) for _ in range(steps))
        return _steps(self._open(seqs, sampling), steps)

    def pipeline(self, seqs: Seq[Sequence], sampling: Seq[Sampling]) -> Pipeline | None:
        """Decode steps of `seqs` (as `decode`) kept in flight: nothing is issued yet (see
        `Pipeline`). None when these rows cannot be fed on the device (one greedy row of a manifest
        whose one-row step has no start program): decode them step by step.

        Raises:
            EngineError: as `decode`.
        """
        seqs, sampling = list(seqs), list(sampling)
        self._check_rows(seqs, sampling)
        if len(seqs) == 1 and sampling[0].plain and self.roles.start_program is None:
            return None
        return self._open(seqs, sampling)

    def finish(self, seq: Sequence) -> None:
        """End `seq`'s turn: its lease is retired (no copy) into the index under the tokens it
        holds KV for; the last generated token stays pending in `seq.tokens`.

        Raises:
            EngineError: a foreign or released sequence.
        """
        self._mine(seq)
        self._claim()
        self._retire(seq)

    def turn(self, seq: Sequence, prompt: Seq[int], steps: int, *, stop: Collection[int] = (),
             room: int | None = None, on_token: Callable[[int], None] | None = None) -> Turn:
        """prefill (the head's first token when the manifest has one), then decode steps up to
        `steps` tokens in all (ending after a token in `stop`), then finish.

        `room` (default `steps`) sizes the lease; `on_token` sees each token as it is read.

        Raises:
            as `prefill` and `step`; steps below 1 is an EngineError.
        """
        if steps < 1:
            raise EngineError(f"a turn needs at least 1 step, got {steps}")
        self.backend.synchronize()  # NOTE: the time to the first token starts with an idle stream
        t0 = time.perf_counter()
        pre = self.prefill(seq, prompt, max(steps, room or steps), first=True)
        out: list[int] = []
        t1 = t0
        if pre.first is not None:
            t1 = time.perf_counter()
            out.append(pre.first)
            if on_token is not None:
                on_token(pre.first)
        while len(out) < steps and not (out and out[-1] in stop):
            out.append(self.step(seq))
            if len(out) == 1:
                t1 = time.perf_counter()
            if on_token is not None:
                on_token(out[-1])
        t2 = time.perf_counter()
        self.finish(seq)
        self.counters.turns += 1
        per = (t2 - t1) / (len(out) - 1) * 1e3 if len(out) > 1 else 0.0
        return Turn(out, pre, (t1 - t0) * 1e3, per)

    def evict(self) -> bool:
        """Make room now: park the coldest resident index entry (drop it without a host tier or
        when the host is full); False when nothing is resident."""
        self._live()
        return self.cache.evict()

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release every live lease and index entry, wait for the copies still in flight (a
        staged wake holds its parked copy until they land), and close the runtime the engine
        loaded: the pages, slots and host units the engine took are all back."""
        if self._closed:
            return
        if self._pipe is not None:
            self._pipe.close()
        self._closed = True
        for seq in list(self._seqs.values()):
            self._drop_lease(seq)
        self._seqs.clear()
        if self._pad is not None:
            self._pad.release()
            self._pad = None
        self.cache.clear()
        try:
            self.backend.synchronize()
        finally:
            if self._closer is not None:
                self._closer()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- decisions ---------------------------------------------------------------------------

    def _live(self) -> None:
        if self._closed:
            raise EngineError("this engine is closed")

    def _mine(self, seq: Sequence) -> None:
        self._live()
        if self._seqs.get(seq.id) is not seq:
            raise EngineError(f"sequence {seq.id} is not open in this engine (released, or another engine's)")

    def _reuse(self, seq: Sequence, prompt: list[int], room: int) -> Reuse:
        """A new turn of `seq` over `prompt` with `room` steps, shared by `prefill` and `begin`:
        the claim, the reuse decision over the longest cached proper prefix and, unless the live
        lease continues, a lease for it (seq.lease, kv and room set). Nothing changes when a check
        fails but what eviction parked or dropped."""
        self._claim(seq, dry=True)
        need = self._need(prompt, room)
        self._claim(seq)
        decision, hit = self._decide(seq, prompt, self._own(seq, need))
        if decision.source is not Source.CONTINUE and seq.lease is not None:
            # NOTE: the live lease goes into the index first (its KV stays reusable); the index
            # changed, so the decision is made again
            self._retire(seq)
            decision, hit = self._decide(seq, prompt, None)
        if decision.source is not Source.CONTINUE:
            lease = self._acquire(decision, hit, need)
            seq.lease, seq.kv, seq.room = lease, decision.length, need
            self._seated = None
        return decision

    def _need(self, prompt: list[int], room: int) -> int:
        check_prompt(self.roles, len(prompt), prompt)
        if isinstance(room, bool) or not isinstance(room, int) or room < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise EngineError(f"room must be at least 1 decode step, got {room!r}")
        need = lease_tokens(len(prompt), room)
        if need > self.reach:
            raise EngineError(f"the prompt ({len(prompt)} tokens) and {room} steps need {need} positions; one "
                              f"sequence holds at most {self.reach} here")
        return need

    def _own(self, seq: Sequence, need: int) -> tuple[int, list[int]] | None:
        """(seq id, its tokens with KV) when `seq`'s live lease has room for `need` tokens (the
        cache manager decides whether the prompt continues it)."""
        if seq.lease is None or need > seq.room:
            return None
        return seq.id, seq.tokens[: seq.kv]

    def _decide(self, seq: Sequence, prompt: list[int],
                own: tuple[int, list[int]] | None) -> tuple[Reuse, Hit[Checkpoint, Parked] | None]:
        live = [(o.id, o.tokens[: o.kv]) for o in self._seqs.values() if o.lease is not None and o is not seq]
        return self.cache.decide(prompt, live, own)

    # ---- memory ------------------------------------------------------------------------------

    def _acquire(self, d: Reuse, hit: Hit[Checkpoint, Parked] | None, need: int) -> Lease:
        parent = self._seqs[d.live].lease if d.source is Source.FORK and d.live is not None else None
        return self._granted(lambda: self.cache.acquire(d, hit, need, parent))

    def _keep_woken(self, seq: Sequence, length: int) -> None:
        """The woken prefix kept in the index as resident again, beside its parked copy, once the
        chunk that waited for the staged copies was queued (`KVCache.keep_woken`)."""
        assert seq.lease is not None
        self.cache.keep_woken(seq.lease, seq.tokens[:length])

    def _room(self, ask: Callable[[], T]) -> T:
        """`ask` through the cache manager's room (remaps settled, the coldest entries evicted)."""
        return self._granted(lambda: self.cache.room(ask))

    def _granted(self, call: Callable[[], T]) -> T:
        """`call` (one that makes room through the cache manager), its refusals as the engine's
        one line."""
        try:
            return call()
        except CacheFull as full:
            raise EngineError(f"no memory for this sequence ({full}) and nothing left to evict: "
                              f"{sum(s.lease is not None for s in self._seqs.values())} live "
                              "sequence(s) hold the pool; finish or release some") from None
        except kern_pool.ExceedsPool as exc:
            raise EngineError(f"the sequence can never fit this pool: {exc}") from None

    def _retire(self, seq: Sequence) -> None:
        lease = seq.lease
        if lease is None:
            return
        seq.lease, seq.room = None, 0
        self._unseat(seq)
        self.cache.retire(lease, seq.tokens[: seq.kv])
        seq.kv = 0

    def _unseat(self, seq: Sequence) -> None:
        """The row no longer holds `seq`'s inputs (the next step of any sequence re-seats)."""
        if self._seated is not None and self._seated[0] is seq:
            self._seated = None

    def _drop_lease(self, seq: Sequence) -> None:
        if seq.lease is not None:
            seq.lease.release()
            seq.lease, seq.kv, seq.room = None, 0, 0
        self._unseat(seq)

    # ---- the rows ----------------------------------------------------------------------------

    def _check_rows(self, seqs: list[Sequence], sampling: list[Sampling]) -> None:
        if not seqs or len(seqs) != len(sampling):
            raise EngineError(f"decode needs one Sampling per sequence and at least one: got {len(seqs)} "
                              f"sequence(s) and {len(sampling)} Sampling(s)")
        if not all(isinstance(s, Sampling) for s in sampling):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise EngineError("decode takes one kern_runtime.Sampling per sequence")
        if len({s.id for s in seqs}) != len(seqs):
            raise EngineError("decode got a sequence twice: each row is one sequence")
        for seq in seqs:
            self._mine(seq)
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

    def _table_row(self, lease: Lease) -> NDArray[np.int32]:
        """A lease's block-table row at the table's width (padded with its first page)."""
        pages = lease.table_row()
        n = self.roles.blocks_len
        row = np.full(n, pages[0], dtype=np.int32)
        row[: min(n, len(pages))] = pages[:n]
        return row

    def _seat_rows(self, seqs: list[Sequence], b: int, pos: list[int]) -> None:
        """Writes the block-table rows whose lease changed, and seeds the rows whose sequence or
        position (`pos[i]`) differs from what the device fed them (the b - len(seqs) rows after
        the sequences are padding on the engine's one-page lease, seeded every time)."""
        rows = self.roles.rows
        assert rows is not None
        leases = self._row_leases(seqs, b)
        valid = np.zeros(rows.max_rows, dtype=np.int32)
        changed: list[int] = []
        for i, lease in enumerate(leases):
            held = self._rows[i]
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

    def _row_leases(self, seqs: list[Sequence], b: int) -> list[Lease]:
        """Each of the b rows' lease: the sequences', then the padding lease."""
        out: list[Lease] = []
        for seq in seqs:
            assert seq.lease is not None
            out.append(seq.lease)
        if b > len(seqs):
            assert self._pad is not None
            out += [self._pad] * (b - len(seqs))
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

    def _prepare(self, seqs: list[Sequence], sampling: list[Sampling], pos: list[int] | None = None) -> _Launch:
        """Seats the step's rows (the one-row step for one plain sequence at its pending token,
        else the batched step, row i at position `pos[i]`, default its sequence's kv) and returns
        what to issue and read back."""
        r = self.roles
        if pos is None and len(seqs) == 1 and sampling[0].plain:
            seq = seqs[0]
            if self._seated is None or self._seated[0] is not seq or self._seated[1] is not seq.lease:
                self._write_table(seq)
                self._seat(seq)
            return _Launch(r.step_program, r.step_vars, ((r.next_token, 1),), rows=False)
        rows = r.rows
        assert rows is not None
        n = len(seqs)
        b = bucket(n, rows.max_rows)
        if b > n and self._pad is None:
            self._pad = self._room(lambda: self.backend.lease(1))
        self._seat_rows(seqs, b, [s.kv for s in seqs] if pos is None else pos)
        params = (tuple(sampling), b)
        if params != self._params:
            prm, seeds = sampling_params(sampling, rows, b - n)
            self.backend.write_input(rows.sampling, prm)
            self.backend.write_input(rows.seed, seeds)
            self._params = params
        want = max(s.logprobs for s in sampling)
        reads = ((r.next_token, n), *(((rows.logprobs, n * (1 + rows.top_n)),) if want >= 0 else ()),
                 *(((rows.top_tokens, n * rows.top_n),) if want > 0 else ()))
        return _Launch(rows.program, {rows.var: b}, reads, rows=True)

    def _open(self, seqs: list[Sequence], sampling: list[Sampling]) -> Pipeline:
        """A pipeline over checked rows, seated now (the engine's previous one ends)."""
        self._claim()
        launch = self._prepare(seqs, sampling)
        if self._hooks is None:
            fetch, fetched = self._fetchers()
            self._hooks = _Hooks(self._issue_step, self._apply, self._seat_read, self._pipe_closed, fetch, fetched)
        pipe = Pipeline(self._hooks, seqs, sampling, launch)
        self._pipe = pipe
        return pipe

    def _seat_read(self, seq: Sequence) -> None:
        assert seq.lease is not None
        self._seated = (seq, seq.lease)

    def _pipe_closed(self, pipe: Pipeline) -> None:
        if self._pipe is pipe:
            self._pipe = None

    def _claim(self, prefill: Sequence | None = None, *, dry: bool = False) -> None:
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

    def _issue_step(self, launch: _Launch, seqs: list[Sequence], kv0: list[int], k: int) -> None:
        """Issues step k of a pipeline: the rows' KV positions recorded, the row state as the
        device will have fed it."""
        for i, seq in enumerate(seqs):
            assert seq.lease is not None
            seq.lease.kv_index(kv0[i] + k)
            if launch.rows:
                self._rows[i] = (seq, seq.lease, kv0[i] + k + 1)
        if not launch.rows:
            self._seated = None
        if self.config.eager:
            self.backend.run(launch.program, launch.vars)
        else:
            self.backend.issue(launch.program, launch.vars)
        if launch.rows:
            for i in range(len(seqs), len(self._rows)):
                self._rows[i] = None

    def _check_ride(self, seqs: list[Sequence], sampling: list[Sampling], counts: list[int]) -> None:
        if len(counts) != len(seqs):
            raise EngineError(f"ride needs one row count per sequence: got {len(seqs)} sequence(s) and {len(counts)} "
                              "count(s)")
        self._check_rows(seqs, sampling)
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

    def _issue_rows(self, launch: _Launch, rows: list[Sequence], pos: list[int]) -> None:
        """Issues a ride's step: every row's KV position recorded; a row the device feeds its next
        token correctly (the row of a sequence's last token) is noted as fed, the others not."""
        for i, (seq, q) in enumerate(zip(rows, pos, strict=True)):
            assert seq.lease is not None
            seq.lease.kv_index(q)
            self._rows[i] = (seq, seq.lease, q + 1) if q == len(seq.tokens) - 1 else None
        for i in range(len(rows), len(self._rows)):
            self._rows[i] = None
        if self.config.eager:
            self.backend.run(launch.program, launch.vars)
        else:
            self.backend.issue(launch.program, launch.vars)

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
            if self._seated is not None and self._seated[0] is seq:
                self._seated = None
            if seq.kv < len(seq.tokens):
                out.append(None)
                continue
            res = _sampled(int(got[0][last]), s, last, lp, top)
            out.append(res)
            seq.tokens.append(res.token)
        return out

    def _fetchers(self) -> tuple[Callable[[str, int], Any], Callable[[Any], NDArray[Any]]]:
        be = self.backend
        if isinstance(be, Fetching):
            return be.fetch_output, be.fetched
        return be.read_output, lambda got: got

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
            if rows and self._seated is not None and self._seated[0] is seq:
                self._seated = None
        return out

    # ---- the row -----------------------------------------------------------------------------

    def _page_ids(self, lease: Lease) -> NDArray[np.int64]:
        """The lease's pages in token order, as an array made once per lease (a live lease's pages
        never change; sealing only moves them into its chain)."""
        held = self._pages
        if held is None or held[0] is not lease:
            held = self._pages = (lease, np.asarray(lease.pages, dtype=np.int64))
        return held[1]

    def _write_table(self, seq: Sequence) -> None:
        """The row's block table: the lease's pages, padded with its first page (its table_row)."""
        assert seq.lease is not None
        pages = self._page_ids(seq.lease)
        n = self.roles.blocks_len
        table = np.full(n, pages[0], dtype=np.int32)
        k = min(n, len(pages))
        table[:k] = pages[:k]
        self.backend.write_input(self.roles.blocks, table)
        if self._rows:
            self._table[0] = table
            self._table_of[0] = seq.lease

    def _stage(self, seq: Sequence, ids: Seq[int], start: int) -> None:
        assert seq.lease is not None
        stage(self.backend, self.roles, self._page_ids(seq.lease), ids, start)

    def _chunks(self, seq: Sequence, *, last: bool) -> int:
        """The prompt's tokens from `seq.kv` up to (not including) the last (`last`: through it) in
        chunks; the rows of the last chunk (0 for none)."""
        assert seq.lease is not None
        n, start = len(seq.tokens), seq.kv
        rows = 0
        for a, b in prefill_chunks(n - start, self._chunk, last=last):
            lo, hi = start + a, start + b
            seq.lease.kv_indices(lo, hi)
            self._stage(seq, seq.tokens[lo:hi], lo)
            if hi - lo <= self._graph_rows:
                self.backend.issue(self.roles.chunk_program, {self.roles.chunk_var: hi - lo})
            else:
                self.backend.run(self.roles.chunk_program, {self.roles.chunk_var: hi - lo})
            rows = hi - lo
        return rows

    def _prefill_rest(self, seq: Sequence) -> None:
        """The prompt's tokens from `seq.kv` up to (not including) the last, in chunks."""
        self._chunks(seq, last=False)
        seq.kv = len(seq.tokens) - 1

    def _prefill_head(self, seq: Sequence) -> int:
        """The prompt's tokens from `seq.kv` through the last in chunks, then the head program over
        the last chunk's last row: the first generated token, read back and appended; the row then
        holds the sequence as after a step."""
        lease, r = seq.lease, self.roles
        assert lease is not None and r.head_program is not None and r.head_row is not None
        n = len(seq.tokens)
        rows = self._chunks(seq, last=True)
        self._stage(seq, [seq.tokens[n - 1]], n - 1)
        self.backend.write_input(r.head_row, np.array([rows - 1], dtype=np.int64))
        if self.config.eager:
            self.backend.run(r.head_program, r.step_vars)
        else:
            self.backend.issue(r.head_program, r.step_vars)
        token = int(self.backend.read_output(r.next_token, 1)[0])
        seq.kv = n
        seq.tokens.append(token)
        self._seated = (seq, lease)
        if r.start_program is None:
            if seq.kv < seq.room:
                self._stage(seq, [token], seq.kv)
            else:
                self._seated = None
        self.counters.heads += 1
        return token

    def _seat(self, seq: Sequence) -> None:
        """Put `seq`'s pending token on the row (its block table is written)."""
        assert seq.lease is not None
        self._stage(seq, [seq.tokens[seq.kv]], seq.kv)
        if self.roles.start_program is not None:
            self.backend.run(self.roles.start_program, {})
        self._seated = (seq, seq.lease)
