"""`kern_runtime.Backend` without a model, for the engine's decisions on the CPU: kern_pool's Pool
and Host, the programs recorded, next tokens counted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import kern_pool

__all__ = ["PoolBackend"]


class PoolBackend:
    """kern_runtime.Backend without a model: 16 pages of 16 tokens, a host tier of 6 pages."""

    def __init__(self, pages: int = 16, host: int = 6) -> None:
        config = kern_pool.PoolConfig((kern_pool.PagedState("kv", 1 << 16),), (), 16, 64, chunk=2 << 20,
                                      chunks=pages // 2)
        self.pool, _ = kern_pool.Pool.create(config)
        self.host = kern_pool.Host(self.pool, host, 1, 1)
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

    def lease(self, tokens: int) -> kern_pool.Lease:
        return self.pool.lease(tokens)

    def retire(self, lease: kern_pool.Lease, length: int) -> kern_pool.Checkpoint:
        return self.pool.retire(lease, length)

    def checkpoint(self, lease: kern_pool.Lease, length: int) -> kern_pool.Checkpoint:
        return self.pool.checkpoint(lease, length)[0]

    def restore(self, cp: kern_pool.Checkpoint, length: int, tokens: int) -> kern_pool.Lease:
        return self.pool.restore(cp, length, tokens)[0]

    def fork(self, parent: kern_pool.Lease, length: int, tokens: int) -> kern_pool.Lease:
        return self.pool.fork(parent, length, tokens)[0]

    def park(self, cp: kern_pool.Checkpoint) -> kern_pool.Parked:
        return self.host.park(cp)[0]

    def wake_now(self, parked: kern_pool.Parked, length: int, tokens: int) -> kern_pool.Lease:
        return self.host.restore(parked, length, tokens)[0]

    def settle(self) -> None:
        pass

    def synchronize(self) -> None:
        pass
