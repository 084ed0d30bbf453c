"""The kernel entries a Qwen3 manifest launches, and which module (source file) defines each."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType

from kern_qwen3.errors import KernelsError

__all__ = [
    "ARGMAX_PARTS",
    "DECODE_CLUSTER",
    "DECODE_ROWS_MAX_GROUP",
    "DECODE_ROWS_STAGES",
    "DECODE_ROWS_WARPS",
    "DECODE_SPLITS",
    "DEFER_ENTRIES",
    "DEFER_MAX_K",
    "DEVICE_FEED_ENTRIES",
    "ENTRIES",
    "FUSED_ENTRIES",
    "GEMV_BAND",
    "GEMV_DEFAULT",
    "GEMV_ENTRIES",
    "GEMV_GEMMS",
    "GEMV_PICK",
    "PREFILL_BM",
    "PREFILL_PART_ROWS",
    "PREFILL_SPLITS",
    "PREFILL_SPLIT_ROWS",
    "PREFILL_STAGES",
    "PREFILL_THREADS",
    "QK_ROWS_HEADS",
    "ROWS_ENTRIES",
    "SAMPLE_TOP_N",
    "SILU_ENTRIES",
    "UNFUSED_ENTRIES",
    "GemvEntry",
    "Layout",
    "decode_rows_smem",
    "entry_modules",
    "prefill_smem",
    "silu_entries",
]

DECODE_SPLITS = 16
"""Split-KV partitions of the decode attention (grid y of kern_attn_decode_partial; the most splits
a row of kern_attn_decode_one or kern_attn_decode_rows takes, its `max_splits`). A multiple of
DECODE_CLUSTER: kern_attn_decode_one runs in clusters of that many blocks along y, and the driver
refuses any other grid. For one row of the one-row step's attention on the H200, 16 beat 32 at
every context from 128 to 32k tokens (13.1 vs 17.5 us a layer at 2k, 25.5 vs 32.0 at 8k, 77 vs 85
at 32k)."""
DECODE_CLUSTER = 8
"""attention_cluster.cuh's DEC_CLUSTER: kern_attn_decode_one's `__cluster_dims__(1, 8, 1)`."""
DECODE_ROWS_WARPS = 4
"""attention.cuh's ROWS_WARPS: warps per block of kern_attn_decode_rows (block [128])."""
DECODE_ROWS_STAGES = 3
"""attention.cuh's ROWS_STAGES: page slots in each warp's shared-memory ring."""
DECODE_ROWS_MAX_GROUP = 16
"""attention.cuh's ROWS_MAX_GROUP: query heads per kv head kern_attn_decode_rows holds."""


