"""Var normalization for graph keys, the captured-graph handle, and the bounded cache of graphs
captured on demand.

A program's CUDA graph is keyed by (program, the vars that program actually reads): other vars
are not part of the key, whatever the caller passes for them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .errors import ApiError

__all__ = ["Graph", "GraphCache", "GraphCacheStats", "VarKey", "normalize_vars"]

T = TypeVar("T")

VarKey = tuple[tuple[str, int], ...]


def normalize_vars(
    program: str, bounds: Mapping[str, int], reads: frozenset[str], given: Mapping[str, int]
) -> VarKey:
    """The sorted (name, value) pairs of the vars `program` reads.

    Args:
        program: the program's name (for messages).
        bounds: every declared var's maximum (lower bound 1).
        reads: the vars the program reads.
        given: the caller's vars; names must be declared; unread ones are dropped.

    Raises:
        ApiError: an unknown var name, a read var missing, or a value outside [1, max].
    """
    for name in given:
        if name not in bounds:
            raise ApiError(f"unknown var {name!r}; declared vars: {sorted(bounds)}")
    out: list[tuple[str, int]] = []
    for name in sorted(reads):
        if name not in given:
            raise ApiError(f"program {program!r} reads var {name!r}; pass it (1..{bounds[name]})")
        value = given[name]
        if type(value) is not int or not 1 <= value <= bounds[name]:
            raise ApiError(f"var {name!r} = {value!r} is outside 1..{bounds[name]}")
        out.append((name, value))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Graph:
    """A captured, instantiated program: replay only with the vars it was captured at."""

    program: str
    key: VarKey
    exec_: Any
    launches: int


@dataclass(frozen=True, slots=True)
class GraphCacheStats:
    """What a program's graph cache did: replays from a cached graph, eager runs (a key's first
    sight), captures, and graphs destroyed to make room."""

    limit: int
    cached: int
    hits: int
    eager: int
    captures: int
    evictions: int


class GraphCache(Generic[T]):
    """The graphs of one program captured on demand, by vars key, least recently used out.

    A key is captured on its second use, so a one-off length (a long prompt's last chunk) costs
    no capture; the keys seen once are remembered up to `4 * limit`, oldest forgotten first. The
    decisions only: the runtime captures, replays and destroys.
    """

    def __init__(self, limit: int) -> None:
        if type(limit) is not int or limit < 1:
            raise ApiError(f"a graph cache holds at least 1 graph, got limit={limit!r}")
        self.limit = limit
        self._graphs: OrderedDict[VarKey, T] = OrderedDict()
        self._seen: OrderedDict[VarKey, None] = OrderedDict()
        self._hits = self._eager = self._captures = self._evictions = 0

    def lookup(self, key: VarKey) -> T | None:
        """The cached graph of `key` (now the most recently used), or None."""
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
            self._hits += 1
        return graph

    def wants(self, key: VarKey) -> bool:
        """After a miss: whether to capture `key` now (seen before) rather than run it eagerly
        (its first sight, remembered)."""
        if key in self._seen:
            del self._seen[key]
            return True
        self._seen[key] = None
        if len(self._seen) > 4 * self.limit:
            self._seen.popitem(last=False)
        self._eager += 1
        return False

    def insert(self, key: VarKey, graph: T) -> T | None:
        """Caches `graph` as `key`'s; returns the least recently used graph it displaced (for the
        caller to destroy), or None."""
        if key in self._graphs:
            raise ApiError(f"graph {dict(key)} is cached already")
        self._graphs[key] = graph
        self._captures += 1
        if len(self._graphs) <= self.limit:
            return None
        self._evictions += 1
        return self._graphs.popitem(last=False)[1]

    def drain(self) -> list[T]:
        """Every cached graph, the cache left empty (for the caller to destroy)."""
        out = list(self._graphs.values())
        self._graphs.clear()
        self._seen.clear()
        return out

    def stats(self) -> GraphCacheStats:
        return GraphCacheStats(self.limit, len(self._graphs), self._hits, self._eager, self._captures,
                               self._evictions)
