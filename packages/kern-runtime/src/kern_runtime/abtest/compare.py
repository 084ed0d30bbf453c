"""Per-row statistics of A's and B's logits, and the byte comparisons of their outputs and states.

Everything here is numpy on the host. Softmaxes are float64 over the token ids whose logit is
finite in A; a row where B is not finite where A is has KL = inf. A state is compared in 64-byte
blocks: A's write set is the blocks A left non-zero (every run starts from zeroed states), and B's
bytes outside it are B's non-zero bytes in the other blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "BLOCK_BYTES",
    "NOISE_KL_FACTOR",
    "TOP_K",
    "RowStats",
    "bits_equal",
    "off_top",
    "out_of_domain",
    "outside_bytes",
    "row_stats",
    "values_equal",
    "within_noise",
    "written_blocks",
]

TOP_K = 20
"""The top-k sets whose overlap is counted per row."""
BLOCK_BYTES = 64
"""The unit of a state's write set."""
NOISE_KL_FACTOR = 2.0
"""The noise band's KL bound over the noise pass's largest row KL. For small differences KL grows
with the square of the logit error, so twice the KL is a logit error sqrt(2) times the noise pass's:
what a candidate rounding at its own points (a fused or re-tiled kernel) adds to a re-chunking's."""


@dataclass(frozen=True, slots=True)
class RowStats:
    """Statistics of B's rows against A's, one entry per row (a row: one position's logits).

    Attributes:
        kl: KL(A || B) in nats (inf where B is not finite where A is).
        agree: whether the argmaxes agree.
        margin: A's top-1 logit less its top-2.
        rank: how many of B's logits exceed B's logit of A's top token (0: B's top too).
        overlap: how many of A's top-20 token ids are in B's top-20.
        nonfinite: B's logits that are not finite where A's are.
        shift: the largest |B - A| over A's top-20 logits (inf where one of B's is not finite).
    """

    kl: NDArray[np.float64]
    agree: NDArray[np.bool_]
    margin: NDArray[np.float64]
    rank: NDArray[np.int64]
    overlap: NDArray[np.int64]
    nonfinite: NDArray[np.int64]
    shift: NDArray[np.float64]

    @property
    def rows(self) -> int:
        """The number of rows."""
        return len(self.kl)

    def flips(self, above: float) -> NDArray[np.bool_]:
        """Rows whose argmax flips while KL(A || B) exceeds `above`."""
        return ~self.agree & (self.kl > above)

    @staticmethod
    def concat(parts: Sequence[RowStats]) -> RowStats:
        """The rows of `parts` in order (no rows for no parts)."""
        def cat(name: str, dtype: Any) -> NDArray[Any]:
            arrays = [getattr(p, name) for p in parts]
            return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)

        return RowStats(cat("kl", np.float64), cat("agree", np.bool_), cat("margin", np.float64),
                        cat("rank", np.int64), cat("overlap", np.int64), cat("nonfinite", np.int64),
                        cat("shift", np.float64))


def _log_softmax(x: NDArray[np.float64]) -> NDArray[np.float64]:
    top = np.max(x, axis=1, keepdims=True)
    shifted = x - top
    return shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))


def _overlap(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.int64]:
    k = min(TOP_K, a.shape[1])
    top_a = np.argpartition(-a, k - 1, axis=1)[:, :k]
    top_b = np.argpartition(-b, k - 1, axis=1)[:, :k]
    marked = np.zeros(a.shape, dtype=bool)
    rows = np.arange(a.shape[0])[:, None]
    marked[rows, top_a] = True
    return marked[rows, top_b].sum(axis=1).astype(np.int64)


