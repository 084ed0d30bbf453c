"""GEMV launch shapes: an entry and a GEMM's n (output columns) and k (depth) -> grid, threads and
dynamic shared memory."""

from __future__ import annotations

from collections.abc import Mapping

from kern_qwen3.entries import GEMV_ENTRIES, GemvEntry, Layout
from kern_qwen3.errors import GenError

__all__ = [
    "GEMV_DEFER_BLOCKS",
    "GEMV_P4_MAX_ROW",
    "GEMV_P4_SMEM",
    "GEMV_RING_BLOCKS",
    "GEMV_RING_MAX_STAGES",
    "GEMV_RING_SMEM",
    "GEMV_SMS",
    "GEMV_TMA_BLOCKS",
    "GEMV_TMA_SMEM",
    "GEMV_TMA_STAGE_CAP",
    "Launch",
    "defer_launch",
    "gemv_launch",
]

Launch = tuple[int, int, int]
"""(grid x, threads per block, dynamic shared bytes)."""

GEMV_SMS = 132
"""Streaming multiprocessors the GEMV grids are sized for: the H200's (the kernels split the
columns over any grid, so another GPU runs them correctly; only the balance changes)."""
GEMV_TMA_BLOCKS = GEMV_SMS
"""Blocks of a streaming GEMV launch: one per SM."""
GEMV_TMA_SMEM = 196608
"""Dynamic shared memory of a streaming GEMV block (its ring of W stages): 192 KiB of the SM's
227 KiB, leaving room for the small kernels that run beside it under PDL."""
GEMV_TMA_STAGE_CAP = 32768
"""The lab's gemv_alt.cu TMA_STAGE_CAP: a stage holds max(1, cap // (rows * 2k)) columns."""
GEMV_P4_SMEM = 32768
"""Shared-memory budget of a prefetched GEMV block (`_p4`, `_p4_silu`): it owns max(1, min(n, budget //
(rows * 2k))) columns (rows: 2 for `_p4_silu`'s gate and up), so lm_head (k 2560) runs 25323 blocks of 6
columns and o (k 4096) 640 blocks of 4."""
GEMV_P4_MAX_ROW = 227 * 1024 - 1024
"""The most dynamic shared memory a `_p4` block may have: sm_90's 227 KiB per block less 1 KiB for the
entries' static shared memory (384-768 B: the mbarrier and the column sums); a block holds at least
one column's rows."""
GEMV_RING_BLOCKS = 2
"""Blocks per SM of a ring GEMV launch: the grid is one wave of balanced bands,
ceil_div(n, ceil_div(n, GEMV_SMS * that)) blocks."""
GEMV_RING_SMEM = 65536
"""Bytes of W stages per ring block: the ring has min(32, this // (rows * 2k), the band's columns)
stages of one column's rows each (rows: 2 for the SiLU form), at least one; a folded launch
adds 4k bytes for the norm's h and x in front of them."""
GEMV_RING_MAX_STAGES = 32
"""The mbarriers a ring block has (RING_MAX_STAGES)."""
GEMV_DEFER_BLOCKS = 4
"""Blocks per SM of a deferred-norm band launch (`__launch_bounds__(128, 4)`: 106 / 122 registers)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _too_big(entry: str, what: str) -> GenError:
    return GenError(f"{entry}: {what} exceed a block's shared memory; pick another GEMV entry for this GEMM")


def _ring(entry: str, e: GemvEntry, n: int, k: int, norm: int) -> Launch:
    column = (2 if e.silu else 1) * 2 * k
    if norm + column > GEMV_P4_MAX_ROW:
        raise _too_big(entry, f"one column's W rows ({column} bytes, k = {k}) and the norm's {norm}")
    per_block = _ceil_div(n, GEMV_SMS * (e.per_sm or GEMV_RING_BLOCKS))
    stages = max(1, min(GEMV_RING_MAX_STAGES, (e.budget or GEMV_RING_SMEM) // column, per_block,
                        (GEMV_P4_MAX_ROW - norm) // column))
    return _ceil_div(n, per_block), e.threads, norm + stages * column


def _prefetch(entry: str, e: GemvEntry, n: int, k: int, norm: int) -> Launch:
    column = (2 if e.silu else 1) * 2 * k  # W bytes of one output column
    if norm + column > GEMV_P4_MAX_ROW:
        raise _too_big(entry, f"the W rows of one column, {column} bytes (k = {k}), and the norm's {norm}")
    per_block = max(1, min(n, GEMV_P4_SMEM // column))
    return _ceil_div(n, per_block), e.threads, per_block * column + norm


def _stream(entry: str, e: GemvEntry, n: int, k: int) -> Launch:
    rows = 2 if e.silu else 1
    stage = max(1, GEMV_TMA_STAGE_CAP // (rows * 2 * k)) * rows * 2 * k
    # NOTE: one f32 partial per 16-byte piece of a stage, for the one x row a decode launch has.
    if stage + stage // 4 > GEMV_TMA_SMEM:
        raise _too_big(entry, f"a stage of {stage} bytes (k = {k}) and its partials")
    return min(n, GEMV_TMA_BLOCKS), e.threads, GEMV_TMA_SMEM


def gemv_launch(entry: str, n: int, k: int, folded: bool = False,
                table: Mapping[str, GemvEntry] = GEMV_ENTRIES) -> Launch:
    """The launch of a GEMV entry (of `table`) for n output columns of depth k (`folded`: of its
    form with the add + RMSNorm in its prologue, for one x row).

    Raises:
        GenError: a column's W rows would not fit the entry's shared memory.
    """
    e = table[entry]
    norm = 2 * 2 * k if folded else 0  # h and x of one row, bf16
    match e.layout:
        case Layout.COLUMNS:
            return _ceil_div(n, e.columns), e.threads, 0
        case Layout.RING:
            return _ring(entry, e, n, k, norm)
        case Layout.PREFETCH:
            return _prefetch(entry, e, n, k, norm)
        case Layout.BAND:
            per_block = _ceil_div(n, GEMV_SMS * e.per_sm)
            return _ceil_div(n, per_block), e.threads, norm
        case Layout.STREAM:
            return _stream(entry, e, n, k)


def defer_launch(n: int, blocks_per_sm: int = GEMV_DEFER_BLOCKS) -> Launch:
    """The launch of a deferred-norm band for n columns: one wave of `blocks_per_sm` blocks per SM
    whose bands differ by at most one column."""
    per_block = _ceil_div(n, GEMV_SMS * blocks_per_sm)
    return _ceil_div(n, per_block), 128, 0
