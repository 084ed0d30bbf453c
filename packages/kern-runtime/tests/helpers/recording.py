"""A recording fake of the runtime's row slice (no GPU)."""

from __future__ import annotations

from typing import Any

import numpy as np


class FakeRuntime:
    """The slice of Runtime a row uses; records every call, answers next tokens 100, 101, ..."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.inputs: dict[str, np.ndarray] = {}
        self.next = 100
        self.closed = False

    def write_input(self, name: str, array: Any) -> None:
        self.inputs[name] = np.asarray(array).copy()
        self.calls.append(("write", name, self.inputs[name].tolist()))

    def run(self, program: str, vars: dict[str, int]) -> None:
        self.calls.append(("run", program, dict(vars)))

    def issue(self, program: str, vars: dict[str, int]) -> None:
        self.calls.append(("issue", program, dict(vars)))

    def read_output(self, name: str) -> np.ndarray:
        self.next += 1
        return np.array([self.next - 1], dtype=np.int64)

    def summary(self) -> str:
        return "fake runtime"

    def load_weights(self, *args: object, **kw: object) -> None:
        self.calls.append(("load_weights",))

    def close(self) -> None:
        self.closed = True
