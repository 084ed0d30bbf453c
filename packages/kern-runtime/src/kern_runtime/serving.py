"""Serving: many requests on one `Engine`, batched by `kern_pool.Scheduler`, in one engine thread.

`Serving(engine, decoder, config)` owns the engine from `start()` to `close()`: callers (a server's
event loop, tests) `submit` a `Request` from any thread and get the scheduler's answer at once
(queued, or refused: queue full, never fits); the request's `sink` then receives its `Token`s and
one `Done` on the engine thread (a server hands them to its loop; a sink that raises cancels its
request). `cancel` ends a request at the next step (a client that went away). Each step the
engine thread takes the scheduler's `Plan` and executes it: retired and parked requests `finish`
(their KV goes to the prefix index; the engine parks it to the host tier when the pool needs the
pages), a grown lease is a `prefill` of the tokens so far with more room (the index's entry is
restored, nothing is computed), the prefill chunks run one sequence after another, each a
`prefill` of the prompt's first tokens up to its budget, and what the step's budget has left, past
its cached prefix (an admitted request gets its `Sequence` when its chunk's turn comes; the next
chunk runs only after a finished prefill and while the budget lasts, so a burst of requests with
short remainders is admitted in one step, each reusing the system prompt the one before it
prefilled), and the decode rows go to the decoder in one call (with a pipeline, issued before the
chunks run).

The decoder is the seam to the engine's step: `decode(seqs, sampling) -> [Sampled]`, one step of
every given sequence. `Batched` runs them in one `Engine.decode` (the manifest's batched step, each
row with its own `Sampling`); `RowByRow`, for a manifest with only the one-row step, runs each row
as one `Engine.step` (greedy). `decoder_for` picks between them.

Steps in flight: a decoder that also makes pipelines (`Pipelining`: `Batched`, while the rows fit
one step) has its decode step issued, not read, when a plan is executed (before the plan's prefill
chunks run, so their host work overlaps the step). While that step is in flight the engine
thread asks the scheduler what may run `ahead` of it: the same rows' next step (no admission,
chunk, growth, park or retirement due, no row at max_tokens) is issued at once, and only then is
the earlier step read back, committed and its tokens sent; so the host's work of a step
(planning, commit, stop strings, sinks, gauges) runs while the GPU computes the next one.
Admissions due beside the same rows' next step run behind the step in flight instead (their
chunks are prefilled there, in turn, and commit after the step); the rows' next step is planned
once both landed. Anything else waits: the step in flight is read back and the next plan
made from its outcome, as without pipelining. A row that ends on a step (a stop id, a stop
string, a cancellation) while the step after it is in flight is `stale` there: that step's token
is dropped (never sent, counted or committed). The engine has appended it to the sequence, and
the stop token's KV was written by that step, so the sequence retires into the prefix index with
the tokens its KV holds (the stop token included). Tokens are those of the loop without
pipelining: a row's token depends only on its own inputs, and a seeded draw on its seed and
position.

Riding (`ServingConfig.ride`, off by default; with a `Riding` decoder: `Batched`): the prompts are not
prefilled apart but ride on the batched step as rows of it (`kern_pool.SchedConfig.ride`, the
step's most rows). A plan with rides executes as one `Engine.ride` call of its decode rows (one
row each) and its riders' rows: an admission gets its `Sequence` and `Engine.begin` (its cached
prefix restored or forked, nothing computed) when its turn comes, then takes its prompt tokens past
its KV while the step's rows last; the row of its last prompt token samples its first token, so
its TTFT ends on that step. An admission whose uncached rest is longer than `ride_max` tokens is
prefilled through the chunk program instead (one pass over the weights for all of it) and only its
last token rides. A plan with rides is never issued ahead of the step in flight (its rows differ
from that step's): the step in flight lands first, then the riders' step runs and lands, and the
pipeline starts again on the next step of unchanged rows.

`Serving`'s parts, each a private module: `_flights.py` (the steps in flight and their pipeline),
`_meter.py` (`Stats`, the histograms and the gauges) and `_stops.py` (the requests' stop strings).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import kern_pool
from kern_pool import Finish, Plan, Refusal, SchedConfig, Scheduler

from ._flights import Flight, Flights
from ._meter import BUCKETS, RATE_WINDOW_S, Histogram, Meter, Stats
from ._stops import StopTexts
from .batch import Sampled, Sampling
from .engine import Bound, Engine, EngineConfig, Pipeline, Sequence
from .errors import ApiError, EngineError

__all__ = [
    "BUCKETS",
    "RATE_WINDOW_S",
    "Batched",
    "Decoder",
    "Done",
    "EngineFactory",
    "EngineSpec",
    "Event",
    "Histogram",
    "Pipelining",
    "Request",
    "Riding",
    "RowByRow",
    "Serving",
    "ServingConfig",
    "Stats",
    "Token",
    "decoder_for",
    "open_engine",
]


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What a server asks an engine factory for (`kern serve --backend MODULE:FACTORY`).

    Attributes:
        manifest: the manifest file (a factory reads it with `read_manifest`: the server's model, not
            parsed again).
        kernels: the directory of its cubins.
        weights: .safetensors files, or checkpoint directories (empty: the factory's default).
        gpu: the device ordinal.
        tokens: KV tokens of the pool.
        seqs: live sequences the pool is sized for.
        host_bytes: bytes of the host tier (0: none; evicted prefixes are dropped).
        chunk: prefill chunk rows.
        chunk_graphs: chunk-program graphs kept by length (`EngineConfig.chunk_graphs`; 0: none).
    """

    manifest: Path
    kernels: Path
    weights: tuple[Path, ...]
    gpu: int
    tokens: int
    seqs: int
    host_bytes: int
    chunk: int
    chunk_graphs: int = 32


