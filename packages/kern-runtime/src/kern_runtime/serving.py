"""Serving: many requests on one `Engine`, batched by `kern_pool.Scheduler`, in one engine thread.

`Serving(engine, decoder, config)` owns the engine from `start()` to `close()`: callers (a server's
event loop, tests) `submit` a `Request` from any thread and get the scheduler's answer at once
(queued, or refused: queue full, never fits); the request's `sink` then receives its `Token`s and
one `Done` on the engine thread (a server hands them to its loop). `cancel` ends a request at the
next step (a client that went away). Each step the engine thread takes the scheduler's `Plan` and
executes it: retired and parked requests `finish` (their KV goes to the prefix index; the engine
parks it to the host tier when the pool needs the pages), a grown lease is a `prefill` of the
tokens so far with more room (the index's entry is restored, nothing is computed), the admitted
request gets a `Sequence`, the prefill chunk is a `prefill` of the prompt's first tokens up to
the chunk's budget past its cached prefix, and the decode rows go to the decoder in one call.

The decoder is the seam to the engine's step: `decode(seqs, sampling) -> [Sampled]`, one step of
every given sequence. `Batched` runs them in one `Engine.decode` (the manifest's batched step, each
row with its own `Sampling`); `RowByRow`, for a manifest with only the one-row step, runs each row
as one `Engine.step` (greedy). `decoder_for` picks between them.
"""

from __future__ import annotations

import bisect
import copy
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import kern_pool
from kern_pool import Finish, Plan, Refusal, SchedConfig, Scheduler, Tier

