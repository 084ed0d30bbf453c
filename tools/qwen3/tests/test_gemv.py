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


def test_streaming_gemv_launch_is_sized_for_its_ring() -> None:
    """A streaming GEMV runs min(n, GEMV_TMA_BLOCKS) blocks with the ring's shared memory; a row too
    long for the ring is refused when the manifest is generated, not at run time."""
    assert gen.gemv_launch("kern_gemv_bf16_s4", 6144, 2560) == (6144, 128, 0)
    assert gen.gemv_launch("kern_gemv_bf16_tma", 6144, 2560) == (gen.GEMV_TMA_BLOCKS, 512, gen.GEMV_TMA_SMEM)
    assert gen.gemv_launch("kern_gemv_bf16_tma", 37, 40) == (37, 512, gen.GEMV_TMA_SMEM)
    assert gen.gemv_launch("kern_gemv_bf16_tma_silu", 9728, 2560)[2] == gen.GEMV_TMA_SMEM
    # A one-row stage of depth k takes 2k bytes and k / 2 bytes of partials (2.5k); the SiLU form 5k.
    longest = gen.GEMV_TMA_SMEM * 2 // 5 // 8 * 8
    gen.gemv_launch("kern_gemv_bf16_tma", 10, longest)
    gen.gemv_launch("kern_gemv_bf16_tma_silu", 10, longest // 2 // 8 * 8)
    with pytest.raises(gen.GenError, match="exceed"):
        gen.gemv_launch("kern_gemv_bf16_tma", 10, longest + 8)
    with pytest.raises(gen.GenError, match="exceed"):
        gen.gemv_launch("kern_gemv_bf16_tma_silu", 10, longest // 2 // 8 * 8 + 8)
    m = manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS),
                  gemv_pick={"qkv": "kern_gemv_bf16_tma", "gate_up": "kern_gemv_bf16_tma_silu"})
    qkv = m["ops"]["gemv_tma_6144x2560"]["impl"]["launches"][0]
    assert qkv["grid"] == [gen.GEMV_TMA_BLOCKS, 1, 1] and qkv["shared_mem"] == gen.GEMV_TMA_SMEM
    decode = [c["op"] for c in m["programs"]["decode"]["calls"]]
    assert "gemv_tma_silu_9728x2560" in decode and "silu_mul" not in decode


def test_prefetched_gemv_launch_holds_its_columns_rows() -> None:
    """A `_p4` launch gives each block max(1, min(n, GEMV_P4_SMEM // 2k)) columns (`_p4_silu`: // 4k) and their rows of
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
    # `_p4_silu`: a column is its gate and its up row.
    assert gen.gemv_launch("kern_gemv_bf16_p4_silu", 9728, 2560) == (3243, 128, 3 * 2 * 5120)
    gen.gemv_launch("kern_gemv_bf16_p4_silu", 10, gen.GEMV_P4_MAX_ROW // 4)
    with pytest.raises(gen.GenError, match="exceed a block's shared memory"):
        gen.gemv_launch("kern_gemv_bf16_p4_silu", 10, gen.GEMV_P4_MAX_ROW // 4 + 8)
    m = manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True,
                  gemv_pick={"o": "kern_gemv_bf16_p4"})
    verify_manifest(m)
    launch = m["ops"]["gemv_p4_2560x4096"]["impl"]["launches"][0]
    assert (launch["entry"], launch["grid"], launch["shared_mem"]) == ("kern_gemv_bf16_p4", [640, 1, 1], 32768)


