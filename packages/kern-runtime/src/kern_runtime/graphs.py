"""Var normalization for graph keys, and the captured-graph handle.

A program's CUDA graph is keyed by (program, the vars that program actually reads): other vars
are not part of the key, whatever the caller passes for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ApiError

__all__ = ["Graph", "VarKey", "normalize_vars"]

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
