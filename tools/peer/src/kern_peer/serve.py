"""A serving peer nobody here wrote: transformers' continuous batching (its paged-attention
`ContinuousBatchingManager`, `model.init_continuous_batching`) on the workload of `kern bench
serve`, measured the same way.

The workload (`Workload`): a shared system prompt of `system` random ids, then per request a
question of `question` random ids drawn for it alone; `max_tokens` greedy tokens each, no stop id.
For each client count, that many clients in a closed loop each send `rounds` requests one after
another. Before the levels, as many unmeasured requests as the largest level has clients run at
once. Per level (`Level`): output tokens/s over the level's wall time, TTFT p50/p99 (submission to
the first streamed token), TPOT p50/p99 (a request's mean time between tokens after the first).

One collector thread reads every streamed output from the manager and wakes the request's client;
clients only submit and wait, so the timing does not depend on how the manager routes outputs.
No torch here: the caller makes the manager (kern_peer.serve_cli: `model.init_continuous_batching`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["Level", "Workload", "measure", "percentile", "prompts"]

WARM_SALT = 1 << 40
"""The warm-up wave's questions are drawn apart from every level's."""


@dataclass(frozen=True, slots=True)
class Workload:
    """What one run measures (`kern bench serve`'s flags of the same names)."""

    clients: tuple[int, ...]
    system: int = 512
    question: int = 32
    max_tokens: int = 128
    rounds: int = 4
    seed: int = 0
    vocab: int = 1000
    """Ids are drawn below this (every vocabulary has that many)."""


@dataclass(frozen=True, slots=True)
class Level:
    """One client count's measurement."""

    clients: int
    requests: int
    output_tokens: int
    wall_s: float
    output_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float

    def row(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; nan for no values."""
    if not values:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def prompts(w: Workload, count: int, salt: int) -> list[list[int]]:
    """`count` prompts: the shared system ids, then a question of its own (seeded by `salt`)."""
    rng = np.random.default_rng([w.seed, salt])
    system = [int(t) for t in np.random.default_rng(w.seed).integers(0, w.vocab, size=w.system)]
    return [system + [int(t) for t in rng.integers(0, w.vocab, size=w.question)] for _ in range(count)]


@dataclass
class _Flight:
    submitted: float
    done: threading.Event = field(default_factory=threading.Event)
    first: float = math.nan
    last: float = math.nan
    tokens: int = 0
    error: str | None = None


class _Collector:
    """Reads every output of the manager on one thread and records each request's times."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.flights: dict[str, _Flight] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def submit(self, ids: list[int], max_tokens: int) -> _Flight:
        with self.lock:
            flight = _Flight(time.perf_counter())
            rid = self.manager.add_request(input_ids=ids, max_new_tokens=max_tokens, streaming=True)
            self.flights[rid] = flight
        return flight

    def _loop(self) -> None:
        while not self.stop.is_set():
            out = self.manager.get_result(timeout=0.05)
            if out is None:
                continue
            now = time.perf_counter()
            with self.lock:
                flight = self.flights.get(out.request_id)
            if flight is None:
                continue
            n = len(out.generated_tokens)
            if n and math.isnan(flight.first):
                flight.first = now
            if n > flight.tokens:
                flight.tokens, flight.last = n, now
            if out.error is not None:
                flight.error = str(out.error)
            if out.is_finished():
                flight.done.set()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def _level(col: _Collector, w: Workload, clients: int, salt: int, timeout: float) -> Level:
    flights: list[_Flight] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for ids in prompts(w, w.rounds, salt * 100_003 + i):
            f = col.submit(ids, w.max_tokens)
            with lock:
                flights.append(f)
            if not f.done.wait(timeout):
                f.error = f"no answer within {timeout:.0f} s"
                return

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    failed = [f.error for f in flights if f.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(flights)} requests failed at {clients} clients: {failed[0]}")
    tokens = sum(f.tokens for f in flights)
    ttft = [(f.first - f.submitted) * 1e3 for f in flights]
    tpot = [(f.last - f.first) * 1e3 / (f.tokens - 1) for f in flights if f.tokens > 1]
    return Level(clients, len(flights), tokens, wall, tokens / wall, percentile(ttft, 50), percentile(ttft, 99),
                 percentile(tpot, 50), percentile(tpot, 99))


def measure(manager: Any, w: Workload, log: Callable[[str], None] = lambda s: None,
            timeout: float = 600.0) -> list[Level]:
    """Each client level of `w` through `manager` (a transformers `ContinuousBatchingManager`, or
    anything with its `start`, `add_request(input_ids=, max_new_tokens=, streaming=)`,
    `get_result(timeout=)` and `stop(block=)`), started here and stopped on return, after one
    unmeasured wave of as many requests as the largest level has clients.

    Raises:
        RuntimeError: a request failed or got no answer within `timeout` seconds.
    """
    manager.start()
    col = _Collector(manager)
    try:
        warm = max(w.clients)
        log(f"warm-up: {warm} requests at once")
        waves = [col.submit(ids, w.max_tokens) for ids in prompts(w, warm, salt=WARM_SALT)]
        for f in waves:
            f.done.wait(timeout)
        levels = []
        for i, clients in enumerate(w.clients):
            level = _level(col, w, clients, i, timeout)
            log(f"{clients} clients: {level.output_tok_s:.1f} tokens/s, TTFT p50 {level.ttft_p50_ms:.1f} ms")
            levels.append(level)
        return levels
    finally:
        col.close()
        manager.stop(block=True)
