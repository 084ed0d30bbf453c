"""`kern bench serve`: continuous batching throughput and latency, beside the same engine at one row.

The engine comes from the `kern serve` factory (`--backend`, default the GPU). First the engine at
one row: `--rounds` requests one after another through `Engine.turn`. Then, for each `--clients`
count, a fresh `kern_runtime.serving.Serving` on the same engine and that many clients in a closed
loop, each sending `--rounds` requests. Every request is the shared system prompt of `--system`
random ids, then a question of `--question` random ids drawn for it alone (no level finds another
level's questions in the prefix cache); `--max-tokens` tokens each, no stop id. Before the one-row
level one unmeasured request runs through the engine (it prefills the system prompt and builds the
step's graph), and before each client level as many unmeasured requests as clients run at once,
4 tokens each (the batched step's graphs of that many rows are built then), and before riding
levels one riding step at every graph bucket of the batched step (a riding step may take any row
count), so no level times a one-time cost. Reported per level: output tokens/s over the level's wall time, TTFT p50/p99 (submission
to the first token), TPOT p50/p99 (a request's mean time between tokens), and the output rate as a
multiple of the one-row rate. `--pipeline` picks how `Serving` runs its steps: `on` (a step of
unchanged rows issued before the one in flight is read back), `off` (each step read back before
the next is planned) or `both` (each client count measured both ways, off first, each on a fresh
`Serving` with its own warm-up). `--ride` picks how prompts are computed: `on` (they ride on the
batched step as rows of it, `ServingConfig.ride`; an engine without a batched step prefills them
apart), `off` (each prompt's own pass through the chunk program, as `kern serve` runs; the default) or
`both`. `--first-token` picks where a plain request's first token comes from: `head` (the head
program at the end of its prefill, sent at once, `ServingConfig.head`), `step` (the first decode
step after the plan's prefills; the default, as `kern serve` runs unless told) or `both`. Each level reports the
prompt tokens that rode (`Stats.ridden`) and the admissions that reused a cached prefix, of its
measured requests. The server is measured in process (no HTTP), so the numbers are the engine's
and the scheduler's. Every flag is checked before the engine loads: client counts (each 1..
`MAX_CLIENTS`, one thread a client), rounds (1..`MAX_ROUNDS`), a request's tokens (within `--capacity`), and the `--json` destination (a
write of no bytes: /dev/full is refused then, not after the run).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kern_cli.config import KernTomlError
from kern_cli.console import (
    Parser,
    add_version,
    fail,
    output_file_problem,
    positive_ints,
    run_handler,
)
from kern_cli.run import RunError

if TYPE_CHECKING:
    from kern_runtime import Engine

__all__ = ["MAX_CLIENTS", "MAX_ROUNDS", "Level", "build_parser", "main", "measure", "percentile"]

PROG = "kern bench serve"
MAX_CLIENTS = 1024
"""The most concurrent clients of a level: each is a thread, and `kern serve` runs 64 rows by default."""
MAX_ROUNDS = 10_000
"""The most requests per client (their prompts are drawn before a level starts)."""
_MODES: dict[str, tuple[bool, ...]] = {"on": (True,), "off": (False,), "both": (False, True)}
_FIRST: dict[str, tuple[bool, ...]] = {"head": (True,), "step": (False,), "both": (False, True)}
"""`--first-token` -> ServingConfig.head per level."""


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
    from kern_runtime import Sampling
    from kern_runtime.batch import buckets

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
        from kern_runtime.serving import Done, Request

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


WARM_TOKENS = 4
"""Tokens of each warm-up request of a client level."""


def _run_clients(serving: Any, clients: list[_Client], n: int, what: str) -> float:
    """Wall seconds of `clients` run at once against `serving`.

    Raises:
        RunError: a request was refused or failed.
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
        raise RunError(f"{n} clients{f' ({what})' if what else ''}: {errors[0]}")
    return wall


def measure(engine: Engine, clients: Sequence[int], *, system: int, question: int, max_tokens: int, rounds: int,
            rows: int, step_tokens: int, chunk: int, seed: int = 0, pipeline: Sequence[bool] = (True,),
            ride: Sequence[bool] = (False,), head: Sequence[bool] = (False,),
            log: Callable[[str], None] = lambda s: None) -> list[Level]:
    """The one-row level, then one level per client count, `ride`, `head` and `pipeline` mode (see
    the module doc).

    Raises:
        RunError: a request was refused or failed.
    """
    from kern_pool import SchedConfig
    from kern_runtime.serving import Serving, ServingConfig

    vocab = (engine.roles.token_max or 0) + 1
    need = max(clients) * rounds
    fresh = _Prompts(vocab, system, question, seed)
    one_row(engine, fresh(1), max_tokens)  # NOTE: warm-up, not measured
    base = one_row(engine, fresh(rounds), max_tokens)
    log(f"one row: {base.output_tok_s:.1f} tokens/s, TTFT p50 {base.ttft_p50_ms:.2f} ms")
    if any(ride):
        warm_rows(engine, vocab, seed)  # NOTE: warm-up, not measured
    out = [base]
    for n in clients:
        for riding, headed, piped in ((r, h, p) for r in ride for h in head for p in pipeline):
            sched = SchedConfig(rows=max(rows, 1), queued=max(need, 1), step_tokens=step_tokens, chunk=chunk)
            serving = Serving(engine, config=ServingConfig(sched, pipeline=piped, ride=riding, head=headed))
            serving.start()
            try:
                _run_clients(serving, [_Client([p], min(WARM_TOKENS, max_tokens)) for p in fresh(n)], n, "warm-up")
                before = serving.report()[0]
                mine = [_Client(fresh(rounds), max_tokens) for _ in range(n)]
                wall = _run_clients(serving, mine, n, "")
                after = serving.report()[0]
            finally:
                serving.close()
            rode = (serving.sched.config.ride > 0, after.ridden - before.ridden, after.hits - before.hits)
            level = _level(n, sum(c.tokens for c in mine), wall, [x for c in mine for x in c.ttft],
                           [x for c in mine for x in c.tpot], base.output_tok_s, piped, rode,
                           headed and engine.roles.head_program is not None)
            log(f"{n} clients{'' if piped else ' (steps in turn)'}{' riding' if rode[0] else ''}"
                f"{' first tokens from the head' if level.head else ''}: "
                f"{level.output_tok_s:.1f} tokens/s ({level.x_one_row:.1f}x one row), TTFT p50 "
                f"{level.ttft_p50_ms:.2f} ms, {level.ridden} prompt tokens rode")
            out.append(level)
    return out