EngineFactory = Callable[[EngineSpec], Engine]


def open_engine(spec: EngineSpec) -> Engine:
    """The GPU engine of `spec` (`Engine.open`): the default `kern serve` backend.

    Raises:
        as `Engine.open`.
    """
    from .inputs import weight_files

    files = [str(p) for p in weight_files(spec.weights)]
    return Engine.open(spec.manifest, spec.kernels, files, gpu=spec.gpu, tokens=spec.tokens, seqs=spec.seqs,
                       host_bytes=spec.host_bytes,
                       config=EngineConfig(chunk=spec.chunk, chunk_graphs=spec.chunk_graphs))


class Decoder(Protocol):
    """One decode step of many prefilled sequences."""

    @property
    def sampling(self) -> bool:
        """Whether rows may sample (temperature > 0, logprobs); else greedy only."""
        ...

    @property
    def top_n(self) -> int:
        """The most top alternatives a row's logprobs may ask for (-1: no logprobs)."""
        ...

    def decode(self, seqs: Seq[Sequence], sampling: Seq[Sampling]) -> list[Sampled]: ...


@runtime_checkable
class Pipelining(Decoder, Protocol):
    """A decoder whose steps of fixed rows can be kept in flight."""

    def pipeline(self, seqs: Seq[Sequence], sampling: Seq[Sampling]) -> Pipeline | None:
        """The engine's pipeline over these rows (nothing issued yet), None when they cannot
        pipeline (then `decode` runs them)."""
        ...


@runtime_checkable
class Riding(Decoder, Protocol):
    """A decoder whose steps can carry prompt tokens as rows (`Engine.ride`)."""

    @property
    def ride_rows(self) -> int:
        """The most rows of one step (decode rows and riding tokens together)."""
        ...

    def ride(self, seqs: Seq[Sequence], sampling: Seq[Sampling], counts: Seq[int]) -> list[Sampled | None]:
        """One step in which `seqs[i]` takes `counts[i]` rows (`Engine.ride`, in groups of at
        most `ride_rows` rows)."""
        ...