from .batch import Sampled, Sampling
from .engine import Engine, EngineConfig, Sequence
from .errors import ApiError, EngineError
from .reuse import shared_prefix

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
    "Request",
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
        manifest: the manifest JSON file.
        kernels: the directory of its cubins.
        weights: .safetensors files, or checkpoint directories (empty: the factory's default).
        gpu: the device ordinal.
        tokens: KV tokens of the pool.
        seqs: live sequences the pool is sized for.
        host_bytes: bytes of the host tier (0: none; evicted prefixes are dropped).
        chunk: prefill chunk rows.
    """

    manifest: Path
    kernels: Path
    weights: tuple[Path, ...]
    gpu: int
    tokens: int
    seqs: int
    host_bytes: int
    chunk: int


EngineFactory = Callable[[EngineSpec], Engine]


def open_engine(spec: EngineSpec) -> Engine:
    """The GPU engine of `spec` (`Engine.open`): the default `kern serve` backend.

    Raises:
        as `Engine.open`.
    """
    from .session import weight_files

    files = [str(p) for p in weight_files(spec.weights)]
    return Engine.open(spec.manifest, spec.kernels, files, gpu=spec.gpu, tokens=spec.tokens, seqs=spec.seqs,
                       host_bytes=spec.host_bytes, config=EngineConfig(chunk=spec.chunk))


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

RATE_WINDOW_S = 5.0
"""The window of the tokens-per-second gauge."""


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
    """The scheduler's limits and how long the idle engine thread sleeps between looks."""

    sched: SchedConfig = field(default_factory=SchedConfig)
    idle_s: float = 0.05


BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the TTFT and TPOT histograms' buckets."""


@dataclass(slots=True)
class Histogram:
    """Observations counted in `BUCKETS` (the last count: above every bound), with their sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    sum: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.sum += value
        self.count += 1


@dataclass(slots=True)
class Stats:
    """What the server did, for /metrics: counts, and the TTFT and TPOT histograms (seconds)."""

    submitted: int = 0
    refused: int = 0
    finished: dict[str, int] = field(default_factory=dict[str, int])
    failed: int = 0
    generated: int = 0
    prompt: int = 0
    reused: int = 0
    admissions: int = 0
    hits: int = 0
    parks: int = 0
    steps: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)


class Serving:
    """The engine thread: `start()`, `submit` / `cancel` from any thread, `close()`."""

    def __init__(self, engine: Engine, decoder: Decoder | None = None, config: ServingConfig | None = None,
                 *, text: Callable[[Seq[int]], str] | None = None) -> None:
        """Schedule requests on `engine` (its pool sizes the scheduler) through `decoder`
        (default `decoder_for(engine)`); `text` detokenizes for stop strings.

        Raises:
            kern_pool.ApiError: a scheduler limit out of range.
        """
        self.engine = engine
        self.decoder: Decoder = decoder or decoder_for(engine)
        self.config = config or ServingConfig()
        pool = engine.backend.pool
        # NOTE: one page stays spare: a grown lease is restored from its checkpoint, whose
        # partial page is copied while the checkpoint still holds the old one.
        self.sched = Scheduler(self.config.sched, pages=max(1, pool.pages_max - 1), unit=pool.unit,
                               row_tokens=engine.reach)
        self.stats = Stats()
        self._text = text
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._reqs: dict[int, Request] = {}
        self._seqs: dict[int, Sequence] = {}
        self._next = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._leases: dict[int, int] = {}
        self._window: deque[tuple[float, int]] = deque()
        self._gauges: dict[str, float] = {}
        self._measure()

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
        with self._lock:
            return dict(self._gauges)

    def report(self) -> tuple[Stats, dict[str, float]]:
        """A copy of the counters and histograms, and the gauges (`snapshot`)."""
        with self._lock:
            st = copy.deepcopy(self.stats)
            return st, dict(self._gauges)

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
        while True:
            with self._lock:
                plan = self.sched.plan()
                closed = self._closed
            if plan.idle:
                self._measure()
                if closed:
                    return
                self._wake.wait(self.config.idle_s)
                self._wake.clear()
                continue
            self._step(plan)

    def _drain(self) -> None:
        while not (plan := self.sched.plan()).idle:
            self._step(plan)

    def _step(self, plan: Plan) -> None:
        try:
            outcome, picked = self._execute(plan)
        except Exception as exc:  # NOTE: the engine thread outlives any one step's failure
            self._fail(plan, f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self.sched.commit(plan, outcome)
            self.stats.steps += 1
        self._emit(outcome, picked)
        self._measure()

    def _execute(self, plan: Plan) -> tuple[kern_pool.Outcome, dict[int, Sampled]]:
        for r in plan.retire:
            self._retire(r.id, r.why)
        for rid in plan.park:
            self._park(rid)
        for g in plan.grow:
            seq = self._seqs[g.id]
            self.engine.prefill(seq, seq.tokens, g.lease - seq.kv)
        if plan.admit is not None:
            self._seqs[plan.admit.id] = self.engine.sequence()
            self._leases[plan.admit.id] = plan.admit.lease
        prefilled = self._chunk(plan) if plan.chunk is not None else None
        tokens: dict[int, int] = {}
        picked: list[Sampled] = []
        if plan.decode:
            rows = [self._seqs[i] for i in plan.decode]
            picked = self.decoder.decode(rows, [self._reqs[i].sampling for i in plan.decode])
            tokens = {rid: s.token for rid, s in zip(plan.decode, picked, strict=True)}
        stopped = [rid for rid in plan.decode if self._stops(self._reqs[rid], tokens[rid])]
        return kern_pool.Outcome(prefilled, tokens, stopped), dict(zip(plan.decode, picked, strict=True))

    def _chunk(self, plan: Plan) -> int:
        assert plan.chunk is not None
        rid = plan.chunk.id
        req, seq = self._reqs[rid], self._seqs[rid]
        tokens = [*req.prompt, *req.generated]
        first = seq.lease is None
        start = self._cached(seq, tokens) if first else seq.kv
        stop = min(len(tokens), start + plan.chunk.budget + 1)
        pre = self.engine.prefill(seq, tokens[:stop], self._leases[rid] - stop + 1)
        if first:
            self._admitted(req, pre.reused)
        return seq.kv

    def _cached(self, seq: Sequence, tokens: list[int]) -> int:
        """The prompt tokens the engine can reuse now: the index's hit or a live sequence's."""
        hit = self.engine.prefix.lookup(tokens)
        stateful = self.engine.backend.pool.has_slots
        live = [shared_prefix(o.tokens[: o.kv], tokens, stateful)
                for o in self.engine.sequences if o.lease is not None and o is not seq]
        return max([hit.length if hit is not None else 0, *live])

    def _admitted(self, req: Request, reused: int) -> None:
        if not req.generated:
            req.cached = reused
            with self._lock:
                self.stats.admissions += 1
                self.stats.hits += reused > 0
                self.stats.prompt += len(req.prompt)
                self.stats.reused += reused

    def _stops(self, req: Request, token: int) -> bool:
        if not req.stop_text or self._text is None:
            return False
        text = self._text([*req.generated, token])
        return any(s in text for s in req.stop_text)

    def _retire(self, rid: int, why: Finish) -> None:
        self._leases.pop(rid, None)
        seq = self._seqs.pop(rid, None)
        if seq is not None:
            self.engine.finish(seq)
            self.engine.release(seq)
        req = self._reqs.pop(rid)
        with self._lock:
            self.stats.finished[why.value] = self.stats.finished.get(why.value, 0) + 1
        req.sink(Done(why, len(req.prompt), len(req.generated), req.cached))

    def _park(self, rid: int) -> None:
        self._leases.pop(rid, None)
        seq = self._seqs.pop(rid)
        self.engine.finish(seq)
        self.engine.release(seq)
        with self._lock:
            self.stats.parks += 1

    def _emit(self, outcome: kern_pool.Outcome, picked: Mapping[int, Sampled]) -> None:
        now = time.perf_counter()
        samples: list[tuple[bool, float]] = []
        for rid, token in outcome.tokens.items():
            req = self._reqs[rid]
            s = picked[rid]
            if req.first is None:
                req.first = now
                samples.append((True, now - req.submitted))
            elif req.last is not None:
                samples.append((False, now - req.last))
            req.last = now
            req.generated.append(token)
            req.sink(Token(token, s.logprob, s.top))
        with self._lock:
            self.stats.generated += len(outcome.tokens)
            for ttft, value in samples:
                (self.stats.ttft if ttft else self.stats.tpot).observe(value)
        self._window.append((now, len(outcome.tokens)))

    def _measure(self) -> None:
        """The gauges, read on the engine thread between steps."""
        now = time.perf_counter()
        while self._window and self._window[0][0] < now - RATE_WINDOW_S:
            self._window.popleft()
        pool = self.engine.backend.pool
        leased = sum(len(s.lease.pages) for s in self._seqs.values() if s.lease is not None)
        gauges = {
            "queue_depth": float(self.sched.queued), "running_rows": float(self.sched.running),
            "open_sequences": float(len(self.engine.sequences)), "leased_pages": float(leased),
            "pool_pages_used": float(pool.pages_used), "pool_pages_total": float(pool.pages_max),
            "prefix_resident": float(self.engine.prefix.count(Tier.RESIDENT)),
            "prefix_parked": float(self.engine.prefix.count(Tier.PARKED)),
            "tokens_per_second": sum(n for _, n in self._window) / RATE_WINDOW_S,
        }
        host = _host(self.engine)
        if host is not None:
            gauges["host_units_used"], gauges["host_units_total"] = float(host[0]), float(host[1])
        with self._lock:
            self._gauges = gauges

    def _fail(self, plan: Plan, message: str) -> None:
        """The engine raised while executing `plan`: every request it touched ends with the error
        (its sequence released), the rest carry on."""
        touched = {*plan.park, *(g.id for g in plan.grow), *plan.decode}
        touched |= {c.id for c in (plan.admit, plan.chunk) if c is not None}
        with self._lock:
            for rid in touched:
                if rid in self.sched:
                    self.sched.cancel(rid)
            drop = self.sched.plan().retire
            self.sched.commit(Plan(retire=drop), kern_pool.Outcome())
            self.stats.failed += len(touched)
        for r in drop:
            seq = self._seqs.pop(r.id, None)
            if seq is not None:
                self.engine.release(seq)
            req = self._reqs.pop(r.id, None)
            if req is None:
                continue
            if r.id in touched:
                req.sink(Done(None, len(req.prompt), len(req.generated), req.cached, message))
            else:
                req.sink(Done(r.why, len(req.prompt), len(req.generated), req.cached))


def _host(engine: Engine) -> tuple[int, int] | None:
    """(used, total) units of the engine's host tier, None without one."""
    if not engine.config.park:
        return None
    try:
        host: kern_pool.Host = getattr(engine.backend, "host")  # noqa: B009
    except (AttributeError, ApiError, AssertionError):
        return None
    return host.used, host.used + host.free