def table(levels: Sequence[Level]) -> str:
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


def _check(args: argparse.Namespace) -> None:
    for name in ("system", "question", "max_tokens", "rounds"):
        if getattr(args, name) < 1:
            raise RunError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.rounds > MAX_ROUNDS:
        raise RunError(f"--rounds allows at most {MAX_ROUNDS}, got {args.rounds}")
    if args.json is not None and (problem := output_file_problem(args.json)) is not None:
        raise RunError(f"--json {problem}")


def _check_request(args: argparse.Namespace, capacity: int | None) -> None:
    """Refuses a request (system prompt, question, answer) longer than the KV pool.

    Raises:
        RunError: it does not fit.
    """
    need = args.system + args.question + args.max_tokens
    if capacity is not None and need > capacity:
        raise RunError(f"--system {args.system} + --question {args.question} + --max-tokens {args.max_tokens} "
                       f"= {need} tokens a request, past --capacity {capacity}")


def _handle(args: argparse.Namespace) -> int:
    from kern_cli import serve
    from kern_cli.run import runtime_input_errors
    from kern_runtime.errors import KernRuntimeError

    def log(msg: str) -> None:
        print(f"{PROG}: {msg}", file=sys.stderr, flush=True)

    try:
        clients = list(positive_ints("--clients", args.clients, RunError, MAX_CLIENTS))
        _check(args)
        opts = serve.resolve(args)
        _check_request(args, opts.load.capacity)
        levels = serve.with_engine(opts, log, lambda engine: measure(
            engine, clients, system=args.system, question=args.question, max_tokens=args.max_tokens,
            rounds=args.rounds, rows=opts.rows, step_tokens=opts.step_tokens, chunk=opts.chunk,
            pipeline=_MODES[args.pipeline], ride=_MODES[args.ride], head=_FIRST[args.first_token], log=log))
    except (RunError, KernTomlError, *runtime_input_errors()) as exc:
        return fail(PROG, str(exc))
    except KernRuntimeError as exc:
        fail(PROG, f"{type(exc).__name__}: {exc}")
        return 1
    print(table(levels))
    if args.json is not None:
        try:
            args.json.write_text(json.dumps([asdict(lv) for lv in levels], indent=2) + "\n")
        except OSError as exc:
            return fail(PROG, f"--json {args.json}: {exc.strerror or exc}")
    return 0


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The `kern bench serve` parser: the `kern serve` flags and the workload's."""
    from kern_cli import serve

    p = Parser(prog=prog, description=__doc__.splitlines()[0] if __doc__ else None)
    add_version(p, prog)
    serve.add_engine_flags(p)
    p.add_argument("--clients", default="1,8,32,64",
                   help=f"concurrent client counts, comma separated (each 1..{MAX_CLIENTS})")
    p.add_argument("--system", type=int, default=512, help="shared system prompt tokens (default 512)")
    p.add_argument("--question", type=int, default=32, help="each request's own prompt tokens (default 32)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default 128)")
    p.add_argument("--rounds", type=int, default=4, help=f"requests per client (default 4, at most {MAX_ROUNDS})")
    p.add_argument("--pipeline", choices=sorted(_MODES), default="on",
                   help="on: a step of unchanged rows issued before the one in flight is read back; off: steps in "
                        "turn; both: each client count both ways (default on)")
    p.add_argument("--ride", choices=sorted(_MODES), default="off",
                   help="on: prompts ride on the batched step as rows of it; off: each prompt prefills apart, as "
                        "kern serve does; both: each client count both ways (default off)")
    p.add_argument("--first-token", choices=sorted(_FIRST), default="step",
                   help="head: a plain request's first token from the head program at the end of its prefill, sent "
                        "at once; step: from the first decode step (kern serve's default); both: each client count "
                        "both ways (default step)")
    p.add_argument("--json", type=Path, help="write the levels as JSON here")
    p.set_defaults(handler=_handle, host="127.0.0.1", port=0, api_key=None, model=None, max_queued=1,
                   max_body=1, tokenizer=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`kern bench serve` (the dispatcher routes `kern bench serve ...` here)."""
    return run_handler(PROG, build_parser(), argv)
