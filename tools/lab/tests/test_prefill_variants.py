"""kern_lab.PREFILL_VARIANTS against the PL_VARIANT lines of prefill_lab.cu, and their launch shapes."""

from __future__ import annotations

import re
from pathlib import Path

import kern_lab as lab

SRC = Path(__file__).resolve().parents[1] / "kernels-src" / "prefill_lab.cu"
SM_SMEM = 228 * 1024  # shared memory of an H100/H200 SM, 1 KiB of it reserved per block


def test_table_is_the_sources_variants() -> None:
    found = {
        name: lab.PrefillVariant(*(int(x) for x in rest))
        for name, *rest in re.findall(r"^PL_VARIANT\((\w+), (\d+), (\d+), (\d+), (\d+), (\d+)\)$", SRC.read_text(),
                                      re.MULTILINE)
    }
    assert found == dict(lab.PREFILL_VARIANTS)
    for name, v in found.items():
        suffix = "" if v.per_sm * v.warps == 8 else f"b{v.per_sm}"
        assert name == f"kern_pl_w{v.warps}m{v.m_tiles}n{v.keys}s{v.stages}{suffix}"


def test_each_variant_fits_its_blocks_per_sm() -> None:
    for name, v in lab.PREFILL_VARIANTS.items():
        for d in (64, 128):
            assert v.per_sm * (v.smem(d) + 1024) <= SM_SMEM, name
            assert v.keys * d // 8 % v.threads == 0 and v.packed_rows * d // 8 % v.threads == 0, name


def test_grid_covers_the_packed_rows_and_the_split_cap() -> None:
    v = lab.PREFILL_VARIANTS["kern_pl_w8m1n64s2"]
    assert (v.threads, v.packed_rows, v.smem(128)) == (256, 128, 69632)
    assert v.grid(37, 32, 8) == (2, 8, 14) and v.grid(4096, 32, 8) == (128, 8, 1) and v.grid(1, 8, 8) == (1, 8, 16)
    w = lab.PREFILL_VARIANTS["kern_pl_w4m2n32s2"]
    assert (w.threads, w.packed_rows, w.smem(128)) == (128, 128, 2 * (2 * 2 * 32 * 136 + 128 * 136))
