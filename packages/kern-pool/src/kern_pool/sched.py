"""Serving decisions: continuous batching of many requests over one engine, as values.

A `Scheduler` holds the requests of a server: a FCFS queue, at most one sequence in prefill
between steps, the rows in decode, and the parked ones. Each step `plan()` returns a `Plan` (what
to retire, park, grow, admit, prefill and decode this step), computed from that state alone (no
clock, no device: the same calls give the same plans); the engine executes it and
`commit(plan, outcome)` records what came of it: how far each prefill chunk got (so which
admissions started), the token each decode row produced, which rows matched a stop string. The
memory model is whole pages of `unit` tokens: a running request reserves the pages of its lease
(`lease_tokens(prompt, room)`), and reservations never pass `pages`.

The rules, in the order a plan applies them:
- retire: a request cancelled (queued or running), or finished on its last step (a stop id, a stop
  string the engine matched, max_tokens).
- grow: a decode row whose lease room is spent gets `grow` more steps (`SchedConfig.grow`; 0
  reserves every step at admission, so nothing ever grows). When the pages are not there, the
  newest running request is parked (its KV goes to the prefix index, the engine parks it to the
  host tier when the pool needs the pages) and waits at the head of the queue, before every
  request that came after it; it resumes with its prompt and the tokens it generated so far.
- prefill and admit: the step's prefill budget is its token budget (`step_tokens`) less one token
  per decode row, at least one token. Prefill runs one sequence at a time, chunk after chunk in
  the plan's order: first the sequence already in prefill (when there is one), then the heads of
  the queue in FCFS order, each admitted when its turn comes. A chunk computes the tokens of its
  sequence past its cached prefix, at most `chunk` and at most the budget left, and takes what it
  computed from the budget (at least one token); the next chunk runs only when this one finished
  its sequence's prefill and the budget has tokens left. So a burst of short remainders (a cached
  system prompt, a short question) is admitted and prefilled in one step, and at most one
  sequence's prefill is unfinished when a step ends. The plan lists the heads that may be
  admitted: while each has a free row, its lease's pages (counted as if every listed head before
  it started) and a token of the budget, and the sequence in prefill is due to finish within
  the budget; the first head that does not fit ends the list and holds everyone behind it (FCFS),
  and no head is admitted on a step that parks. A listed head whose chunk did not run (an
  earlier one did not finish, or the budget ran out) stays at the head of the queue.
- decode: every running row whose prefill is done and whose lease has room.

Riding (`SchedConfig.ride` > 0, an engine whose batched step holds that many rows): the prompt
tokens are rows of the decode step instead of chunks of their own. The step's rows are its decode
rows and then the riding tokens: at most `ride` rows in one engine call (decode rows past `ride`
fill calls of their own, the last one takes the riders) and at most the token budget
(`step_tokens`, the decode rows counted; at least one riding row). The riders share those rows in
the order chunks do: the sequence already riding first, then the heads of the queue in FCFS order,
each admitted when its turn comes (the same admission rules, a row standing for a token of the
budget). A rider takes the tokens of its sequence past its KV (its cached prefix restored on
admission), its last prompt token included, as many as the rows left; the next rides only when
this one reached its last token. The row of that last token samples the request's first token, so
a request decodes (is a decode row) only on the step after its last prompt token rode, and at most
one sequence is part way through its prompt when a step ends. A rider's outcome is
`Outcome.prefilled` = its tokens with KV but the last (as a finished prefill's), and its token in
`Outcome.tokens`: the row of its last token is that step's decode row of the request.

Steps in flight: an engine that issues a step before reading the previous one back asks
`ahead(plan)` while `plan`'s step is in flight (executed, not committed). The answer is the next
step's plan when it is what `plan()` would give once `plan` commits with no row ending (a step of
the same rows, nothing else: no admission, chunk, ride, growth or retirement, so no row reaches
max_tokens or the end of its lease); or, when that plan also admits heads of the queue, the
admissions with their chunks and budget alone, to run behind the step in flight (one sequence
after another, as in any plan) and commit after it; else None: the next step waits for `plan`'s
tokens. A row that does end on `plan`'s step (a stop id, a stop string, a cancellation) is
`stale` in the step issued ahead of it: that step's token for it is dropped, never committed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from itertools import pairwise

from kern_pool.cache import lease_tokens
from kern_pool.errors import ApiError

__all__ = [
    "Admit",
    "Ask",
    "Chunk",
    "Finish",
    "Grow",
    "Outcome",
    "Plan",
    "Queued",
    "Refusal",
    "Refused",
    "Retire",
    "SchedConfig",
    "Scheduler",
    "lease_pages",
    "run_chunks",
    "run_rides",
]


class Finish(Enum):
    """Why a request ended."""

    STOP = "stop"
    """A stop token id, or a stop string the engine matched."""
    LENGTH = "length"
    """max_tokens generated."""
    CANCELLED = "cancelled"
    """The client went away (or asked to cancel)."""


class Refusal(Enum):
    """Why a request was not queued."""

    QUEUE_FULL = "queue_full"
    """`SchedConfig.queued` requests are waiting already: try again later."""
    NEVER_FITS = "never_fits"
    """Its prompt and max_tokens need more pages than the pool has, or more than a row holds."""


@dataclass(frozen=True, slots=True)
class SchedConfig:
    """How the scheduler batches.

    Attributes:
        rows: most requests running at once (decode rows, the one in prefill included).
        queued: most requests waiting; one more is refused with `Refusal.QUEUE_FULL`.
        step_tokens: tokens one step computes: one per decode row, the rest go to the prefill chunk.
        chunk: most tokens of one prefill chunk.
        grow: decode steps a lease holds at a time (0: all of max_tokens at admission).
        ride: rows of the engine's batched step that prompt tokens ride on (0: prompts prefill
            in chunks of their own, `chunk` at most).
    """

    rows: int = 64
    queued: int = 1024
    step_tokens: int = 512
    chunk: int = 512
    grow: int = 0
    ride: int = 0

    def check(self) -> None:
        """Raises ApiError naming the first value out of range."""
        for name in ("rows", "queued", "step_tokens", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ApiError(f"SchedConfig.{name} must be an integer of at least 1, got {value!r}")
        for name in ("grow", "ride"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ApiError(f"SchedConfig.{name} must be an integer of at least 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Ask:
    """A request as the scheduler sees it: its id, prompt length, most tokens to generate and the
    token ids that end it."""

    id: int
    prompt: int
    max_tokens: int
    stop: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Queued:
    """`submit`'s answer: queued, `ahead` requests before it."""

    id: int
    ahead: int


