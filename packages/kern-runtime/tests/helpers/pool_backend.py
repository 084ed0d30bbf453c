"""`kern_runtime.Backend` without a model, for the engine's decisions on the CPU: kern_pool's Pool
and Host, the programs recorded, next tokens counted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import kern_pool

__all__ = ["PoolBackend"]


class PoolBackend(kern_pool.PoolDevice):
    """kern_runtime.Backend without a model: 16 pages of 16 tokens, a host tier of 6 pages; its
    memory half is kern_pool's `PoolDevice`."""

    host: kern_pool.Host

    def __init__(self, pages: int = 16, host: int = 6) -> None:
        config = kern_pool.PoolConfig((kern_pool.PagedState("kv", 1 << 16),), (), 16, 64, chunk=2 << 20,
                                      chunks=pages // 2)
        pool, _ = kern_pool.Pool.create(config)
        super().__init__(pool, kern_pool.Host(pool, host, 1, 1))
        self.inputs: dict[str, list[int]] = {}
        self.runs: list[tuple[str, dict[str, int]]] = []
        self.eager: list[str] = []
        """The programs `run` (not `issue`d)."""
        self.next = 1000

    def write_input(self, name: str, array: Any) -> None:
        self.inputs[name] = np.asarray(array).tolist()

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        self.runs.append((program, dict(vars)))
        self.eager.append(program)

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        self.runs.append((program, dict(vars)))

    def read_output(self, name: str, count: int | None = None) -> np.ndarray:
        self.next += 1
        return np.array([self.next], dtype=np.int64)

    def synchronize(self) -> None:
        pass
