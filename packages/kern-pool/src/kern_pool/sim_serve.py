"""`kern-pool-sim serve`: replay a serving workload through `kern_pool.Scheduler`, in steps.

Requests arrive at seeded exponential gaps (`--rate` per step on average), each a shared system
prompt (one of `--prefixes`, `--prefix-len` tokens) and its own question (`--prompt-min`..
`--prompt-max` tokens), asking for `--output-min`..`--output-max` tokens. Each step the scheduler's
plan runs on a model engine: the prefill chunks run one sequence after another, each computing
past its cached prefix up to its budget and what the step's budget has left (a system prompt is
cached once a request holding it has prefilled past it, so a request admitted after it in the
same step reuses it), the next admitted only when the one before finished its prefill; each
decode row makes one token. With `--ride R` the prompts ride on the decode step instead (R rows a
step, `kern_pool.run_rides`): each rider's tokens past its cached prefix, the row of its last
prompt token giving its first token. With `--head 1` a prompt's first token comes with the chunk
that finishes its prefill (the engine's head program) instead of the next decode step. Measured in steps: the queue wait (arrival to admission), TTFT (arrival to the first
token), TPOT (a request's steps per token after the first), the rows per step, the refusals and
the parks (a parked request's KV comes back whole when it resumes: the engine parks it to the host
tier and wakes it). The same arguments give the same figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kern_pool.errors import PoolError
from kern_pool.sched import (
    Ask,
    Outcome,
    Plan,
    Refused,
    SchedConfig,
    Scheduler,
    run_chunks,
    run_rides,
)
from kern_pool.sim import Parser, SimError, SplitMix64, clip, flag, output_problem, table

__all__ = ["ServeFigures", "ServeWorkload", "main", "replay"]

PROG = "kern-pool-sim serve"
MAX_REQUESTS = 1 << 20
MAX_STEPS = 1 << 24
"""A replay that has not drained after this many steps stops with an error."""


@dataclass(frozen=True, slots=True)
class ServeWorkload:
    """The replayed service: arrivals, lengths, the scheduler's limits and the pool."""

    seed: int = 0
    requests: int = 1000
    rate: float = 0.5
    prefixes: int = 4
    prefix_len: int = 512
    prompt_min: int = 16
    prompt_max: int = 256
    output_min: int = 16
    output_max: int = 256
    rows: int = 64
    queued: int = 1024
    step_tokens: int = 512
    chunk: int = 512
    grow: int = 0
    ride: int = 0
    head: int = 0
    pages: int = 4096
    unit: int = 16

    def check(self) -> None:
        """Raises SimError naming the first bad knob."""
        for name in ServeWorkload.__dataclass_fields__:
            value = getattr(self, name)
            if name == "rate":
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                    raise SimError(f"--rate must be a positive finite number, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise SimError(f"{flag(name)} must be an integer, got {value!r}")
            low = 0 if name in ("seed", "prefix_len", "grow", "ride", "head") else 1
            if value < low:
                raise SimError(f"{flag(name)} must be at least {low}, got {value}")
        if self.head > 1:
            raise SimError(f"--head is 0 (first tokens from the step) or 1 (from the prefill), got {self.head}")
        if self.requests > MAX_REQUESTS:
            raise SimError(f"--requests {self.requests} is over {MAX_REQUESTS}")
        if self.prompt_min > self.prompt_max or self.output_min > self.output_max:
            raise SimError("--prompt-min/--output-min must not exceed --prompt-max/--output-max")


@dataclass(slots=True)
class ServeFigures:
    """What a replay measured (in steps; the JSON keys)."""

    requests: int = 0
    finished: int = 0
    refused: int = 0
    steps: int = 0
    tokens: int = 0
    parks: int = 0
    rows_mean: float = 0.0
    queue_p50: float = 0.0
    queue_p99: float = 0.0
    ttft_p50: float = 0.0
    ttft_p99: float = 0.0
    tpot_p50: float = 0.0
    tpot_p99: float = 0.0
    prefix_hits: int = 0
    ridden: int = 0
    """Prompt tokens computed as rows of the decode step."""


@dataclass(slots=True)
class _Req:
    arrival: int
    prefix: int
    total: int
    output: int
    admitted: int | None = None
    first: int | None = None
    last: int = 0
    made: int = 0


@dataclass(slots=True)
class _Replay:
    w: ServeWorkload
    sched: Scheduler
    reqs: list[_Req]
    cached: set[int] = field(default_factory=set[int])
    kv: dict[int, int] = field(default_factory=dict[int, int])
    totals: dict[int, int] = field(default_factory=dict[int, int])
    figures: ServeFigures = field(default_factory=ServeFigures)
    rows: int = 0

    def step(self, now: int) -> Plan:
        plan = self.sched.plan()
        for rid in plan.park:
            self.kv.pop(rid, None)
            self.figures.parks += 1
        for r in plan.retire:
            self.kv.pop(r.id, None)
            self.figures.finished += 1
        done, sampled = self._ride(plan, now) if plan.rides else (self._prefill(plan, now), ())
        if self.w.head and not plan.rides:
            sampled = [rid for rid, kv in done.items() if kv == self.totals[rid] - 1 and self.reqs[rid].made == 0]
        tokens = {rid: 1 for rid in (*plan.decode, *sampled)}
        for rid in tokens:
            req = self.reqs[rid]
            req.first = now if req.first is None else req.first
            req.last, req.made = now, req.made + 1
        self.figures.tokens += len(tokens)
        self.rows += len(plan.decode)
        self.sched.commit(plan, Outcome(done, tokens))
        return plan

    def _admit(self, rid: int, total: int, now: int) -> None:
        req = self.reqs[rid]
        self.totals[rid] = total
        if req.admitted is not None:  # resumed: its KV was parked, all of it comes back
            self.kv[rid] = total - 1
            return
        req.admitted = now
        self.kv[rid] = 0
        if req.prefix in self.cached and self.w.prefix_len:
            self.figures.prefix_hits += 1
            self.kv[rid] = min(self.w.prefix_len, total - 1)

    def _prefill(self, plan: Plan, now: int) -> dict[int, int]:
        """The plan's chunks in turn (`run_chunks`); how far each one that ran got."""
        return run_chunks(plan, lambda a: self._admit(a.id, a.tokens, now), self._chunk)

    def _ride(self, plan: Plan, now: int) -> tuple[dict[int, int], list[int]]:
        """The plan's rides in turn (`run_rides`): how far each got (its last prompt token not
        counted), and the riders whose last prompt token rode (they have their first token)."""
        took = run_rides(plan, lambda a: self._admit(a.id, a.tokens, now), lambda rid: self.totals[rid] - self.kv[rid])
        sampled = [rid for rid, n in took.items() if self.kv[rid] + n == self.totals[rid]]
        for rid, n in took.items():
            self.kv[rid] = min(self.totals[rid] - 1, self.kv[rid] + n)
            if self.kv[rid] >= self.w.prefix_len:
                self.cached.add(self.reqs[rid].prefix)
        self.figures.ridden += sum(took.values())
        return {rid: self.kv[rid] for rid in took}, sampled

    def _chunk(self, rid: int, budget: int) -> tuple[int, int, bool]:
        """`budget` more tokens of `rid`'s prefill; a request past the system prompt caches it."""
        total, start = self.totals[rid], self.kv[rid]
        self.kv[rid] = min(total - 1, start + budget)
        if self.kv[rid] >= self.w.prefix_len:
            self.cached.add(self.reqs[rid].prefix)
        return self.kv[rid] - start, self.kv[rid], self.kv[rid] >= total - 1


def _arrivals(w: ServeWorkload) -> list[_Req]:
    rng = SplitMix64(w.seed)
    t = 0.0
    out: list[_Req] = []
    for _ in range(w.requests):
        t += -math.log(1.0 - rng.uniform()) / w.rate
        prompt = w.prefix_len + rng.between(w.prompt_min, w.prompt_max)
        out.append(_Req(int(t), rng.between(0, w.prefixes - 1), prompt, rng.between(w.output_min, w.output_max)))
    return out


def _pct(values: list[int] | list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))