class RowByRow:
    """The `Decoder` of a one-row step program: each sequence is one `Engine.step` (greedy)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def sampling(self) -> bool:
        return False

    @property
    def top_n(self) -> int:
        return -1

    def decode(self, seqs: Seq[Sequence], sampling: Seq[Sampling]) -> list[Sampled]:
        return [Sampled(self.engine.step(s), None, ()) for s in seqs]


class Batched:
    """The `Decoder` of a manifest with a batched step: every row in one `Engine.decode` (in groups
    of the step's most rows when more run), each with its own sampling."""

    def __init__(self, engine: Engine) -> None:
        """Decode on `engine`.

        Raises:
            EngineError: the manifest has no batched step.
        """
        rows = engine.roles.rows
        if rows is None:
            raise EngineError("this manifest has no batched decode step (kern-qwen3 --rows): decode row by row")
        self.engine = engine
        self.rows = rows

    @property
    def sampling(self) -> bool:
        return True

    @property
    def top_n(self) -> int:
        return self.rows.top_n

    def decode(self, seqs: Seq[Sequence], sampling: Seq[Sampling]) -> list[Sampled]:
        step = self.rows.max_rows
        out: list[Sampled] = []
        for i in range(0, len(seqs), step):
            out += self.engine.decode(seqs[i : i + step], sampling[i : i + step])
        return out

    def pipeline(self, seqs: Seq[Sequence], sampling: Seq[Sampling]) -> Pipeline | None:
        """`Engine.pipeline` of the rows, None when more run than one step holds."""
        return self.engine.pipeline(seqs, sampling) if len(seqs) <= self.rows.max_rows else None

    @property
    def ride_rows(self) -> int:
        return self.rows.max_rows

    def ride(self, seqs: Seq[Sequence], sampling: Seq[Sampling], counts: Seq[int]) -> list[Sampled | None]:
        """`Engine.ride` of the rows, in groups of at most the step's rows (a sequence's rows in
        one group)."""
        out: list[Sampled | None] = []
        start, used = 0, 0
        for i, n in enumerate(counts):
            if used + n > self.rows.max_rows and i > start:
                out += self.engine.ride(seqs[start:i], sampling[start:i], counts[start:i])
                start, used = i, 0
            used += n
        if start < len(counts):
            out += self.engine.ride(seqs[start:], sampling[start:], counts[start:])
        return out


def decoder_for(engine: Engine) -> Decoder:
    """`Batched` when the engine's manifest has a batched step, else `RowByRow`."""
    return Batched(engine) if engine.roles.rows is not None else RowByRow(engine)


@dataclass(frozen=True, slots=True)
class Token:
    """A generated token of a request."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Done:
    """A request's end: why, and its counts (`cached`: prompt tokens its prefill reused)."""

    finish: Finish | None
    prompt: int
    generated: int
    cached: int = 0
    error: str | None = None
    """The engine failed this request (finish None): one line saying what."""


Event = Token | Done

@dataclass(eq=False)
class Request:
    """One completion: the prompt's token ids, the most tokens to generate, how to pick them,
    the ids and strings that end it, and where its events go (called on the engine thread).

    `id` is set by `Serving.submit`."""

    prompt: list[int]
    max_tokens: int
    sink: Callable[[Event], None]
    sampling: Sampling = field(default_factory=Sampling)
    stop_ids: frozenset[int] = frozenset()
    stop_text: tuple[str, ...] = ()
    id: int = -1
    generated: list[int] = field(default_factory=list[int])
    cached: int = 0
    submitted: float = 0.0
    first: float | None = None
    last: float | None = None


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """The scheduler's limits, how long the idle engine thread sleeps between looks, whether a
    step of unchanged rows is issued before the one in flight is read back (with a `Pipelining`
    decoder; off: every step is read back before the next is planned), and whether prompts ride on
    the batched step (with a `Riding` decoder; off: each prompt prefills through the chunk
    program). Riding, the scheduler's `ride` rows are the step's most rows (`sched.ride`, when
    set, caps them), and an admission whose uncached rest passes `ride_max` tokens is prefilled
    through the chunk program, its last token riding. With `head` (and a manifest with a head
    program), a plain request (greedy, no logprobs) whose chunk finishes its prompt takes its first
    token from the head program right then and is sent it at once, instead of waiting for the
    step after the plan's prefills; each such admission reads its token back before the next chunk
    is enqueued."""

    sched: SchedConfig = field(default_factory=SchedConfig)
    idle_s: float = 0.05
    pipeline: bool = True
    ride: bool = False
    ride_max: int = 512
    head: bool = False


class Serving:
    """The engine thread: `start()`, `submit` / `cancel` from any thread, `close()`."""

    def __init__(self, engine: Engine, decoder: Decoder | None = None, config: ServingConfig | None = None,
                 *, text: Callable[[Seq[int]], str] | None = None) -> None:
        """Schedule requests on `engine` (its pool sizes the scheduler) through `decoder`
        (default `decoder_for(engine)`); `text` detokenizes for stop strings.

        Raises:
            kern_pool.ApiError: a scheduler limit or `ride_max` out of range.
        """
        cfg = config or ServingConfig()
        if isinstance(cfg.ride_max, bool) or not isinstance(cfg.ride_max, int) or cfg.ride_max < 0:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise kern_pool.ApiError(f"ServingConfig.ride_max must be an integer of at least 0, got {cfg.ride_max!r}")
        self.engine = engine
        self.decoder: Decoder = decoder or decoder_for(engine)
        self.config = cfg
        pool = engine.backend.pool
        self._riding: Riding | None = self.decoder \
            if self.config.ride and isinstance(self.decoder, Riding) else None
        most = self._riding.ride_rows if self._riding is not None else 0
        sched = dataclasses.replace(self.config.sched, ride=min(self.config.sched.ride or most, most))
        # NOTE: one page stays spare: a grown lease is restored from its checkpoint, whose
        # partial page is copied while the checkpoint still holds the old one.
        self.sched = Scheduler(sched, pages=max(1, pool.pages_max - 1), unit=pool.unit, row_tokens=engine.reach)
        self._lock = threading.Lock()
        self._meter = Meter(self._lock)
        self._texts = StopTexts(text)
        self._wake = threading.Event()
        self._reqs: dict[int, Request] = {}
        self._seqs: dict[int, Sequence] = {}
        self._next = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._leases: dict[int, int] = {}
        self._flights = Flights()
        self._piping: Pipelining | None = self.decoder \
            if self.config.pipeline and isinstance(self.decoder, Pipelining) else None
        self._head = self.config.head and engine.roles.head_program is not None
        self._into: Flight | None = None
        """The flight whose chunks run now (the head tokens they bring go to it)."""
        self._measure()

    @property
    def stats(self) -> Stats:
        """The counters and histograms, live (`report` copies them)."""
        return self._meter.stats

    # ---- callers -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="kern-engine", daemon=True)
            self._thread.start()

    def submit(self, req: Request) -> kern_pool.Queued | kern_pool.Refused:
        """Queue `req` (its id is set) or refuse it; a queued request's events go to its sink.

        Raises:
            ApiError: the server is closed, an empty prompt, max_tokens below 1, or sampling the
                decoder cannot do (logprobs past its top-N bound).
        """
        if not req.prompt or req.max_tokens < 1:
            raise ApiError("a request needs at least one prompt token and max_tokens of at least 1")
        if not self.decoder.sampling and (req.sampling.temperature > 0 or req.sampling.logprobs >= 0):
            raise ApiError("this engine decodes greedily: temperature must be 0 and logprobs off")
        if req.sampling.logprobs > self.decoder.top_n:
            raise ApiError(f"logprobs {req.sampling.logprobs} exceeds this engine's top-N bound of {self.decoder.top_n}")
        with self._lock:
            if self._closed:
                raise ApiError("the server is shutting down")
            req.id, self._next = self._next, self._next + 1
            ask = kern_pool.Ask(req.id, len(req.prompt), req.max_tokens, req.stop_ids)
            answer = self.sched.submit(ask)
            if isinstance(answer, kern_pool.Refused):
                self.stats.refused += answer.why is Refusal.QUEUE_FULL
                return answer
            req.submitted = time.perf_counter()
            self._reqs[req.id] = req
            self.stats.submitted += 1
        self._wake.set()
        return answer

    def cancel(self, rid: int) -> bool:
        """End request `rid` at the next step; False when it already ended."""
        with self._lock:
            found = self.sched.cancel(rid)
        self._wake.set()
        return found

    def snapshot(self) -> dict[str, float]:
        """Gauges for /metrics and /health, as of the engine thread's last step: queue depth,
        running rows, open sequences, leased pages, pool and host-tier use, prefix index entries,
        output tokens per second over the last `RATE_WINDOW_S`."""
        return self._meter.snapshot()

    def report(self) -> tuple[Stats, dict[str, float]]:
        """A copy of the counters and histograms, and the gauges (`snapshot`)."""
        return self._meter.report()

    def close(self) -> None:
        """Stop the engine thread; requests still open end cancelled. The engine stays open."""
        with self._lock:
            self._closed = True
            for rid in list(self._reqs):
                self.sched.cancel(rid)
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        else:
            self._drain()

    # ---- the engine thread -------------------------------------------------------------------

    def _loop(self) -> None:
        if isinstance(self.engine.backend, Bound):
            self.engine.backend.make_current()  # NOTE: the engine thread drives the GPU from here on
        while True:
            with self._lock:
                closed = self._closed
            if self._turn():
                continue
            self._measure()
            if closed:
                return
            self._wake.wait(self.config.idle_s)
            self._wake.clear()

    def _drain(self) -> None:
        while self._turn():
            pass

    def _turn(self) -> bool:
        """One turn of the engine thread: with no step in flight, the next plan executed (False:
        nothing to do); else what the scheduler gives `ahead` (the rows' next step issued, or an
        admissions and their chunks run behind the step in flight), then the oldest step landed."""
        with self._lock:
            head = self._flights.newest
            plan = self.sched.plan() if head is None else None
            nxt = self.sched.ahead(head.plan) if head is not None and self._flights.pipe is not None else None
        if plan is not None and plan.idle:
            return False
        try:
            if plan is not None:
                self._begin(plan)
                return True
            if nxt is not None and nxt.decode:
                self._issue(nxt)
            elif nxt is not None:
                self._behind(nxt)
            self._land()
        except Exception as exc:  # NOTE: the engine thread outlives any one step's failure
            self._fail(plan, f"{type(exc).__name__}: {exc}")
        return True

    def _begin(self, plan: Plan) -> None:
        """Executes `plan`: with a pipeline, its decode step is issued before the prefill chunks run
        (their host work overlaps the step on the GPU; the rows are not the chunks' sequences),
        else the chunks run and the rows decode in turn, and the step lands."""
        self._execute(plan)
        if plan.rides:
            self._ride(plan)
            return
        flight = self._flights.add(plan)
        rows = [self._seqs[i] for i in plan.decode]
        sampling = [self._reqs[i].sampling for i in plan.decode]
        pipe = self._piping.pipeline(rows, sampling) if rows and self._piping is not None else None
        if pipe is not None:
            self._flights.pipe = pipe
            pipe.issue()
        flight.prefilled = self._prefill(plan, flight)
        if pipe is None:
            flight.picked = self.decoder.decode(rows, sampling) if rows else []
            self._land()

    def _ride(self, plan: Plan) -> None:
        """The decode rows and the riders' prompt tokens in one step (`run_rides` shares the rows:
        an admission starts when its turn comes), then the step lands."""
        assert self._riding is not None
        flight = self._flights.add(plan)
        took = kern_pool.run_rides(plan, self._start_ride, self._rest)
        ids = [*plan.decode, *took]
        seqs = [self._seqs[i] for i in ids]
        got = self._riding.ride(seqs, [self._reqs[i].sampling for i in ids], [1] * len(plan.decode) + list(took.values()))
        picked = dict(zip(ids, got, strict=True))
        flight.prefilled = {rid: self._seqs[rid].kv - (picked[rid] is not None) for rid in took}
        flight.ids = (*plan.decode, *(rid for rid in took if picked[rid] is not None))
        flight.picked = [s for s in (picked[i] for i in flight.ids) if s is not None]
        with self._lock:
            self.stats.ridden += sum(took.values())
        self._land()

    def _start_ride(self, admit: kern_pool.Admit) -> None:
        """An admission's sequence and lease (its cached prefix reused); a rest longer than
        `ride_max` is prefilled through the chunk program, so only its last token rides."""
        req = self._reqs[admit.id]
        seq = self._seqs[admit.id] = self.engine.sequence()
        self._leases[admit.id] = admit.lease
        tokens = [*req.prompt, *req.generated]
        room = admit.lease - len(tokens) + 1
        if len(tokens) - 1 - self._cached(seq, tokens) > self.config.ride_max:
            pre = self.engine.prefill(seq, tokens, room)
        else:
            pre = self.engine.begin(seq, tokens, room)
        self._admitted(req, pre.reused)

    def _rest(self, rid: int) -> int:
        seq = self._seqs[rid]
        return len(seq.tokens) - seq.kv

    def _issue(self, plan: Plan) -> None:
        """The step of `plan` (the rows of the step in flight) issued behind it."""
        self._flights.issue(plan)
        with self._lock:
            self.stats.ahead += 1

    def _behind(self, plan: Plan) -> None:
        """Admissions and their chunks (`plan`, from `ahead`) run behind the step in flight; they
        land after it."""
        flight = self._flights.add(plan, [])
        self._execute(plan)
        flight.prefilled = self._prefill(plan, flight)

    def _land(self) -> None:
        """The oldest step in flight read back (the pipeline closed when it was the last one),
        committed without its stale rows' tokens, and those tokens sent."""
        flight, picked = self._flights.land()
        plan = flight.plan
        got = dict(zip(flight.ids if flight.ids is not None else plan.decode, picked, strict=True))
        stops = {rid for rid, s in got.items() if self._stops(self._reqs[rid], s.token)}
        with self._lock:
            stale = set(self.sched.stale(plan))
            live = {rid: s for rid, s in got.items() if rid not in stale}
            heads = {rid: t for rid, t in flight.heads.items() if rid not in stale}
            tokens = {**heads, **{rid: s.token for rid, s in live.items()}}
            stopped = (stops & set(live)) | (flight.head_stops & set(heads))
            outcome = kern_pool.Outcome(flight.prefilled, tokens, stopped)
            self.sched.commit(plan, outcome)
            self.stats.steps += 1
            self.stats.stale += len(got) - len(live)
        self._emit(live)
        self._measure()

    def _execute(self, plan: Plan) -> None:
        """The plan's retirements, parks and growths."""
        for r in plan.retire:
            self._retire(r.id, r.why)
        for rid in plan.park:
            self._park(rid)
        for g in plan.grow:
            seq = self._seqs[g.id]
            self.engine.prefill(seq, seq.tokens, g.lease - seq.kv)

    def _prefill(self, plan: Plan, flight: Flight) -> dict[int, int]:
        """The plan's chunks, one sequence after another while the step's budget lasts (each takes
        the tokens it computed, at least one): an admission gets its `Sequence` when its chunk's
        turn comes, and the next chunk runs only after a finished prefill. Returns each chunk's
        tokens with KV, for the chunks that ran (a prompt whose first token came with it counted
        as a finished prefill: all but its last token); those tokens go to `flight.heads`."""
        self._into = flight
        try:
            return kern_pool.run_chunks(plan, self._start, self._chunk)
        finally:
            self._into = None

    def _start(self, admit: kern_pool.Admit) -> None:
        self._seqs[admit.id] = self.engine.sequence()
        self._leases[admit.id] = admit.lease

    def _chunk(self, rid: int, budget: int) -> tuple[int, int, bool]:
        """Request `rid`'s prefill, `budget` more tokens past what its KV or the cache holds: the
        tokens computed, its tokens with KV now, and whether its prefill is done."""
        req, seq = self._reqs[rid], self._seqs[rid]
        tokens = [*req.prompt, *req.generated]
        first = seq.lease is None
        start = self._cached(seq, tokens) if first else seq.kv
        stop = min(len(tokens), start + budget + 1)
        head = self._head and stop == len(tokens) and not req.generated and req.sampling.plain
        pre = self.engine.prefill(seq, tokens[:stop], self._leases[rid] - stop + 1, first=head)
        if first:
            self._admitted(req, pre.reused)
        kv = seq.kv
        if pre.first is not None:
            kv -= 1  # NOTE: the scheduler counts the last prompt token's KV with its first token
            self._head_token(rid, req, pre.first)
        return kv - (pre.reused if first else start), kv, kv >= len(tokens) - 1

    def _head_token(self, rid: int, req: Request, token: int) -> None:
        """A first token the head program computed: sent now, committed when its plan lands."""
        flight = self._into
        assert flight is not None
        if self._stops(req, token):
            flight.head_stops.add(rid)
        flight.heads[rid] = token
        self._emit({rid: Sampled(token, None, ())})

    def _cached(self, seq: Sequence, tokens: list[int]) -> int:
        """The prompt tokens the engine can reuse now: the index's hit or a live sequence's, as
        the engine's cache manager decides them."""
        live = [o.tokens[: o.kv] for o in self.engine.sequences if o.lease is not None and o is not seq]
        return self.engine.cache.cached(tokens, live)

    def _admitted(self, req: Request, reused: int) -> None:
        if not req.generated:
            req.cached = reused
            self._meter.admitted(len(req.prompt), reused)

    def _stops(self, req: Request, token: int) -> bool:
        return self._texts.stops(req.id, req.stop_text, req.generated, token)

    def _retire(self, rid: int, why: Finish) -> None:
        self._leases.pop(rid, None)
        self._texts.forget(rid)
        seq = self._seqs.pop(rid, None)
        if seq is not None:
            self.engine.finish(seq)
            self.engine.release(seq)
        req = self._reqs.pop(rid)
        with self._lock:
            self.stats.finished[why.value] = self.stats.finished.get(why.value, 0) + 1
        self._send(rid, req, Done(why, len(req.prompt), len(req.generated), req.cached))

    def _park(self, rid: int) -> None:
        self._leases.pop(rid, None)
        seq = self._seqs.pop(rid)
        self.engine.finish(seq)
        self.engine.release(seq)
        with self._lock:
            self.stats.parks += 1

    def _emit(self, picked: Mapping[int, Sampled]) -> None:
        now = time.perf_counter()
        samples: list[tuple[bool, float]] = []
        for rid, s in picked.items():
            req = self._reqs[rid]
            if req.first is None:
                req.first = now
                samples.append((True, now - req.submitted))
            elif req.last is not None:
                samples.append((False, now - req.last))
            req.last = now
            req.generated.append(s.token)
            self._send(rid, req, Token(s.token, s.logprob, s.top))
        self._meter.emitted(now, len(picked), samples)

    def _send(self, rid: int, req: Request, ev: Event) -> None:
        """`ev` to the request's sink; a sink that raises is a client gone: its request is cancelled."""
        try:
            req.sink(ev)
        except Exception:  # NOTE: whatever the sink raised, the engine thread goes on
            with self._lock:
                self.sched.cancel(rid)

    def _measure(self) -> None:
        self._meter.measure(self.sched, self.engine, self._seqs.values())

    def _fail(self, plan: Plan | None, message: str) -> None:
        """The engine raised while executing `plan` or a step in flight: every request those steps
        touched ends with the error (its sequence released), the rest carry on."""
        plans = self._flights.drop() + ([plan] if plan is not None else [])
        touched = {i for p in plans for i in (*p.park, *(g.id for g in p.grow), *p.decode)}
        touched |= {c.id for p in plans for c in (*p.chunks, *p.rides) if c.id in self._seqs}
        with self._lock:
            for rid in touched:
                if rid in self.sched:
                    self.sched.cancel(rid)
            drop = self.sched.plan().retire
            self.sched.commit(Plan(retire=drop), kern_pool.Outcome())
            self.stats.failed += len(touched)
        for r in drop:
            self._leases.pop(r.id, None)
            seq = self._seqs.pop(r.id, None)
            if seq is not None:
                self.engine.release(seq)
            req = self._reqs.pop(r.id, None)
            if req is None:
                continue
            if r.id in touched:
                self._send(r.id, req, Done(None, len(req.prompt), len(req.generated), req.cached, message))
            else:
                self._send(r.id, req, Done(r.why, len(req.prompt), len(req.generated), req.cached))

