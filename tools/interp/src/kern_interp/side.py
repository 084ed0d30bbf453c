"""The interpreter as a side of `kern test` (`kern_runtime.abtest`): `InterpSide` is the slice of
`Runtime` the harness drives over an `Interp`, and `InterpLoader` makes A and B of two manifests
over one checkpoint's tensors (B takes A's tensors as its resident weights).

The interpreter holds every float in float32, the `kv` state too: `read_state` gives the state's
float32 elements that the manifest's byte range covers (4 bytes per element, whatever the
manifest's element size), so two interpreter sides compare alike; `read_workspace` gives a
buffer's float32 elements too. `time_calls` times the whole
program as one call, on the host.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from kern_manifest import Manifest

from .qwen3 import Interp

__all__ = ["InterpLoader", "InterpSide"]


class InterpSide:
    """An `Interp` driven like a `kern_runtime.Runtime` (one side of an A/B test)."""

    def __init__(self, machine: Interp) -> None:
        self.machine = machine

    def write_input(self, name: str, array: Any) -> None:
        self.machine.write_input(name, np.asarray(array))

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        self.machine.run(program, vars)

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        self.machine.run(program, vars)

    def read_output(self, name: str, count: int | None = None) -> np.ndarray:
        out = self.machine.read_output(name)
        return out if count is None else out[:count]

    def read_workspace(self, name: str, count: int) -> np.ndarray:
        return self.machine.mem[name][:count].copy()

    def synchronize(self) -> None:
        pass

    def time_calls(self, program: str, vars: Mapping[str, int], *,
                   before: str | None = None) -> tuple[list[tuple[str, float]], bool]:
        if before is not None:
            self.machine.run(before, {})
        t0 = time.perf_counter()
        self.machine.run(program, vars)
        return [(program, (time.perf_counter() - t0) * 1e3)], True

    def zero_states(self) -> None:
        self.machine.kv[:] = 0

    def read_state(self, name: str, start: int, nbytes: int) -> np.ndarray:
        if name != "kv":
            raise KeyError(f"the interpreter holds the state kv only, not {name!r}")
        elem = self.machine.kv_elem
        return self.machine.kv[start // elem : (start + nbytes) // elem].view(np.uint8).copy()

    def into_resident(self) -> object:
        return self.machine.tensors

    def close(self) -> None:
        pass


class InterpLoader:
    """A and B on the interpreter (`read_manifest`'s models, or generated manifests' plain JSON):
    `reference()` over `tensors`, `candidate(resident)` over the tensors A handed over."""

    def __init__(self, a: Manifest | Mapping[str, Any], b: Manifest | Mapping[str, Any],
                 tensors: Mapping[str, np.ndarray], capacity: int) -> None:
        self.a, self.b, self.tensors, self.capacity = a, b, tensors, capacity

    def reference(self) -> InterpSide:
        return InterpSide(Interp(self.a, self.tensors, self.capacity))

    def candidate(self, resident: object) -> InterpSide:
        assert resident is self.tensors
        return InterpSide(Interp(self.b, self.tensors, self.capacity))