def replay(w: ServeWorkload) -> ServeFigures:
    """Replay `w` through a Scheduler until every request ended.

    Raises:
        SimError: a bad knob, or the replay did not drain within MAX_STEPS steps.
    """
    w.check()
    sched = Scheduler(SchedConfig(w.rows, w.queued, w.step_tokens, w.chunk, w.grow, w.ride), pages=w.pages, unit=w.unit,
                      row_tokens=w.pages * w.unit)
    r = _Replay(w, sched, _arrivals(w))
    nxt, now = 0, 0
    while nxt < len(r.reqs) or sched.queued or sched.running:
        while nxt < len(r.reqs) and r.reqs[nxt].arrival <= now:
            req = r.reqs[nxt]
            if isinstance(sched.submit(Ask(nxt, req.total, req.output)), Refused):
                r.figures.refused += 1
            nxt += 1
        r.step(now)
        now += 1
        if now > MAX_STEPS:
            raise SimError(f"the replay did not drain in {MAX_STEPS} steps: raise --pages or --rows")
    return _figures(r, now)


def _figures(r: _Replay, steps: int) -> ServeFigures:
    f = r.figures
    served = [q for q in r.reqs if q.first is not None and q.admitted is not None]
    f.requests, f.steps = len(r.reqs), steps
    f.rows_mean = r.rows / steps if steps else 0.0
    queue = [q.admitted - q.arrival for q in served if q.admitted is not None]
    ttft = [q.first - q.arrival for q in served if q.first is not None]
    tpot = [(q.last - q.first) / (q.made - 1) for q in served if q.first is not None and q.made > 1]
    f.queue_p50, f.queue_p99 = _pct(queue, 50), _pct(queue, 99)
    f.ttft_p50, f.ttft_p99 = _pct(ttft, 50), _pct(ttft, 99)
    f.tpot_p50, f.tpot_p99 = _pct(tpot, 50), _pct(tpot, 99)
    return f


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    defaults = ServeWorkload()
    for name in ServeWorkload.__dataclass_fields__:
        value = getattr(defaults, name)
        p.add_argument(flag(name), type=type(value), default=value, metavar=type(value).__name__.upper(),
                       help=f"(default {value})")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the figures as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`kern-pool-sim serve ...`: replay, print the figures, optionally write `--json FILE`."""
    args = _parser().parse_args(argv)
    w = ServeWorkload(**{k: getattr(args, k) for k in ServeWorkload.__dataclass_fields__})
    problem = output_problem(args.json) if args.json is not None else None
    if problem is not None:
        print(f"{PROG}: --json {problem}", file=sys.stderr)
        return 2
    try:
        figures = replay(w)
    except PoolError as exc:
        print(f"{PROG}: {clip(str(exc))}", file=sys.stderr)
        return 2
    print(table(figures, digits=2))
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(asdict(figures), indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            print(f"{PROG}: --json {args.json}: cannot write ({exc.strerror or exc})", file=sys.stderr)
            return 2
    return 0
