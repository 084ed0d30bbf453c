"""What every part of a runtime shares: its `Spec` (the manifest and what it was loaded as) and its
`Device` (the context, the stream, the stack everything is released on, whether it is closed)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from kern_manifest import Manifest
from kern_pool import Capacity

from . import _driver as drv
from ._peering import Needs, check_ranks, program_needs
from .errors import ApiError

__all__ = ["Device", "Spec", "capacity_tokens"]


def capacity_tokens(cap: Capacity) -> int | None:
    """The tokens a runtime sizes its states for (None: all free memory); the one-line caller
    error where the capacity cannot be met."""
    if not isinstance(cap, Capacity):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ApiError(f"capacity must be a kern_runtime.Capacity, got {type(cap).__name__}")
    tokens_ok = cap.tokens is None or (type(cap.tokens) is int and cap.tokens >= 1)
    if not tokens_ok or type(cap.seqs) is not int or cap.seqs < 1:
        raise ApiError(f"capacity needs tokens >= 1 (or None: all free memory) and seqs >= 1, got {cap}")
    return cap.tokens


@dataclass(frozen=True, slots=True)
class Spec:
    """A verified manifest as one rank loads it: gpu, capacity, ranks, and what each program reads
    and needs connected."""

    manifest: Manifest
    gpu: int
    capacity: Capacity
    tokens: int | None
    ranks: dict[str, int]
    needs: dict[str, Needs]
    reads: dict[str, frozenset[str]]
    bounds: Mapping[str, int]

    @classmethod
    def of(cls, manifest: Manifest, gpu: int, capacity: Capacity, ranks: Mapping[str, int]) -> Spec:
        """Checks the capacity, then the ranks (ApiError)."""
        tokens = capacity_tokens(capacity)
        return cls(
            manifest=manifest,
            gpu=gpu,
            capacity=capacity,
            tokens=tokens,
            ranks=check_ranks(manifest, dict(ranks)),
            needs={name: program_needs(manifest, name) for name in manifest.programs},
            reads={name: manifest.program_vars(name) for name in manifest.programs},
            bounds=manifest.var_max,
        )

    @property
    def nccl_groups(self) -> set[str]:
        """The topology groups some program runs collectives over."""
        return {g for n in self.needs.values() for g in n.groups}


@dataclass(slots=True)
class Device:
    """One runtime's context and compute stream; everything it allocates is released on `stack`."""

    ordinal: int
    stack: ExitStack = field(default_factory=ExitStack)
    dev: Any = None
    ctx: Any = None
    stream: Any = None
    arch: int = 0
    closed: bool = False

    def open(self) -> None:
        """Retains the primary context and makes the stream (ApiError: no such gpu)."""
        drv.init()
        if not 0 <= self.ordinal < drv.device_count():
            raise ApiError(f"gpu {self.ordinal} does not exist ({drv.device_count()} devices)")
        self.dev = drv.device(self.ordinal)
        self.ctx = drv.primary_context(self.dev)
        self.stack.callback(drv.release_primary_context, self.dev)
        self.stream = drv.stream_create()
        self.stack.callback(drv.stream_destroy, self.stream)
        major, minor = drv.compute_capability(self.dev)
        self.arch = major * 10 + minor

    def live(self) -> None:
        """Raises ApiError once the runtime is closed."""
        if self.closed:
            raise ApiError("this runtime is closed")
