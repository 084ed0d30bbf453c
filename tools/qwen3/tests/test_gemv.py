"""kern_qwen3.gemv: the launch shapes of the GEMV layouts."""

from __future__ import annotations

import pytest
from helpers.qwen3_options import (
    manifest,
    verify_manifest,
)

import kern_qwen3 as gen
from kern_qwen3 import QWEN3_4B_CONFIG


def test_band_gemv_launch_is_one_balanced_wave() -> None:
    """A band launch has at most GEMV_SMS x (blocks per SM) blocks, every block gets a band, and
    bands differ by at most one column."""
    for entry, per_sm in ((e, v.per_sm) for e, v in gen.GEMV_ENTRIES.items() if v.layout is gen.Layout.BAND):
        for n in (1, 7, 924, 925, 2560, 6144, 9728, 151936):
            grid, threads, smem = gen.gemv_launch(entry, n, 2560)
            assert threads == 128 and smem == 0 and 1 <= grid <= min(n, gen.GEMV_SMS * per_sm)
            sizes = {(b + 1) * n // grid - b * n // grid for b in range(grid)}
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1, (entry, n, sizes)
    assert gen.gemv_launch("kern_gemv_bf16_b4", 6144, 2560) == (878, 128, 0)


def test_column_gemv_launch_is_one_block_per_columns_group() -> None:
    assert gen.gemv_launch("kern_gemv_bf16_s4", 6144, 2560) == (6144, 128, 0)
    assert gen.gemv_launch("kern_gemv_bf16_silu", 9728, 2560) == (2432, 128, 0)


def test_prefetched_gemv_launch_holds_its_columns_rows() -> None:
    """A `_p4` launch gives each block max(1, min(n, GEMV_P4_SMEM // 2k)) columns and their rows of
    shared memory; o at the 4B shape is one resident wave; a row beyond a block's shared memory is
    refused when the manifest is generated."""
    assert gen.gemv_launch("kern_gemv_bf16_p4", 2560, 4096) == (640, 128, 32768)
    assert gen.gemv_launch("kern_gemv_bf16_p4", 2560, 9728) == (2560, 128, 19456)
    assert gen.gemv_launch("kern_gemv_bf16_p4", 7, 40) == (1, 128, 7 * 80)  # no more rows than n
    grid, _threads, smem = gen.gemv_launch("kern_gemv_bf16_p4", 2560, 4096)
    assert grid <= gen.GEMV_SMS * (227 * 1024 // smem)
    gen.gemv_launch("kern_gemv_bf16_p4", 10, gen.GEMV_P4_MAX_ROW // 2)
    with pytest.raises(gen.GenError, match="exceed a block's shared memory"):
        gen.gemv_launch("kern_gemv_bf16_p4", 10, gen.GEMV_P4_MAX_ROW // 2 + 8)
    m = manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True,
                  gemv_pick={"o": "kern_gemv_bf16_p4"})
    verify_manifest(m)
    launch = m["ops"]["gemv_p4_2560x4096"]["impl"]["launches"][0]
    assert (launch["entry"], launch["grid"], launch["shared_mem"]) == ("kern_gemv_bf16_p4", [640, 1, 1], 32768)


