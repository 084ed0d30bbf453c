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

`Engine` is the public face of private parts, one job each: `_leases.py` (the open sequences and
each turn's lease through the cache manager), `_turns.py` (a turn's chunks, head and one-row step),
`_batched.py` (decode steps of many rows and rides, and the claim of a pipeline in flight on its
rows), `_seats.py` (what the step programs' inputs on the device hold), `_pipeline.py`
(`Pipeline`) and `_backend.py` (the backend protocols).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

from kern_manifest import Manifest
from kern_pool import Capacity, Checkpoint, Parked, Prefix
from kern_pool.cache import CacheCounters, KVCache, Reuse, Source

from ._backend import Backend, Bound, Caching, Fetching
from ._batched import BatchedSteps
from ._leases import Leases, Sequence
from ._manifest import read_manifest
from ._pipeline import Pipeline, pipelined
from ._seats import Seats
from ._turns import Turns
from .batch import Sampled, Sampling
from .errors import ApiError, EngineError
from .roles import ServingRoles, serving_roles

__all__ = ["Backend", "Bound", "Caching", "Counters", "Engine", "EngineConfig", "Fetching", "Pipeline", "Prefilled", "Sequence", "Turn"]


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
        self._closer = closer
        self._seats = Seats(backend, roles)
        self._leases = Leases(self.cache, roles, self._seats, self.reach)
        self._batched = BatchedSteps(backend, roles, cfg.eager, self._seats, self._leases)
        self._turns = Turns(backend, roles, cfg, self._seats)

    @property
    def prefix(self) -> Prefix[Checkpoint, Parked]:
        """The cache manager's prefix index (its entries, for reports and tests)."""
        return self.cache.prefix

    @classmethod
    def open(cls, manifest: Manifest | str | os.PathLike[str], kernels: str | os.PathLike[str],
             weights: Seq[str | os.PathLike[str]], *, gpu: int, tokens: int, seqs: int = 1,
             host_bytes: int = 0, config: EngineConfig | None = None,
             log: Callable[[str], None] = lambda s: None, progress: Callable[[int, int], None] | None = None,
             roles: ServingRoles | None = None) -> Engine:
        """Load a runtime of `manifest` (`read_manifest`'s model, or a file's path) whose pool
        holds `tokens` KV tokens (rounded up to whole pages) for `seqs` live sequences, its weights
        (.safetensors files) and, with `host_bytes`, a host tier of that many pinned bytes (evicted
        entries are parked there); return its engine.

        Raises:
            ServingRolesError, ManifestParseError, ManifestVerifyError, InputFileError: the manifest.
            EngineError: `tokens` below 1 (the pool may hold more than one sequence reaches).
            NoDriverError and other kern_runtime errors: at load.
        """
        from .runtime import Runtime

        model = manifest if isinstance(manifest, Manifest) else read_manifest(manifest)
        roles = roles or serving_roles(model)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise EngineError(f"the pool must hold at least 1 token, got {tokens!r}")
        pages = roles.whole_pages(tokens)
        rt = Runtime.open(model, kernels, weights, gpu=gpu, capacity=Capacity(tokens=pages, seqs=seqs), log=log,
                          progress=progress)
        try:
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
        return self._leases.open(tokens)

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
        self._batched.claim()
        self._leases.release(seq)

    @property
    def sequences(self) -> list[Sequence]:
        """The open sequences, oldest first."""
        return list(self._leases.seqs.values())

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
            PromptError: an empty prompt or ids outside the model's tokens.
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
        token = self._turns.prefill(seq, first=first)
        if token is not None:
            self.counters.heads += 1
        return self._prefilled(seq, decision, n, token)

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
        self._seats.unseat(seq)
        seq.tokens = prompt
        return self._prefilled(seq, decision, len(prompt), None)

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
        return self._batched.ride(list(seqs), list(sampling), list(counts))

    def step(self, seq: Sequence) -> int:
        """One decode step of `seq` (re-seating it on the row when another sequence stepped):
        issue the step program, read the next token, append it.

        Raises:
            EngineError: a foreign or released sequence, no live lease (prefill first), or the
                lease's room is spent.
        """
        self._mine(seq)
        if seq.lease is None:
            raise EngineError(f"sequence {seq.id} has no live turn: prefill a prompt first")
        if seq.kv >= seq.room:
            raise EngineError(f"sequence {seq.id} used its room of {seq.room} tokens: finish the turn and prefill again")
        self._batched.claim()
        return self._turns.step(seq)

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
        self._batched.check_rows(seqs, sampling)
        if len(seqs) == 1 and sampling[0].plain:
            return [Sampled(self.step(seqs[0]), None, ())]
        pipe = self._batched.open(seqs, sampling)
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
        self._batched.check_rows(seqs, sampling)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise EngineError(f"decode_steps needs at least 1 step, got {steps!r}")
        short = [s.id for s in seqs if s.kv + steps > s.room]
        if short:
            raise EngineError(f"sequence {short[0]} has no room for {steps} more tokens: prefill with more room")
        if len(seqs) == 1 and sampling[0].plain and self.roles.start_program is None:
            return (self.decode([seqs[0]], sampling) for _ in range(steps))
        return pipelined(self._batched.open(seqs, sampling), steps)

    def pipeline(self, seqs: Seq[Sequence], sampling: Seq[Sampling]) -> Pipeline | None:
        """Decode steps of `seqs` (as `decode`) kept in flight: nothing is issued yet (see
        `Pipeline`). None when these rows cannot be fed on the device (one greedy row of a manifest
        whose one-row step has no start program): decode them step by step.

        Raises:
            EngineError: as `decode`.
        """
        seqs, sampling = list(seqs), list(sampling)
        self._batched.check_rows(seqs, sampling)
        if len(seqs) == 1 and sampling[0].plain and self.roles.start_program is None:
            return None
        return self._batched.open(seqs, sampling)

    def finish(self, seq: Sequence) -> None:
        """End `seq`'s turn: its lease is retired (no copy) into the index under the tokens it
        holds KV for; the last generated token stays pending in `seq.tokens`.

        Raises:
            EngineError: a foreign or released sequence.
        """
        self._mine(seq)
        self._batched.claim()
        self._leases.retire(seq)

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
        self._leases.live()
        return self.cache.evict()

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release every live lease and index entry, wait for the copies still in flight (a
        staged wake holds its parked copy until they land), and close the runtime the engine
        loaded: the pages, slots and host units the engine took are all back."""
        if self._leases.closed:
            return
        self._batched.close()
        self._leases.close()
        self._seats.close()
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

    def _mine(self, seq: Sequence) -> None:
        self._leases.mine(seq)

    def _reuse(self, seq: Sequence, prompt: list[int], room: int) -> Reuse:
        """A new turn of `seq` over `prompt` with `room` steps, shared by `prefill` and `begin`:
        the claim, the reuse decision over the longest cached proper prefix and, unless the live
        lease continues, a lease for it (seq.lease, kv and room set). Nothing changes when a check
        fails but what eviction parked or dropped."""
        self._batched.claim(seq, dry=True)
        need = self._leases.need(prompt, room)
        self._batched.claim(seq)
        return self._leases.reuse(seq, prompt, need)

    def _prefilled(self, seq: Sequence, decision: Reuse, n: int, first: int | None) -> Prefilled:
        """A new turn over a prompt of `n` tokens counted, its woken prefix (if any) kept
        resident."""
        if decision.source is Source.PARKED:
            self._leases.keep_woken(seq, decision.length)
        done = Prefilled(decision.length, n - decision.length, decision.source, first)
        self.counters.reused += done.reused
        self.counters.prefilled += done.prefilled
        return done
