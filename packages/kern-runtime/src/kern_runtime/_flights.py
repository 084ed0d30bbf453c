"""A serving's steps executed and not landed yet (`Flights`, each a `Flight`), oldest first, and
the engine pipeline whose steps are in flight among them."""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, field

from kern_pool import Plan

from ._pipeline import Pipeline
from .batch import Sampled

__all__ = ["Flight", "Flights"]


@dataclass(slots=True)
class Flight:
    """A step executed and not landed yet: its plan, how far each of its chunks that ran got, and
    its decode rows' results once read (None while its step is in a pipeline)."""

    plan: Plan
    prefilled: dict[int, int] = field(default_factory=dict[int, int])
    picked: list[Sampled] | None = None
    ids: tuple[int, ...] | None = None
    """The requests of `picked`, when not the plan's decode rows (a ride: its riders that
    sampled after them)."""
    heads: dict[int, int] = field(default_factory=dict[int, int])
    """The first token of each chunk's request the head program computed (sent already)."""
    head_stops: set[int] = field(default_factory=set[int])
    """Those of `heads` whose text then held a stop string."""


class Flights:
    """The steps in flight, oldest first; `pipe` is the pipeline of those whose rows' results
    are still on the device."""

    def __init__(self) -> None:
        self._queue: deque[Flight] = deque()
        self.pipe: Pipeline | None = None

    @property
    def newest(self) -> Flight | None:
        """The step executed last, None when none is in flight."""
        return self._queue[-1] if self._queue else None

    def add(self, plan: Plan, picked: list[Sampled] | None = None) -> Flight:
        """A step of `plan` in flight from now on (its results `picked`, when it has them)."""
        flight = Flight(plan, {}, picked)
        self._queue.append(flight)
        return flight

    def issue(self, plan: Plan) -> None:
        """The pipeline's next step (`plan`, the rows of the step in flight) issued behind it."""
        pipe = self.pipe
        assert pipe is not None and self._queue and plan.decode == self._queue[-1].plan.decode
        self._queue.append(Flight(plan))
        pipe.issue()

    def land(self) -> tuple[Flight, list[Sampled]]:
        """The oldest step, no longer in flight, and its rows' results (read back from the
        pipeline, which closes when it was the last one)."""
        flight = self._queue[0]
        picked = flight.picked
        if picked is None:
            assert self.pipe is not None
            picked = self.pipe.read()
        self._queue.popleft()
        if not self._queue and self.pipe is not None:
            self.pipe.close()
            self.pipe = None
        return flight, picked

    def drop(self) -> list[Plan]:
        """Every step's plan, none in flight any more (the pipeline closed, whatever it raises)."""
        plans = [f.plan for f in self._queue]
        self._queue.clear()
        if self.pipe is not None:
            with contextlib.suppress(Exception):
                self.pipe.close()
            self.pipe = None
        return plans
