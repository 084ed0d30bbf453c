"""Per-call GPU times of one eager program run: a timing event between calls, the stream held
back by device work while the host enqueues, so the calls run back to back on the GPU."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

from . import _driver as drv
from . import memory
from ._program import Step

__all__ = ["HOLD_BYTES", "time_steps"]

HOLD_BYTES = 256 << 20
"""The scratch buffer whose memsets hold the stream back while the host enqueues the calls."""
_TRIES = 4


def _calls(steps: Sequence[Step]) -> list[tuple[str, list[Step]]]:
    """Steps grouped by call position (a call of several launches is one entry), in order."""
    out: list[tuple[str, list[Step]]] = []
    last = None
    for s in steps:
        if s.position != last:
            out.append((s.label, []))
            last = s.position
        out[-1][1].append(s)
    return out


def _events(stack: ExitStack, n: int) -> list[Any]:
    events = []
    for _ in range(n):
        ev = drv.event_create()
        stack.callback(drv.event_destroy, ev)
        events.append(ev)
    return events


def _enqueue(calls: list[tuple[str, list[Step]]], events: list[Any], stream: Any) -> float:
    """Records events[0], then each call followed by the next event; returns the host seconds."""
    t0 = time.perf_counter()
    drv.event_record(events[0], stream)
    for i, (_label, steps) in enumerate(calls):
        for s in steps:
            s.run()
        drv.event_record(events[i + 1], stream)
    return time.perf_counter() - t0


def _hold(ptr: int, count: int, stream: Any) -> None:
    for _ in range(count):
        drv.memset_async(ptr, HOLD_BYTES, stream)


def _run(steps: Sequence[Step]) -> None:
    for s in steps:
        s.run()


def time_steps(steps: Sequence[Step], stream: Any, before: Sequence[Step] = ()) -> tuple[list[tuple[str, float]], bool]:
    """Runs `before` then `steps` once per try (an untimed first one measures the host's enqueue
    time) and returns ((call label, GPU ms) per call, held): `held` is True when the GPU was still
    busy with the hold after the host had enqueued every call (no call waited for the host). The
    hold grows until that is so (at most a few tries). Synchronizes."""
    calls = _calls(steps)
    with ExitStack() as stack:
        scratch = memory.device(stack, HOLD_BYTES)
        events = _events(stack, len(calls) + 1)
        mark, hold_end = _events(stack, 2)
        drv.event_record(mark, stream)
        _hold(scratch.ptr, 1, stream)
        drv.event_record(hold_end, stream)
        drv.stream_synchronize(stream)
        memset_s = max(drv.event_elapsed_ms(mark, hold_end) / 1e3, 1e-6)
        _run(before)
        host_s = _enqueue(calls, events, stream)  # NOTE: untimed: measures the host's enqueue time
        drv.stream_synchronize(stream)
        held = False
        for _ in range(_TRIES):
            _run(before)
            _hold(scratch.ptr, math.ceil(2 * host_s / memset_s) + 1, stream)
            drv.event_record(hold_end, stream)
            host_s = max(host_s, _enqueue(calls, events, stream))
            held = not drv.event_query(hold_end)
            drv.stream_synchronize(stream)
            if held:
                break
            host_s *= 2
        times = [(label, drv.event_elapsed_ms(events[i], events[i + 1])) for i, (label, _s) in enumerate(calls)]
    return times, held
