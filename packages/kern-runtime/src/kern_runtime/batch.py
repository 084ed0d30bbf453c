"""Per-row sampling requests and results of the batched decode step, and its host-side row plan
(pure: which rows to seed, which block-table rows changed, the graph bucket)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .errors import EngineError
from .roles import RowRoles

__all__ = ["Sampled", "Sampling", "bucket", "buckets", "sampling_params"]

_SEED_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Sampling:
    """How one row picks its next token (on the GPU).

    Attributes:
        temperature: 0.0 is greedy (the argmax; top_k, top_p and seed unused); else the logits are
            divided by it before top-k, top-p and the draw.
        top_k: keep the k highest logits (ties kept); 0 is off.
        top_p: then keep the fewest highest-probability tokens whose mass reaches top_p (ties
            kept); 1.0 is off.
        seed: the draw's key with the token's position: the same seed and position give the same
            draw, alone or batched.
        logprobs: -1 none; 0 the chosen token's logprob; N > 0 also the N most likely tokens'
            (the model's distribution: log-softmax of the logits, no temperature, no masks).

    Raises:
        EngineError: a value out of range (one line saying which).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    logprobs: int = -1

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            raise EngineError(f"sampling: {problem}")

    @property
    def plain(self) -> bool:
        """Greedy with no logprobs: what the one-row step computes."""
        return self.temperature == 0.0 and self.logprobs == -1


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _problem(s: Sampling) -> str | None:
    if not _is_real(s.temperature) or s.temperature < 0:
        return f"temperature must be a finite number >= 0, got {s.temperature!r}"
    if not _is_int(s.top_k) or s.top_k < 0:
        return f"top_k must be an integer >= 0 (0: off), got {s.top_k!r}"
    if not _is_real(s.top_p) or not 0 < s.top_p <= 1:
        return f"top_p must be in (0, 1], got {s.top_p!r}"
    if not _is_int(s.seed) or not 0 <= s.seed <= _SEED_MAX:
        return f"seed must be an integer in [0, 2^63), got {s.seed!r}"
    if not _is_int(s.logprobs) or s.logprobs < -1:
        return f"logprobs must be an integer >= -1 (-1: none, 0: the chosen token, N: top-N too), got {s.logprobs!r}"
    return None


@dataclass(frozen=True, slots=True)
class Sampled:
    """One row's step: its token, that token's logprob (None unless asked) and the top-N
    (token, logprob) pairs, most likely first (empty unless asked)."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]


def buckets(max_rows: int) -> tuple[int, ...]:
    """The row counts the batched step is captured at: powers of two below max_rows, and max_rows."""
    out = [1 << i for i in range(max_rows.bit_length()) if 1 << i < max_rows]
    return (*out, max_rows)


def bucket(n: int, max_rows: int) -> int:
    """The smallest bucket that holds n rows (1 <= n <= max_rows)."""
    return next(b for b in buckets(max_rows) if b >= n)


def sampling_params(sampling: Sequence[Sampling], rows: RowRoles, pad: int) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """The `sampling` and `seed` inputs for the rows (then `pad` greedy rows).

    Raises:
        EngineError: logprobs above the manifest's top-N bound.
    """
    over = [s.logprobs for s in sampling if s.logprobs > rows.top_n]
    if over:
        raise EngineError(f"logprobs {over[0]} exceeds this manifest's top-N bound of {rows.top_n}")
    prm = np.zeros((len(sampling) + pad, rows.params), dtype=np.float32)
    prm[:, 1] = 1.0
    prm[:, 3] = -1.0
    for i, s in enumerate(sampling):
        prm[i, :4] = (s.temperature, s.top_p, s.top_k, s.logprobs)
    seeds = np.array([s.seed for s in sampling] + [0] * pad, dtype=np.int64)
    return prm, seeds