def decode_rows_smem(head_dim: int) -> int:
    """Dynamic shared memory of kern_attn_decode_rows at `head_dim` (attention.cuh's rows_smem_bytes):
    each warp's ring of page slots, a slot 2 * head_dim * 16 tokens * 2 bytes."""
    return DECODE_ROWS_WARPS * DECODE_ROWS_STAGES * (head_dim // 8) * 32 * 16


PREFILL_BM = 128
"""Packed rows (chunk rows x the kv head's query heads) per block of kern_prefill_attn (prefill.cuh's
PF_BM): grid x = ceil_div(tokens * group, PREFILL_BM)."""
PREFILL_SPLITS = 16
"""The most key splits of kern_prefill_attn (prefill.cuh's PF_MAX_SPLITS): grid z =
min(PREFILL_SPLITS, ceil_div(PREFILL_SPLIT_ROWS, tokens))."""
PREFILL_SPLIT_ROWS = 512
"""prefill.cuh's PF_SPLIT_ROWS: chunks of this many rows or more run one split."""
PREFILL_PART_ROWS = 2 * PREFILL_SPLIT_ROWS
"""Chunk rows x splits that kern_prefill_attn's partials hold (splits x rows < 2 x PREFILL_SPLIT_ROWS)."""
PREFILL_STAGES = 6
"""prefill.cuh's PF_STAGES: the K/V tiles of 64 keys kern_prefill_attn keeps in shared memory."""
PREFILL_THREADS = 384
"""Threads per block of kern_prefill_attn (prefill.cuh's PF_THREADS): a gathering warpgroup and two
consumer warpgroups."""


def prefill_smem(head_dim: int) -> int:
    """Dynamic shared memory of kern_prefill_attn at `head_dim` (prefill.cuh's PfSmem): Q of
    PREFILL_BM rows and PREFILL_STAGES K and V tiles of 64 rows, bf16, and 1 KiB to round the base
    up to the 1024-byte swizzle atom."""
    return 1024 + (PREFILL_BM // 64 + 2 * PREFILL_STAGES) * 64 * head_dim * 2
ARGMAX_PARTS = 64
"""Blocks of the first argmax stage."""

ENTRIES: tuple[str, ...] = (
    "kern_embed",
    "kern_rmsnorm",
    "kern_add_rmsnorm",
    "kern_qk_norm_rope",
    "kern_kv_write",
    "kern_attn_decode_partial",
    "kern_attn_decode_reduce",
    "kern_prefill_attn",
    "kern_prefill_combine",
    "kern_silu_mul",
    "kern_argmax_partial",
    "kern_argmax_final",
    "kern_rope_table",
)
"""Entries every manifest needs."""
DEVICE_FEED_ENTRIES: tuple[str, ...] = ("kern_decode_advance", "kern_copy_i64", "kern_copy_i32")
"""Extra entries of `feed="device"`: the step's inputs live in carry buffers that a `start`
program seeds from the host inputs and `kern_decode_advance` moves on (the verifier forbids kernels
writing input buffers)."""
FUSED_ENTRIES: tuple[str, ...] = ("kern_qk_norm_rope_kv", "kern_qk_norm_rope_kv_rows", "kern_attn_decode_one",
                                  "kern_zero_i32")
"""Extra entries of `fuse=True`: q/k norm + rope writes k / v into the pages itself (no
kern_kv_write; decode: `kern_qk_norm_rope_kv`, a block per head; prefill: its many-row form
`kern_qk_norm_rope_kv_rows`, a warp per head), decode attention is one launch (kern_attn_decode_one:
up to 1,024 tokens its splits combine in a cluster's shared memory, beyond that each cluster's
splits combine into one partial and the last block per kv head reduces those; counters in a carry
buffer that the load program zeroes)."""
UNFUSED_ENTRIES: tuple[str, ...] = ("kern_attn_decode_partial", "kern_attn_decode_reduce")
"""Entries of ENTRIES that a `fuse=True` manifest runs none of (its one-row step's attention is
kern_attn_decode_one): their module needs no hash there."""
QK_ROWS_HEADS = 8
"""Heads per block of kern_qk_norm_rope_kv_rows (qwen3_core.cu's QKR_HEADS: a warp each)."""
ROWS_ENTRIES: tuple[str, ...] = ("kern_attn_decode_rows", "kern_sample_rows", "kern_rows_advance", "kern_rows_seed",
                                 "kern_zero_i32")
"""Extra entries of `rows`: the batched step's decode attention over rows of different lengths,
per-row sampling, the per-row feed and its seeding, and the zeroing of its attention counters."""
SAMPLE_TOP_N = 20
"""The most top-N logprobs kern_sample_rows writes per row (the `row_logprobs` / `row_top` width)."""

GEMV_GEMMS = ("qkv", "o", "gate_up", "down", "lm_head")
"""Decode GEMMs (m = 1) that `--gemv` may move from cublasLt to our GEMV kernels (gemv.cu)."""
GEMV_DEFAULT = ("o", "gate_up", "lm_head")
"""`--gemv default` (examples/qwen3-4b-gemv.json): the decode GEMMs where kern_gemv_bf16 beat cuBLAS
on the H200 before the per-shape entries (docs/kernels.md, "GEMV for decode"). `--gemv all` takes
every decode GEMM, so the decode chain holds no cuBLAS launch and can run with `--pdl`
(examples/qwen3-4b-fast.json: `--gemv all --fuse --pdl --fold-norm --defer-norm`)."""


class Layout(Enum):
    """How a GEMV entry spreads the output columns over its grid (`gemv.gemv_launch` sizes it).
    STREAM and RING are the lab's layouts (tools/lab/kernels-src): no product entry has them, but a
    lab plan's table names them and the generator sizes its launches."""

    COLUMNS = "columns"
    """A fixed number of output columns per block: grid x = ceil_div(n, columns)."""
    STREAM = "stream"
    """W through a shared-memory ring filled by bulk copies: min(n, GEMV_TMA_BLOCKS) blocks with
    GEMV_TMA_SMEM bytes of dynamic shared memory each."""
    BAND = "band"
    """One resident wave of blocks that each sum a balanced band of columns (`GemvEntry.per_sm`)."""
    PREFETCH = "prefetch"
    """Blocks copy their columns' W rows into GEMV_P4_SMEM bytes of dynamic shared memory before the
    PDL wait."""
    RING = "ring"
    """One resident wave of GEMV_RING_BLOCKS blocks per SM whose bands stream through a ring of
    shared-memory stages (GEMV_RING_SMEM bytes)."""


@dataclass(frozen=True, slots=True)
class GemvEntry:
    """A GEMV entry's launch shape: its layout, threads per block, output columns per block
    (COLUMNS), blocks per SM (BAND: what its `__launch_bounds__` guarantee; RING: its wave, 0 for
    GEMV_RING_BLOCKS), shared-memory budget in bytes (RING: its stages, 0 for GEMV_RING_SMEM), and
    whether it applies SiLU-and-mul in its epilogue (gate_up only: W is [2n, k], y is `act`)."""

    layout: Layout
    threads: int
    columns: int = 0
    per_sm: int = 0
    budget: int = 0
    silu: bool = False


def _columns(columns: int, *, silu: bool = False) -> GemvEntry:
    return GemvEntry(Layout.COLUMNS, 128, columns=columns, silu=silu)


def _band(per_sm: int) -> GemvEntry:
    return GemvEntry(Layout.BAND, 128, per_sm=per_sm)


GEMV_ENTRIES: Mapping[str, GemvEntry] = MappingProxyType({
    "kern_gemv_bf16_s4": _columns(1),
    "kern_gemv_bf16_silu": _columns(4, silu=True),
    "kern_gemv_bf16_b4": _band(7),
    "kern_gemv_bf16_p4": GemvEntry(Layout.PREFETCH, 128),
})
"""The GEMV entries of gemv.cu -> their launch shape (`gemv.gemv_launch` turns an entry and a
GEMM's n, k into the launch). `_b4`'s 7 blocks per SM: 72 registers of 64K per SM at 128 threads.
The lab's tables (kern_lab) add the other configurations and layouts of tools/lab/kernels-src."""

GEMV_PICK: Mapping[str, str] = MappingProxyType({
    "qkv": "kern_gemv_bf16_b4",
    "o": "kern_gemv_bf16_s4",
    "gate_up": "kern_gemv_bf16_silu",
    "down": "kern_gemv_bf16_p4",
    "lm_head": "kern_gemv_bf16_p4",
})
"""The GEMV entry of each decode GEMM, by the step's critical path on the H200 (docs/perf.md):
split-k over the block's 4 warps, over balanced column bands (`_b4`) for qkv and one column per
block (`_s4`) for o; lm_head's and down's rows bulk-copied into shared memory (`_p4`); gate_up runs
`_silu`, which applies SiLU-and-mul in its epilogue and writes `act` (no kern_silu_mul in the decode
step)."""

DEFER_ENTRIES: Mapping[str, str] = MappingProxyType({
    "qkv": "kern_gemv_bf16_b4_d", "gate_up": "kern_gemv_bf16_b4_silu_d"})
"""`fold_norm` + `defer_norm` (gemv_defer.cu): decode GEMM -> the band GEMV that applies the add +
RMSNorm before it as r * (W (h * w_norm)), r in its epilogue, so nothing stands between its PDL
wait and its first FMA but one load of h; one wave of GEMV_DEFER_BLOCKS blocks per SM."""
DEFER_MAX_K = 4096
"""gemv_defer.cuh's k limit (DEFER_MAXP 16-byte pieces per thread of 128)."""


def silu_entries(table: Mapping[str, GemvEntry]) -> tuple[str, ...]:
    """The entries of `table` with SiLU-and-mul in their epilogue, in table order."""
    return tuple(name for name, entry in table.items() if entry.silu)


SILU_ENTRIES: tuple[str, ...] = silu_entries(GEMV_ENTRIES)
"""The GEMV entries with SiLU-and-mul in their epilogue (derived from GEMV_ENTRIES)."""
GEMV_BAND: Mapping[str, int] = MappingProxyType(
    {name: e.per_sm for name, e in GEMV_ENTRIES.items() if e.layout is Layout.BAND})
"""Band entries -> the blocks per SM their `__launch_bounds__` guarantee (derived from GEMV_ENTRIES)."""


_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_GLOBAL = re.compile(rf"__global__\s+{_BOUNDS}void\s+{_BOUNDS}(kern_\w+)\s*\(")


def entry_modules(*src_dirs: Path) -> dict[str, str]:
    """Map each `kern_*` kernel entry to the module (source file stem) that defines it.

    Raises:
        KernelsError: an entry is defined twice, or a directory cannot be read.
    """
    found: dict[str, str] = {}
    for src_dir in src_dirs:
        if not src_dir.is_dir():
            raise KernelsError(f"kernel source directory {src_dir} does not exist (give --kernels-src)")
        for path in sorted(src_dir.glob("*.cu")):
            for entry in _GLOBAL.findall(path.read_text(encoding="utf-8", errors="replace")):
                if entry in found and found[entry] != path.stem:
                    raise KernelsError(f"{entry} is defined in both {found[entry]}.cu and {path.name}")
                found[entry] = path.stem
    return found