@dataclass(frozen=True, slots=True)
class Refused:
    """`submit`'s answer: not queued, and why."""

    id: int
    why: Refusal


@dataclass(frozen=True, slots=True)
class Admit:
    """Start (or resume) request `id`: a sequence over its first `tokens` tokens (the prompt, and
    for a resumed request the tokens it generated), whose lease holds `lease` tokens."""

    id: int
    tokens: int
    lease: int
    resume: bool


@dataclass(frozen=True, slots=True)
class Chunk:
    """Prefill at most `budget` more tokens of request `id` (its cached prefix comes free), and no
    more than the step's prefill budget has left when its turn comes."""

    id: int
    budget: int


@dataclass(frozen=True, slots=True)
class Grow:
    """Request `id`'s lease grows to `lease` tokens (its KV kept: no prefill)."""

    id: int
    lease: int


@dataclass(frozen=True, slots=True)
class Retire:
    """Request `id` ends (`why`); a running one's KV goes to the prefix index."""

    id: int
    why: Finish
    running: bool


@dataclass(frozen=True, slots=True)
class Plan:
    """One step's decisions, applied in this order: retire, park, grow, the chunks (with the
    admissions), decode (with the rides: their rows in the same step).

    Attributes:
        retire: requests that end.
        park: running requests parked (they wait at the head of the queue).
        grow: leases that grow.
        admits: heads of the queue that may start, in queue order. Each starts when its turn
            comes in `chunks` (its chunk runs then); the rest stay queued.
        chunks: prefill chunks, one sequence after another: the sequence already in prefill
            first (when there is one), then one per admission. Each runs only when the one before
            it finished its prefill and the step's `budget` has tokens left.
        decode: rows that decode one token.
        budget: the prefill tokens of the step, shared by its chunks in turn: each chunk takes
            what it computes, at least one token (0 when there are no chunks).
        rides: prompt tokens riding on the decode step as rows of it, one sequence after another
            (the one riding already first, then one per admission, as `chunks`): each takes its
            tokens past its KV up to its last one, at most the `rows` left, and the next rides only
            after one reached its last token. Empty unless `SchedConfig.ride`; then `chunks` is.
        rows: the step's rows the rides share (0 when there are no rides).
    """

    retire: tuple[Retire, ...] = ()
    park: tuple[int, ...] = ()
    grow: tuple[Grow, ...] = ()
    admits: tuple[Admit, ...] = ()
    chunks: tuple[Chunk, ...] = ()
    decode: tuple[int, ...] = ()
    budget: int = 0
    rides: tuple[Chunk, ...] = ()
    rows: int = 0

    @property
    def idle(self) -> bool:
        """Nothing to do this step."""
        return not (self.retire or self.park or self.grow or self.admits or self.chunks or self.decode or self.rides)

    @property
    def tokens(self) -> int:
        """The most tokens this step computes."""
        return len(self.decode) + (self.budget if self.chunks else 0) + (self.rows if self.rides else 0)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What executing a plan gave.

    Attributes:
        prefilled: for each chunk that ran (the first chunks of the plan, in its order, every
            one but the last with its prefill finished), its request's tokens with KV now (the
            cached prefix counted). A plan's admission whose chunk ran started; the others did
            not (they stay queued).
        tokens: the token each decode row produced, each rider whose last prompt token rode
            (that row's sample: its first token), and each chunk's request whose prefill finished
            with its first token computed (the engine's head program after its last prompt token;
            `prefilled` then counts its tokens with KV but that last one, as a finished prefill).
        stopped: decode rows (and such riders and chunks) whose text now holds a stop string.
    """

    prefilled: Mapping[int, int] = field(default_factory=dict[int, int])
    tokens: Mapping[int, int] = field(default_factory=dict[int, int])
    stopped: Collection[int] = ()


def run_chunks(plan: Plan, start: Callable[[Admit], None],
               chunk: Callable[[int, int], tuple[int, int, bool]]) -> dict[int, int]:
    """Executes `plan`'s chunks as the rules say: one sequence after another while the step's
    budget lasts, `start(admit)` as an admission's chunk comes up, then `chunk(id, budget)`, which
    prefills at most `budget` tokens of request `id` past what its KV or the cache holds and returns
    (the tokens it computed, its tokens with KV now, whether its prefill is done); each chunk takes
    what it computed from the budget, at least one token, and the next runs only after a finished
    prefill. Returns the `Outcome.prefilled` of the chunks that ran."""
    admits = {a.id: a for a in plan.admits}
    done: dict[int, int] = {}
    left = plan.budget
    for c in plan.chunks:
        if left < 1:
            break
        if c.id in admits:
            start(admits[c.id])
        computed, kv, finished = chunk(c.id, min(c.budget, left))
        done[c.id] = kv
        left -= max(1, computed)
        if not finished:
            break
    return done


def run_rides(plan: Plan, start: Callable[[Admit], None], rest: Callable[[int], int]) -> dict[int, int]:
    """Shares `plan`'s riding rows as the rules say: one sequence after another while the rows
    last, `start(admit)` as an admission's ride comes up, then `rest(id)`, the tokens of request
    `id` not in its KV (its last prompt token included, at least 1); each rider takes as many of
    them as the rows left, and the next rides only after one took all of its rest. Returns the
    rows each rider took, in the plan's order."""
    admits = {a.id: a for a in plan.admits}
    took: dict[int, int] = {}
    left = plan.rows
    for r in plan.rides:
        if left < 1:
            break
        if r.id in admits:
            start(admits[r.id])
        want = rest(r.id)
        took[r.id] = n = min(want, left)
        left -= n
        if n < want:
            break
    return took


def lease_pages(tokens: int, unit: int) -> int:
    """Pages of `unit` tokens a lease of `tokens` tokens takes."""
    return -(-tokens // unit)


@dataclass(slots=True)
class _Req:
    ask: Ask
    order: int
    generated: int = 0
    done: int = 0
    """Tokens with KV, once admitted (the prefill's progress)."""
    lease: int = 0
    """Tokens the lease holds (0 while waiting)."""
    last: int | None = None
    cancelled: bool = False
    stopped: bool = False
    started: bool = False
    """Admitted once (a parked request waits again, outside the queue's limit)."""

    @property
    def total(self) -> int:
        """The prompt and the generated tokens: what a (re)started sequence holds."""
        return self.ask.prompt + self.generated

    @property
    def left(self) -> int:
        return self.ask.max_tokens - self.generated

    @property
    def prefilling(self) -> bool:
        return self.lease > 0 and self.done < self.total - 1

    @property
    def room(self) -> int:
        """Decode steps the lease has left (its tokens past the last KV position)."""
        return self.lease - self.done


class Scheduler:
    """Continuous batching decisions for one engine whose pool holds `pages` pages of `unit`
    tokens, a row at most `row_tokens` tokens.

    Raises:
        ApiError: a config value out of range, or pages, unit or row_tokens below 1.
    """

    def __init__(self, config: SchedConfig, *, pages: int, unit: int, row_tokens: int) -> None:
        config.check()
        for name, value in (("pages", pages), ("unit", unit), ("row_tokens", row_tokens)):
            if value < 1:
                raise ApiError(f"the scheduler's {name} must be at least 1, got {value}")
        self.config = config
        self.pages = pages
        self.unit = unit
        self.row_tokens = row_tokens
        self._reqs: dict[int, _Req] = {}
        self._queue: list[int] = []
        self._running: list[int] = []
        self._order = 0

    # ---- requests ----------------------------------------------------------------------------

    def most_tokens(self, prompt: int) -> int:
        """The largest max_tokens `submit` takes with a prompt of `prompt` tokens (below 1: none):
        the prompt and all but the last token fit one row and a lease of the pool's pages."""
        return min(self.row_tokens, self.pages * self.unit) - prompt + 1

    def submit(self, ask: Ask) -> Queued | Refused:
        """Queue `ask` at the tail, or refuse it (queue full; never fits).

        Raises:
            ApiError: an id already known, a prompt or max_tokens below 1.
        """
        if ask.id in self._reqs:
            raise ApiError(f"request {ask.id} is already scheduled")
        if ask.prompt < 1 or ask.max_tokens < 1:
            raise ApiError(f"a request needs a prompt and max_tokens of at least 1, got {ask.prompt}, {ask.max_tokens}")
        if ask.max_tokens > self.most_tokens(ask.prompt):
            return Refused(ask.id, Refusal.NEVER_FITS)
        waiting = sum(not self._reqs[i].started for i in self._queue)
        if waiting >= self.config.queued:
            return Refused(ask.id, Refusal.QUEUE_FULL)
        self._reqs[ask.id] = _Req(ask, self._order)
        self._order += 1
        self._queue.append(ask.id)
        return Queued(ask.id, len(self._queue) - 1)

    def cancel(self, rid: int) -> bool:
        """Mark `rid` cancelled (the next plan retires it); False when it is not scheduled."""
        req = self._reqs.get(rid)
        if req is None:
            return False
        req.cancelled = True
        return True

    def __contains__(self, rid: object) -> bool:
        return rid in self._reqs

    @property
    def queued(self) -> int:
        """Requests waiting (parked ones included)."""
        return len(self._queue)

    @property
    def running(self) -> int:
        """Requests holding a lease (the one in prefill included)."""
        return len(self._running)

    @property
    def reserved(self) -> int:
        """Pages the running requests' leases reserve."""
        return self._pages(self._running)

    def generated(self, rid: int) -> int:
        """Tokens `rid` generated so far."""
        return self._reqs[rid].generated

    # ---- a step ------------------------------------------------------------------------------

    def plan(self) -> Plan:
        """This step's decisions (nothing changes until `commit`)."""
        retire = self._retirements()
        gone = {r.id for r in retire}
        running = [i for i in self._running if i not in gone]
        free = self.pages - self._pages(running)
        grow, park, free = self._grow(running, free)
        running = [i for i in running if i not in park]
        decode = tuple(i for i in running if self._decodes(i, grow))
        if self.config.ride:
            return self._ride_plan(retire, park, grow, running, decode, free, gone)
        budget = max(1, self.config.step_tokens - len(decode))
        cap = min(self.config.chunk, budget)
        current = next((i for i in running if self._reqs[i].prefilling), None)
        if current is None:
            left = budget
        else:
            rest = self._reqs[current].total - 1 - self._reqs[current].done
            left = budget - rest if rest <= cap else 0
        admits = self._admits(running, park, free, gone, left) if not park else ()
        chunks = tuple(Chunk(i, cap) for i in ([] if current is None else [current]) + [a.id for a in admits])
        return Plan(tuple(retire), tuple(park), tuple(grow), admits, chunks, decode, budget if chunks else 0)

    def _ride_plan(self, retire: list[Retire], park: set[int], grow: list[Grow], running: list[int],
                   decode: tuple[int, ...], free: int, gone: set[int]) -> Plan:
        """`plan()` when prompt tokens ride: the rows the riders share (what the decode rows leave
        of the last engine call and of the token budget, at least one), the one riding already
        first, then the admissions while rows last."""
        ride, d = self.config.ride, len(decode)
        rows = max(1, min(self.config.step_tokens - d, ride - d % ride))
        current = next((i for i in running if self._reqs[i].prefilling), None)
        left = rows
        if current is not None:
            left = max(0, rows - (self._reqs[current].total - self._reqs[current].done))
        admits = self._admits(running, park, free, gone, left) if not park else ()
        rides = tuple(Chunk(i, rows) for i in ([] if current is None else [current]) + [a.id for a in admits])
        return Plan(tuple(retire), tuple(park), tuple(grow), admits, decode=decode, rides=rides,
                    rows=rows if rides else 0)

    def ahead(self, plan: Plan) -> Plan | None:
        """What may run while `plan`'s decode step is in flight (`plan` came from `plan()` or
        `ahead()` and is not committed yet), when `plan` is a plain decode step: take what `plan()`
        would give once `plan` commits with no row ending. When that is the same step again, it;
        when it is the same rows' step with admissions and their chunks (nothing retired, parked or
        grown), those admissions, chunks and budget alone (`Plan(admits=, chunks=, budget=)`: they
        run behind the step in flight, one sequence after another as in any plan, and commit after
        it; the rows' next step is planned then). Else None. Nothing changes."""
        if not plan.decode or plan != Plan(decode=plan.decode):
            return None
        rows = [self._reqs[i] for i in plan.decode if i in self._reqs]
        if len(rows) != len(plan.decode) or any(self._finished(r) is not None for r in rows):
            return None
        saved = [(r.generated, r.done, r.last, r.stopped) for r in rows]
        try:
            for r in rows:
                r.generated, r.done, r.last, r.stopped = r.generated + 1, r.done + 1, None, False
            nxt = self.plan()
        finally:
            for r, (generated, done, last, stopped) in zip(rows, saved, strict=True):
                r.generated, r.done, r.last, r.stopped = generated, done, last, stopped
        if nxt == plan:
            return nxt
        side = Plan(admits=nxt.admits, chunks=nxt.chunks, budget=nxt.budget)
        if nxt.admits and not nxt.rides and nxt == Plan(admits=nxt.admits, chunks=nxt.chunks, decode=plan.decode, budget=nxt.budget):
            return side
        return None

    def stale(self, plan: Plan) -> tuple[int, ...]:
        """The decode rows of `plan` (and its riders and chunks, whose first token may come with
        their prefill) that ended before its step landed (a step issued `ahead` of the one they
        ended on, or cancelled while it ran): their tokens are dropped, not committed."""
        rows = (*plan.decode, *(r.id for r in plan.rides), *(c.id for c in plan.chunks))
        return tuple(i for i in rows if i not in self._reqs or self._finished(self._reqs[i]) is not None)

    def commit(self, plan: Plan, outcome: Outcome) -> None:
        """Record that `plan` ran and gave `outcome` (no tokens for its `stale` rows).

        Raises:
            ApiError: an outcome for a request the plan did not prefill or decode, chunks that ran
                out of the plan's order or after an unfinished prefill, a prefill outside the
                request's tokens, or a token for a request that had ended.
        """
        self._check_prefilled(plan, outcome.prefilled)
        self._check_rode(plan, outcome)
        for r in plan.retire:
            self._drop(r.id)
        for rid in plan.park:
            self._park(rid)
        for g in plan.grow:
            self._reqs[g.id].lease = g.lease
        for a in plan.admits:
            if a.id in outcome.prefilled:
                self._start(a)
        for rid, done in outcome.prefilled.items():
            self._reqs[rid].done = done
        extra = (set(outcome.tokens) | set(outcome.stopped)) - set(plan.decode) - {r.id for r in (*plan.rides, *plan.chunks)}
        if extra:
            raise ApiError(f"tokens for request(s) {sorted(extra)} that this plan did not decode")
        ended = [rid for rid in outcome.tokens if self._finished(self._reqs[rid]) is not None]
        if ended:
            raise ApiError(f"tokens for request(s) {sorted(ended)} that had ended: drop the stale rows' tokens")
        for rid, token in outcome.tokens.items():
            req = self._reqs[rid]
            req.generated += 1
            req.done += 1
            req.last = token
            req.stopped = rid in outcome.stopped

    # ---- decisions ---------------------------------------------------------------------------

    def _finished(self, req: _Req) -> Finish | None:
        if req.cancelled:
            return Finish.CANCELLED
        if req.stopped or (req.last is not None and req.last in req.ask.stop):
            return Finish.STOP
        if req.generated >= req.ask.max_tokens:
            return Finish.LENGTH
        return None

    def _retirements(self) -> list[Retire]:
        out: list[Retire] = []
        for rid in [*self._running, *self._queue]:
            why = self._finished(self._reqs[rid])
            if why is not None:
                out.append(Retire(rid, why, rid in self._running))
        return out

    def _grow(self, running: list[int], free: int) -> tuple[list[Grow], set[int], int]:
        """Leases of decode rows whose room is spent grow; the newest running requests are parked
        while the pages are short."""
        grow: list[Grow] = []
        park: set[int] = set()
        for rid in sorted(running, key=lambda i: self._reqs[i].order):
            req = self._reqs[rid]
            if rid in park or req.prefilling or req.room > 0:
                continue
            lease = req.done + self._steps(req)
            need = lease_pages(lease, self.unit) - lease_pages(req.lease, self.unit)
            while need > free and (victim := self._newest(running, park)) is not None and victim != rid:
                park.add(victim)
                free += lease_pages(self._reqs[victim].lease, self.unit)
            if need > free:
                park.add(rid)
                free += lease_pages(req.lease, self.unit)
                continue
            free -= need
            grow.append(Grow(rid, lease))
        return grow, park, free

    def _newest(self, running: list[int], park: set[int]) -> int | None:
        left = [i for i in running if i not in park]
        return max(left, key=lambda i: self._reqs[i].order) if left else None

    def _admits(self, running: list[int], park: set[int], free: int, gone: set[int], left: int) -> tuple[Admit, ...]:
        """The heads of the queue that may start this step, in order: each takes a row, its
        lease's pages and at least one token of the `left` budget; the first that does not fit
        ends the list (it holds everyone behind it)."""
        out: list[Admit] = []
        most = min(left, self.config.rows - len(running))
        for rid in (i for i in self._queue if i not in gone):
            req = self._reqs[rid]
            lease = self._first_lease(req)
            need = lease_pages(lease, self.unit)
            if len(out) >= most or need > free:
                break
            free -= need
            out.append(Admit(rid, req.total, lease, req.generated > 0))
        return tuple(out)

    def _first_lease(self, req: _Req) -> int:
        return lease_tokens(req.total, self._steps(req))

    def _steps(self, req: _Req) -> int:
        """Decode steps a new or grown lease of `req` holds: `grow` of them, or all it has left."""
        return min(req.left, self.config.grow or req.left)

    def _pages(self, rids: list[int]) -> int:
        """Pages the leases of `rids` reserve."""
        return sum(lease_pages(self._reqs[i].lease, self.unit) for i in rids)

    def _decodes(self, rid: int, grow: list[Grow]) -> bool:
        req = self._reqs[rid]
        return not req.prefilling and (req.room > 0 or any(g.id == rid for g in grow))


    # ---- state -------------------------------------------------------------------------------

    def _drop(self, rid: int) -> None:
        if rid in self._running:
            self._running.remove(rid)
        else:
            self._queue.remove(rid)
        del self._reqs[rid]

    def _park(self, rid: int) -> None:
        req = self._reqs[rid]
        self._running.remove(rid)
        req.lease, req.done = 0, 0
        at = next((k for k, i in enumerate(self._queue) if self._reqs[i].order > req.order), len(self._queue))
        self._queue.insert(at, rid)

    def _start(self, a: Admit) -> None:
        req = self._reqs[a.id]
        self._queue.remove(a.id)
        self._running.append(a.id)
        req.lease, req.done, req.started = a.lease, 0, True

    def _check_rode(self, plan: Plan, outcome: Outcome) -> None:
        """A rider (or a chunk's request) has a token only when its prefill finished in this plan
        (its last prompt token rode, or the chunk computed it)."""
        for r in (*plan.rides, *plan.chunks):
            req = self._reqs.get(r.id)
            if req is None or r.id not in outcome.tokens:
                continue
            if outcome.prefilled.get(r.id) != req.total - 1:
                what = "ride" if plan.rides else "prefill"
                raise ApiError(f"a token for request {r.id}, whose {what} reached {outcome.prefilled.get(r.id)} of its "
                               f"{req.total} tokens: a first token comes only from its last prompt token")

    def _check_prefilled(self, plan: Plan, prefilled: Mapping[int, int]) -> None:
        """The chunks (or rides) that ran are the plan's first ones, each after a finished prefill,
        each within its request's tokens."""
        order = [c.id for c in plan.chunks or plan.rides]
        ran = order[: len(prefilled)]
        if set(prefilled) != set(ran):
            raise ApiError(f"prefill outcomes for request(s) {sorted(prefilled)}: the plan's chunks run in the order {order}")
        for rid in ran:
            req, done = self._reqs[rid], prefilled[rid]
            if not req.done <= done <= req.total - 1:
                raise ApiError(f"request {rid} prefilled to {done}, outside [{req.done}, {req.total - 1}]")
        for rid, after in pairwise(ran):
            if prefilled[rid] != self._reqs[rid].total - 1:
                raise ApiError(f"request {after}'s chunk ran after request {rid}'s unfinished prefill")
