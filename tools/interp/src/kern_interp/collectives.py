"""NCCL's collectives by their definitions, on the host, for tensor-parallel manifests on the
interpreter: `results` gives every rank's received values from every rank's send buffer, and
`Group` makes one interpreter per rank on threads of their own meet at each collective call (as
the ranks' streams meet in NCCL), so an engine per rank can drive them independently."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kern_manifest.expr import parse_expr

__all__ = ["Collective", "Group", "count_of", "results", "verb_of"]

Collective = Callable[[str, Sequence[Any], Mapping[str, int]], None]
"""A rank's collective call: its entry (`extern:nccl_<verb>_<dtype>`), its launch args
(`(send, offset)`, `(recv, offset)`, count, ...) and the program's vars."""


def _allreduce(sends: Sequence[np.ndarray], n: int, c: int) -> list[np.ndarray]:
    total = np.sum([s[:c] for s in sends], axis=0, dtype=np.float32)
    return [total for _ in range(n)]


def _allgather(sends: Sequence[np.ndarray], n: int, c: int) -> list[np.ndarray]:
    whole = np.concatenate([s[:c] for s in sends])
    return [whole for _ in range(n)]


def _reducescatter(sends: Sequence[np.ndarray], n: int, c: int) -> list[np.ndarray]:
    return [np.sum([s[r * c:(r + 1) * c] for s in sends], axis=0, dtype=np.float32) for r in range(n)]


def _alltoall(sends: Sequence[np.ndarray], n: int, c: int) -> list[np.ndarray]:
    return [np.concatenate([sends[p][r * c:(r + 1) * c] for p in range(n)]) for r in range(n)]


_VERBS = {"allreduce": _allreduce, "allgather": _allgather, "reducescatter": _reducescatter,
          "alltoall": _alltoall}


def verb_of(entry: str) -> str:
    """The collective an extern entry names (`extern:nccl_allreduce_bf16` -> `allreduce`)."""
    return entry.removeprefix("extern:nccl_").rsplit("_", 1)[0]


def count_of(raw: Any, env: Mapping[str, int]) -> int:
    """A collective's count arg: a number, or an expression over the program's vars."""
    return parse_expr(json.loads(json.dumps(raw))).eval(env) if isinstance(raw, dict) else int(raw)


def results(verb: str, sends: Sequence[np.ndarray], count: int) -> list[np.ndarray]:
    """What each rank receives from `sends` (one per rank, from each send offset on)."""
    return _VERBS[verb](sends, len(sends), count)


class Group:
    """`n` ranks whose interpreters run on threads of their own: `member(r)` is rank r's
    `Collective`. Each call waits until every rank has made its own (a barrier, `timeout` seconds
    at most: a rank that never comes breaks it for all), then writes the rank's received values."""

    def __init__(self, n: int, timeout: float = 60.0) -> None:
        self.n = n
        self.calls = 0
        """Collective calls completed (counted once for the group)."""
        self._sends: list[np.ndarray] = [np.empty(0, np.float32)] * n
        self._barrier = threading.Barrier(n, timeout=timeout)

    def member(self, rank: int) -> Collective:
        def collective(entry: str, args: Sequence[Any], env: Mapping[str, int]) -> None:
            (send, s_off), (recv, r_off), raw = args[0], args[1], args[2]
            count = count_of(raw, env)
            self._sends[rank] = np.array(send[s_off:], copy=True)
            self._barrier.wait()
            value = results(verb_of(entry), self._sends, count)[rank]
            if rank == 0:
                self.calls += 1
            self._barrier.wait()  # NOTE: no rank's next send replaces one a slower rank still reads
            recv[r_off:r_off + value.size] = value

        return collective
