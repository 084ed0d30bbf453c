"""What a `Serving` measures (`Meter`): its counters and the TTFT and TPOT histograms (`Stats`,
`Histogram` over `BUCKETS`), and the gauges read on the engine thread between steps (queue,
rows, sequences, pages, prefix entries, host units, tokens per second over `RATE_WINDOW_S`)."""

from __future__ import annotations

import bisect
import copy
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import kern_pool
from kern_pool import Scheduler, Tier

from .errors import ApiError

if TYPE_CHECKING:
    from ._leases import Sequence
    from .engine import Engine

__all__ = ["BUCKETS", "RATE_WINDOW_S", "Histogram", "Meter", "Stats"]

RATE_WINDOW_S = 5.0
"""The window of the tokens-per-second gauge."""

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
    ahead: int = 0
    """Steps issued before the step in flight was read back."""
    stale: int = 0
    """Tokens of rows that had ended when their step landed (dropped)."""
    ridden: int = 0
    """Prompt tokens computed as rows of the batched step."""
    ttft: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)


class Meter:
    """A serving's `Stats` and gauges, guarded by the serving's lock (the scheduler's)."""

    def __init__(self, lock: threading.Lock) -> None:
        self.stats = Stats()
        self._lock = lock
        self._window: deque[tuple[float, int]] = deque()
        self._gauges: dict[str, float] = {}

    def admitted(self, prompt: int, reused: int) -> None:
        """A request admitted with `prompt` tokens, `reused` of them from the cache."""
        with self._lock:
            self.stats.admissions += 1
            self.stats.hits += reused > 0
            self.stats.prompt += prompt
            self.stats.reused += reused

    def emitted(self, now: float, count: int, samples: list[tuple[bool, float]]) -> None:
        """`count` tokens sent at `now`, with their (TTFT?, seconds) samples."""
        with self._lock:
            self.stats.generated += count
            for ttft, value in samples:
                (self.stats.ttft if ttft else self.stats.tpot).observe(value)
        self._window.append((now, count))

    def measure(self, sched: Scheduler, engine: Engine, seqs: Iterable[Sequence]) -> None:
        """The gauges, read on the engine thread between steps (`seqs`: the requests' sequences)."""
        now = time.perf_counter()
        while self._window and self._window[0][0] < now - RATE_WINDOW_S:
            self._window.popleft()
        pool = engine.backend.pool
        leased = sum(len(s.lease.pages) for s in seqs if s.lease is not None)
        gauges = {
            "queue_depth": float(sched.queued), "running_rows": float(sched.running),
            "open_sequences": float(len(engine.sequences)), "leased_pages": float(leased),
            "pool_pages_used": float(pool.pages_used), "pool_pages_total": float(pool.pages_max),
            "prefix_resident": float(engine.prefix.count(Tier.RESIDENT)),
            "prefix_parked": float(engine.prefix.count(Tier.PARKED)),
            "tokens_per_second": sum(n for _, n in self._window) / RATE_WINDOW_S,
        }
        host = _host(engine)
        if host is not None:
            gauges["host_units_used"], gauges["host_units_total"] = float(host[0]), float(host[1])
        with self._lock:
            self._gauges = gauges

    def snapshot(self) -> dict[str, float]:
        """The gauges as of the last `measure`."""
        with self._lock:
            return dict(self._gauges)

    def report(self) -> tuple[Stats, dict[str, float]]:
        """A copy of the stats, and the gauges."""
        with self._lock:
            st = copy.deepcopy(self.stats)
            return st, dict(self._gauges)


def _host(engine: Engine) -> tuple[int, int] | None:
    """(used, total) units of the engine's host tier, None without one."""
    if not engine.config.park:
        return None
    try:
        host: kern_pool.Host = getattr(engine.backend, "host")  # noqa: B009
    except (AttributeError, ApiError, AssertionError):
        return None
    return host.used, host.used + host.free
