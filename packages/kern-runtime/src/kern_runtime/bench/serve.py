"""`kern bench serve`'s measurement: continuous batching throughput and latency, beside the same
engine at one row (`measure_levels`).

First the engine at one row: `rounds` requests one after another through `Engine.turn`. Then, for
each client count, a fresh `kern_runtime.serving.Serving` on the same engine and that many clients
in a closed loop, each sending `rounds` requests. Every request is the shared system prompt of
`system` random ids, then a question of `question` random ids drawn for it alone (no level finds
another level's questions in the prefix cache); `max_tokens` tokens each, no stop id. Before the
one-row level one unmeasured request runs through the engine (it prefills the system prompt and
builds the step's graph), and before each client level as many unmeasured requests as clients run
at once, `WARM_TOKENS` tokens each (the batched step's graphs of that many rows are built then),
and before riding levels one riding step at every graph bucket of the batched step (a riding step
may take any row count), so no level times a one-time cost. Reported per level (`Level`): output
tokens/s over the level's wall time, TTFT p50/p99 (submission to the first token), TPOT p50/p99 (a
request's mean time between tokens), and the output rate as a multiple of the one-row rate. Each
client count is measured once per combination of `ride` (prompts ride on the batched step as rows
of it, `ServingConfig.ride`), `head` (a plain request's first token from the head program,
`ServingConfig.head`) and `pipeline` (a step of unchanged rows issued before the one in flight is
read back), each on a fresh `Serving` with its own warm-up. Each level reports the prompt tokens
that rode (`Stats.ridden`) and the admissions that reused a cached prefix, of its measured
requests. The server is measured in process (no HTTP), so the numbers are the engine's and the
scheduler's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kern_pool import SchedConfig

from ..batch import Sampling, buckets
from .options import BenchError

if TYPE_CHECKING:
    from ..engine import Engine

__all__ = ["WARM_TOKENS", "Level", "levels_table", "measure_levels", "one_row", "percentile", "warm_rows"]

WARM_TOKENS = 4
"""Tokens of each warm-up request of a client level."""


@dataclass(frozen=True, slots=True)
class Level:
    """One measured level: clients (0: the engine at one row), requests, output tokens, wall
    seconds, output tokens/s, TTFT and TPOT percentiles (ms), the rate over the one-row rate,
    whether `Serving` kept a step in flight ahead of the one read back, whether prompts rode on the
    batched step, the prompt tokens that rode, the admissions that hit the prefix cache, and
    whether first tokens came from the head program."""

    clients: int
    requests: int
    tokens: int
    wall_s: float
    output_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    x_one_row: float
    pipelined: bool = False
    riding: bool = False
    ridden: int = 0
    hits: int = 0
    head: bool = False


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear), 0 for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


def _level(clients: int, tokens: int, wall: float, ttft: list[float], tpot: list[float], base: float,
           pipelined: bool = False, riding: tuple[bool, int, int] = (False, 0, 0), head: bool = False) -> Level:
    rate = tokens / wall if wall > 0 else 0.0
    return Level(clients, len(ttft), tokens, wall, rate, percentile(ttft, 50) * 1e3, percentile(ttft, 99) * 1e3,
                 percentile(tpot, 50) * 1e3, percentile(tpot, 99) * 1e3, rate / base if base else 1.0, pipelined,
                 *riding, head)


class _Prompts:
    """The shared system prompt and, per call, that many fresh questions after it."""

    def __init__(self, vocab: int, system: int, question: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.vocab, self.question = vocab, question
        self.shared = [int(x) for x in self.rng.integers(0, vocab, size=system)]

    def __call__(self, count: int) -> list[list[int]]:
        return [self.shared + [int(x) for x in self.rng.integers(0, self.vocab, size=self.question)]
                for _ in range(count)]


def warm_rows(engine: Engine, vocab: int, seed: int) -> None:
    """One `Engine.ride` step of a fresh prompt at every graph bucket of the batched step (none
    without one), so that no level captures a graph."""
    rows = engine.roles.rows
    if rows is None:
        return
    rng = np.random.default_rng(seed + 1)
    for b in buckets(rows.max_rows):
        seq = engine.sequence()
        engine.begin(seq, [int(x) for x in rng.integers(0, vocab, size=b)], 1)
        engine.ride([seq], [Sampling()], [b])
        engine.release(seq)


def one_row(engine: Engine, prompts: list[list[int]], max_tokens: int) -> Level:
    """The engine at one row: the prompts one after another through `Engine.turn`."""
    ttft: list[float] = []
    tpot: list[float] = []
    t0 = time.perf_counter()
    for p in prompts:
        seq = engine.sequence()
        turn = engine.turn(seq, p, max_tokens)
        engine.release(seq)
        ttft.append(turn.ttft_ms / 1e3)
        tpot.append(turn.decode_ms_per_token / 1e3)
    wall = time.perf_counter() - t0
    return _level(0, max_tokens * len(prompts), wall, ttft, tpot, 0.0, head=engine.roles.head_program is not None)


class _Client:
    """A closed-loop client: its requests one after another, each timed from its sink."""

    def __init__(self, prompts: list[list[int]], max_tokens: int) -> None:
        self.prompts, self.max_tokens = prompts, max_tokens
        self.ttft: list[float] = []
        self.tpot: list[float] = []
        self.tokens = 0
        self.error: str | None = None

    def run(self, serving: Any) -> None:
        from ..serving import Done, Request

        for p in self.prompts:
            ended = threading.Event()
            times: list[float] = []
            done: list[Done] = []

            def sink(ev: Any, times: list[float] = times, done: list[Done] = done, ended: threading.Event = ended) -> None:
                if isinstance(ev, Done):
                    done.append(ev)
                    ended.set()
                else:
                    times.append(time.perf_counter())

            t0 = time.perf_counter()
            answer = serving.submit(Request(p, self.max_tokens, sink))
            if not hasattr(answer, "ahead"):
                self.error = f"request refused: {answer}"
                return
            ended.wait()
            if done[0].finish is None:
                self.error = done[0].error
                return
            self.tokens += len(times)
            self.ttft.append(times[0] - t0)
            if len(times) > 1:
                self.tpot.append((times[-1] - times[0]) / (len(times) - 1))


def _run_clients(serving: Any, clients: list[_Client], n: int, what: str) -> float:
    """Wall seconds of `clients` run at once against `serving`.

    Raises:
        BenchError: a request was refused or failed.
    """
    threads = [threading.Thread(target=c.run, args=(serving,)) for c in clients]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    errors = [c.error for c in clients if c.error is not None]
    if errors:
        raise BenchError(f"{n} clients{f' ({what})' if what else ''}: {errors[0]}")
    return wall


@dataclass(frozen=True, slots=True)
class _Load:
    """What every client level shares: the prompts, their size, the one-row rate, the scheduler."""

    fresh: _Prompts
    rounds: int
    max_tokens: int
    base: float
    sched: SchedConfig


def measure_levels(engine: Engine, clients: Sequence[int], *, system: int, question: int, max_tokens: int,
                   rounds: int, rows: int, step_tokens: int, chunk: int, seed: int = 0,
                   pipeline: Sequence[bool] = (True,), ride: Sequence[bool] = (False,),
                   head: Sequence[bool] = (False,), log: Callable[[str], None] = lambda s: None) -> list[Level]:
    """The one-row level, then one level per client count, `ride`, `head` and `pipeline` mode (see
    the module doc).

    Raises:
        BenchError: a request was refused or failed.
    """
    vocab = (engine.roles.token_max or 0) + 1
    fresh = _Prompts(vocab, system, question, seed)
    one_row(engine, fresh(1), max_tokens)  # NOTE: warm-up, not measured
    base = one_row(engine, fresh(rounds), max_tokens)
    log(f"one row: {base.output_tok_s:.1f} tokens/s, TTFT p50 {base.ttft_p50_ms:.2f} ms")
    if any(ride):
        warm_rows(engine, vocab, seed)  # NOTE: warm-up, not measured
    sched = SchedConfig(rows=max(rows, 1), queued=max(max(clients) * rounds, 1), step_tokens=step_tokens, chunk=chunk)
    load = _Load(fresh, rounds, max_tokens, base.output_tok_s, sched)
    out = [base]
    for n in clients:
        for riding, headed, piped in ((r, h, p) for r in ride for h in head for p in pipeline):
            level = _client_level(engine, load, n, (piped, riding, headed))
            log(f"{n} clients{'' if piped else ' (steps in turn)'}{' riding' if level.riding else ''}"
                f"{' first tokens from the head' if level.head else ''}: "
                f"{level.output_tok_s:.1f} tokens/s ({level.x_one_row:.1f}x one row), TTFT p50 "
                f"{level.ttft_p50_ms:.2f} ms, {level.ridden} prompt tokens rode")
            out.append(level)
    return out


def _client_level(engine: Engine, load: _Load, n: int, mode: tuple[bool, bool, bool]) -> Level:
    """`n` clients on a fresh `Serving` in `mode` (pipelined, riding, head), after their warm-up."""
    from ..serving import Serving, ServingConfig

    piped, riding, headed = mode
    serving = Serving(engine, config=ServingConfig(load.sched, pipeline=piped, ride=riding, head=headed))
    serving.start()
    try:
        warm = [_Client([p], min(WARM_TOKENS, load.max_tokens)) for p in load.fresh(n)]
        _run_clients(serving, warm, n, "warm-up")
        before = serving.report()[0]
        mine = [_Client(load.fresh(load.rounds), load.max_tokens) for _ in range(n)]
        wall = _run_clients(serving, mine, n, "")
        after = serving.report()[0]
    finally:
        serving.close()
    rode = (serving.sched.config.ride > 0, after.ridden - before.ridden, after.hits - before.hits)
    return _level(n, sum(c.tokens for c in mine), wall, [x for c in mine for x in c.ttft],
                  [x for c in mine for x in c.tpot], load.base, piped, rode, headed and engine.roles.head_program is not None)


def levels_table(levels: Sequence[Level]) -> str:
    """The levels as a text table."""
    head = (f"{'clients':>8} {'tok/s':>10} {'x 1 row':>8} {'TTFT p50':>10} {'TTFT p99':>10} {'TPOT p50':>10} "
            f"{'TPOT p99':>10} {'prompts':>8} {'ridden':>8} {'hits':>6} {'steps':>9} {'first':>6}")
    lines = [head]
    for lv in levels:
        name = "1 row" if lv.clients == 0 else str(lv.clients)
        lines.append(f"{name:>8} {lv.output_tok_s:>10.1f} {lv.x_one_row:>8.2f} {lv.ttft_p50_ms:>8.2f}ms "
                     f"{lv.ttft_p99_ms:>8.2f}ms {lv.tpot_p50_ms:>8.3f}ms {lv.tpot_p99_ms:>8.3f}ms "
                     f"{'ride' if lv.riding else 'apart':>8} {lv.ridden:>8} {lv.hits:>6} "
                     f"{'pipelined' if lv.pipelined else 'in turn':>9} {'head' if lv.head else 'step':>6}")
    return "\n".join(lines)
