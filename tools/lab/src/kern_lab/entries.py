"""The lab's kernel entries (tools/lab/kernels-src) and the GEMV table that adds them to the
product's."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kern_qwen3 import GEMV_ENTRIES, GemvEntry, Layout

__all__ = [
    "ALT_ENTRIES",
    "CLUSTER_ENTRY",
    "DECODE_CLUSTER",
    "DECODE_SPLITS_WIDE",
    "DEFER_P4",
    "FOLDED",
    "FOLD_ENTRIES",
    "LAB_GEMV_ENTRIES",
    "LATE_ENTRIES",
    "QKN_MAX_GROUP",
    "RING_ENTRIES",
    "TAIL_GROUP",
    "TAIL_OF",
    "TAIL_STRIDE",
    "WIDE_ENTRY",
    "ring_table",
]

def _columns(columns: int, threads: int = 128, *, silu: bool = False) -> GemvEntry:
    return GemvEntry(Layout.COLUMNS, threads, columns=columns, silu=silu)


def _band(per_sm: int, *, silu: bool = False) -> GemvEntry:
    return GemvEntry(Layout.BAND, 128, per_sm=per_sm, silu=silu)


ALT_ENTRIES: Mapping[str, GemvEntry] = MappingProxyType({
    "kern_gemv_bf16": _columns(4),
    "kern_gemv_bf16_s2": _columns(2),
    "kern_gemv_bf16_s8": _columns(1, 256),
    "kern_gemv_bf16_c2": _columns(8),
    "kern_gemv_bf16_q4": _columns(16),
    "kern_gemv_bf16_s2q4": _columns(8),
    "kern_gemv_bf16_s4q4": _columns(4),
    "kern_gemv_bf16_tma": GemvEntry(Layout.STREAM, 512),
    "kern_gemv_bf16_tma_silu": GemvEntry(Layout.STREAM, 512, silu=True),
    "kern_gemv_bf16_b4_silu": _band(6, silu=True),
    "kern_gemv_bf16_d4": _band(4),
    "kern_gemv_bf16_d8": _band(4),
    "kern_gemv_bf16_d4_silu": _band(4, silu=True),
    "kern_gemv_bf16_p4_silu": GemvEntry(Layout.PREFETCH, 128, silu=True),
})
"""gemv_alt.cu's entries (the GEMV configurations and layouts the decode step does not launch) ->
their launch shape. Band blocks per SM: 80 registers of 64K per SM at 128 threads for `_b4_silu`,
at most 128 for the deep bands. (kern_gemv_bf16_acc, a fused residual add, is no decode GEMM.)"""
DEFER_P4: Mapping[str, str] = MappingProxyType({
    "kern_gemv_bf16_p4": "kern_gemv_bf16_p4_d", "kern_gemv_bf16_p4_silu": "kern_gemv_bf16_p4_silu_d"})
"""gemv_defer_p4.cu: with `defer_norm`, a qkv / gate_up pick on a prefetched entry folds into its
deferred form, on that entry's launch (its rows' shared memory only): `kern_qwen3.DeferNorms`'
`prefetched`."""

RING_ENTRIES: Mapping[str, GemvEntry] = MappingProxyType({
    "kern_gemv_bf16_r4": GemvEntry(Layout.RING, 128),
    "kern_gemv_bf16_r4_silu": GemvEntry(Layout.RING, 128, silu=True),
})
"""gemv_ring.cu's entries: one resident wave of GEMV_RING_BLOCKS blocks per SM whose bands stream
through a ring of shared-memory stages."""
LAB_GEMV_ENTRIES: Mapping[str, GemvEntry] = MappingProxyType({**GEMV_ENTRIES, **ALT_ENTRIES, **RING_ENTRIES})
"""The product's GEMV entries, gemv_alt.cu's and the ring entries: the table a lab plan's picks may
name."""


def ring_table(blocks_per_sm: int, stage_bytes: int) -> dict[str, GemvEntry]:
    """LAB_GEMV_ENTRIES with the ring entries at another wave (blocks per SM) and stage budget."""
    ring = {e: GemvEntry(v.layout, v.threads, per_sm=blocks_per_sm, budget=stage_bytes, silu=v.silu)
            for e, v in RING_ENTRIES.items()}
    return {**LAB_GEMV_ENTRIES, **ring}


FOLD_ENTRIES: Mapping[str, tuple[str, str]] = MappingProxyType({
    "qkv": ("kern_gemv_bf16_b4_n", "kern_gemv_bf16_b4"),
    "gate_up": ("kern_gemv_bf16_b4_silu_n", "kern_gemv_bf16_b4_silu"),
})
"""The prologue fold (gemv_norm.cu): decode GEMM -> (the band GEMV with the add + RMSNorm before it
in its prologue, the band entry whose grid it takes), for a pick with no folded form (FOLDED)."""
FOLDED: Mapping[str, str] = MappingProxyType({
    "kern_gemv_bf16_b4": "kern_gemv_bf16_b4_n",
    "kern_gemv_bf16_b4_silu": "kern_gemv_bf16_b4_silu_n",
    "kern_gemv_bf16_r4": "kern_gemv_bf16_r4_n",
    "kern_gemv_bf16_r4_silu": "kern_gemv_bf16_r4_silu_n",
    "kern_gemv_bf16_p4": "kern_gemv_bf16_p4_n",
    "kern_gemv_bf16_p4_silu": "kern_gemv_bf16_p4_silu_n",
})
"""GEMV entry -> its form with the add + RMSNorm in its prologue (gemv_norm.cu, gemv_ring.cu,
gemv_pnorm.cu), on that entry's launch."""
TAIL_OF: Mapping[str, str] = MappingProxyType({
    "kern_gemv_bf16_s4": "kern_gemv_bf16_s4_an", "kern_gemv_bf16_p4": "kern_gemv_bf16_p4_an"})
"""gemv_tail.cu: GEMV entry -> its form with the add + RMSNorm after it run by its last block, on
the entry's launch (its dynamic shared memory at least h and x: 4n bytes)."""
TAIL_GROUP, TAIL_STRIDE = 64, 32
"""gemv_tail.cu's two-level block counter: a first-level counter per TAIL_GROUP blocks, TAIL_STRIDE
i32 apart, after the top one (`passes.tail_counters`)."""
QKN_MAX_GROUP = 32
"""attention_qkn.cu's QKN_MAX_GROUP: query heads per kv head its shared memory holds."""
DECODE_CLUSTER = 8
"""attention_lab.cuh's DEC_CLUSTER: kern_attn_decode's `__cluster_dims__(1, 8, 1)` (its grid y a
multiple of 8)."""
CLUSTER_ENTRY = "kern_attn_decode"
"""attention_cluster.cu's one-row decode attention (32 fixed splits, a cluster combine up to 512
tokens): the form the lab's attention experiments start from."""
WIDE_ENTRY = "kern_attn_decode_wide"
"""attention_wide.cu's kern_attn_decode with a per-cluster combine first on its global path."""
DECODE_SPLITS_WIDE = 128
"""Splits of the wide decode attention's grid (a multiple of DECODE_CLUSTER)."""
LATE_ENTRIES: Mapping[str, str] = MappingProxyType({
    "kern_attn_decode": "kern_attn_decode_late", "kern_attn_decode_wide": "kern_attn_decode_wide_late"})
"""attention_wide.cu: the decode attention entries whose blocks let the next launch start only
once they have folded their splits."""
