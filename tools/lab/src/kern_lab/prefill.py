"""The prefill attention variants of tools/lab/kernels-src/prefill_lab.cu: each entry's tiling and
the launch shapes that follow from it; the kernels' own ABI is prefill.cu's."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["PREFILL_VARIANTS", "PrefillVariant"]

_SPLITS = 16  # grid z at most (prefill.cuh's PF_MAX_SPLITS)
_SPLIT_ROWS = 512  # chunks of this many rows or more never split (PF_SPLIT_ROWS)


@dataclass(frozen=True, slots=True)
class PrefillVariant:
    """A `PL_VARIANT` of prefill_lab.cu: warps per block, 16-row m tiles per warp, keys per tile,
    cp.async stages and blocks per SM (its `__launch_bounds__`)."""

    warps: int
    m_tiles: int
    keys: int
    stages: int
    per_sm: int

    @property
    def threads(self) -> int:
        """Threads per block."""
        return 32 * self.warps

    @property
    def packed_rows(self) -> int:
        """Packed rows (chunk rows x the kv head's query heads) per block."""
        return 16 * self.warps * self.m_tiles

    def smem(self, head_dim: int) -> int:
        """Dynamic shared memory in bytes: the K/V stages, and Q when a warp holds two m tiles."""
        ld = head_dim + 8
        q = self.packed_rows * ld if self.m_tiles > 1 else 0
        return 2 * (self.stages * 2 * self.keys * ld + q)

    def grid(self, rows: int, nq: int, nkv: int) -> tuple[int, int, int]:
        """The attention entry's grid for a chunk of `rows` rows."""
        return (-(-rows * (nq // nkv) // self.packed_rows), nkv, min(_SPLITS, -(-_SPLIT_ROWS // rows)))


PREFILL_VARIANTS = MappingProxyType({
    "kern_pl_w4m1n64s2": PrefillVariant(4, 1, 64, 2, 2),
    "kern_pl_w4m1n64s3": PrefillVariant(4, 1, 64, 3, 2),
    "kern_pl_w8m1n64s2": PrefillVariant(8, 1, 64, 2, 1),
    "kern_pl_w8m1n64s3": PrefillVariant(8, 1, 64, 3, 1),
    "kern_pl_w4m2n32s2": PrefillVariant(4, 2, 32, 2, 2),
    "kern_pl_w4m2n32s3": PrefillVariant(4, 2, 32, 3, 2),
    "kern_pl_w8m2n32s2": PrefillVariant(8, 2, 32, 2, 1),
    "kern_pl_w4m1n32s2b3": PrefillVariant(4, 1, 32, 2, 3),
    "kern_pl_w4m1n32s3b3": PrefillVariant(4, 1, 32, 3, 3),
})
"""Attention entry -> its tiling; each entry's split merge is `<entry>_combine` (grid [rows, nq],
block [head_dim])."""
