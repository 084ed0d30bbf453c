"""kern's lab: experiment kernels and generator passes no shipped manifest uses, and the manifest
variants that combine them (see tools/lab/README.md)."""

from kern_lab.entries import (
    DECODE_SPLITS_WIDE,
    FOLD_ENTRIES,
    FOLDED,
    LAB_GEMV_ENTRIES,
    LATE_ENTRIES,
    QKN_MAX_GROUP,
    RING_ENTRIES,
    TAIL_GROUP,
    TAIL_OF,
    TAIL_STRIDE,
    WIDE_ENTRY,
    ring_table,
)
from kern_lab.kernels import LAB_SRC, PRODUCT_SRC, build_lab_kernels, lab_entry_modules
from kern_lab.passes import (
    Carveout,
    FoldNorms,
    LateTrigger,
    NormTail,
    PdlOff,
    Qkn,
    Splits,
    tail_counters,
    tail_launch,
)

__all__ = [
    "DECODE_SPLITS_WIDE",
    "FOLDED",
    "FOLD_ENTRIES",
    "LAB_GEMV_ENTRIES",
    "LAB_SRC",
    "LATE_ENTRIES",
    "PRODUCT_SRC",
    "QKN_MAX_GROUP",
    "RING_ENTRIES",
    "TAIL_GROUP",
    "TAIL_OF",
    "TAIL_STRIDE",
    "WIDE_ENTRY",
    "Carveout",
    "FoldNorms",
    "LateTrigger",
    "NormTail",
    "PdlOff",
    "Qkn",
    "Splits",
    "build_lab_kernels",
    "lab_entry_modules",
    "ring_table",
    "tail_counters",
    "tail_launch",
]