def _shift(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    k = min(TOP_K, a.shape[1])
    top_a = np.argpartition(-a, k - 1, axis=1)[:, :k]
    rows = np.arange(a.shape[0])[:, None]
    with np.errstate(invalid="ignore"):
        moved = np.abs(b[rows, top_a] - a[rows, top_a])
    return np.where(np.isfinite(a[rows, top_a]), np.nan_to_num(moved, nan=np.inf), 0.0).max(axis=1)


def _margin(a: NDArray[np.float64]) -> NDArray[np.float64]:
    if a.shape[1] < 2:
        return np.full(a.shape[0], np.inf)
    top2 = np.partition(a, -2, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def row_stats(a: NDArray[Any], b: NDArray[Any]) -> RowStats:
    """B's rows against A's (`a`, `b`: [rows, vocab] logits of the same positions).

    Raises:
        ValueError: the shapes differ.
    """
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"row_stats needs two [rows, vocab] arrays of one shape, got {a.shape} and {b.shape}")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    finite = np.isfinite(a64)
    nonfinite = (finite & ~np.isfinite(b64)).sum(axis=1).astype(np.int64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        am = np.where(finite, a64, -np.inf)
        bm = np.where(finite, np.nan_to_num(b64, nan=-np.inf), -np.inf)
        la, lb = _log_softmax(am), _log_softmax(bm)
        pa = np.exp(la)
        kl = np.where(pa > 0, pa * (la - lb), 0.0).sum(axis=1)
    kl = np.where(nonfinite > 0, np.inf, np.maximum(kl, 0.0))
    top_a, top_b = np.argmax(am, axis=1), np.argmax(bm, axis=1)
    own = bm[np.arange(len(bm)), top_a][:, None]
    return RowStats(kl=kl, agree=top_a == top_b, margin=_margin(am), rank=(bm > own).sum(axis=1).astype(np.int64),
                    overlap=_overlap(am, bm), nonfinite=nonfinite, shift=_shift(am, bm))


def within_noise(b: RowStats, noise: RowStats) -> bool:
    """B is no worse than A against itself (rows in the same order): its largest KL is at most
    NOISE_KL_FACTOR times the noise pass's, and where it flips an argmax the noise pass keeps, A's
    top-1 - top-2 margin is at most twice the largest shift of a top logit the noise pass shows
    (a top-1 down and a top-2 up by that much swap them: a tie the re-rounding can break)."""
    if b.rows != noise.rows or not b.rows:
        return False
    if not b.kl.max() <= NOISE_KL_FACTOR * noise.kl.max():
        return False
    tie = 2.0 * float(noise.shift.max())
    return not np.any(~b.agree & noise.agree & ~(b.margin <= tie))


def bits_equal(a: NDArray[Any], b: NDArray[Any]) -> bool:
    """Same dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def values_equal(a: NDArray[Any], b: NDArray[Any]) -> bool:
    """Same shape and values (+0 equals -0, NaN equals NaN)."""
    if a.shape != b.shape:
        return False
    with np.errstate(invalid="ignore"):
        return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def off_top(logits: NDArray[Any], tokens: NDArray[Any]) -> NDArray[np.bool_]:
    """Rows whose token is not one of the row's top logits (a tie counts as top; a token outside
    the row, or a row that is not finite, is off the top)."""
    rows = np.arange(len(tokens))
    inside = (tokens >= 0) & (tokens < logits.shape[1])
    with np.errstate(invalid="ignore"):
        chosen = logits[rows, np.where(inside, tokens, 0)]
        return np.asarray(~inside | ~(chosen >= np.max(logits, axis=1)), dtype=np.bool_)


def out_of_domain(values: NDArray[Any], low: float | None, high: float | None) -> int:
    """How many of `values` lie outside [low, high] (an open end where None; NaN is outside)."""
    v = np.asarray(values, dtype=np.float64)
    inside = np.ones(v.shape, dtype=bool) if low is None else v >= low
    if high is not None:
        inside &= v <= high
    return int(np.count_nonzero(~inside))


def _blocks(image: NDArray[np.uint8]) -> NDArray[np.uint8]:
    pad = -len(image) % BLOCK_BYTES
    flat = np.concatenate([image, np.zeros(pad, dtype=np.uint8)]) if pad else image
    return flat.reshape(-1, BLOCK_BYTES)


def written_blocks(image: NDArray[np.uint8]) -> NDArray[np.bool_]:
    """The 64-byte blocks of a state image (read after a run from zeroed states) that hold a
    non-zero byte: the run's write set."""
    return np.asarray(_blocks(image).any(axis=1), dtype=np.bool_)


def outside_bytes(written: NDArray[np.bool_], image: NDArray[np.uint8]) -> int:
    """Non-zero bytes of `image` in the blocks outside `written` (A's write set of the same state)."""
    blocks = _blocks(image)
    if len(blocks) != len(written):
        raise ValueError(f"a write set of {len(written)} blocks against an image of {len(blocks)}")
    return int(np.count_nonzero(blocks[~written]))
