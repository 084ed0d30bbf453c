"""What an `Engine` calls on its backend: `Backend` (a `Runtime`'s sequence memory and program
calls, or a CPU interpreter's), and the protocols of what some backends can do besides (`Bound`,
`Fetching`, `Caching`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from numpy.typing import ArrayLike, NDArray

import kern_pool
from kern_pool import Checkpoint, Lease, Parked

__all__ = ["Backend", "Bound", "Caching", "Fetching", "launch"]


class Backend(Protocol):
    """What the engine calls: `Runtime`'s sequence memory and program calls (a CPU interpreter
    implements the same for tests)."""

    @property
    def pool(self) -> kern_pool.Pool: ...

    def lease(self, tokens: int) -> Lease: ...

    def retire(self, lease: Lease, length: int) -> Checkpoint: ...

    def checkpoint(self, lease: Lease, length: int) -> Checkpoint: ...

    def restore(self, checkpoint: Checkpoint, length: int, tokens: int) -> Lease: ...

    def fork(self, parent: Lease, length: int, tokens: int) -> Lease: ...

    def park(self, checkpoint: Checkpoint) -> Parked: ...

    def wake_now(self, parked: Parked, length: int, tokens: int) -> Lease: ...

    def settle(self) -> None: ...

    def write_input(self, name: str, array: ArrayLike) -> None: ...

    def run(self, program: str, vars: Mapping[str, int]) -> None: ...

    def issue(self, program: str, vars: Mapping[str, int]) -> None: ...

    def read_output(self, name: str, count: int | None = None) -> NDArray[Any]: ...

    def synchronize(self) -> None: ...


@runtime_checkable
class Bound(Protocol):
    """A backend on a CUDA context (`Runtime`): a thread that drives it makes the context current
    first (`make_current`)."""

    def make_current(self) -> None: ...


@runtime_checkable
class Fetching(Protocol):
    """A backend that can read an output back without waiting for later work (`Runtime`'s
    `fetch_output` / `fetched`); the engine's pipelined steps use it when the backend has it."""

    def fetch_output(self, name: str, count: int | None = None) -> Any: ...

    def fetched(self, fetch: Any) -> NDArray[Any]: ...


@runtime_checkable
class Caching(Protocol):
    """A backend that replays programs it declares no graph for from graphs it captures on demand
    (`Runtime.cache_graphs`); the engine's short prefill chunks use it when the backend has it."""

    def cache_graphs(self, program: str, limit: int) -> None: ...


def launch(backend: Backend, program: str, vars: Mapping[str, int], eager: bool) -> None:
    """Run `program` call by call (`eager`) or issue it (its graph where it has one)."""
    if eager:
        backend.run(program, vars)
    else:
        backend.issue(program, vars)
