"""The generator over kern_lab's GEMV table: the launch shapes of the lab's layouts, picks of
gemv_alt.cu's entries, and the deferred fold of a prefetched pick (gemv_defer_p4.cu)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kern_lab as lab
import kern_qwen3 as gen
from kern_lab.variants import DEFER
from kern_manifest import load_manifest
from kern_qwen3 import QWEN3_4B_CONFIG

TOOLS = Path(__file__).resolve().parents[2]
ENTRIES = lab.lab_entry_modules(lab_src=TOOLS / "lab" / "kernels-src", product_src=TOOLS / "kernels-src")
HASHES = dict.fromkeys(set(ENTRIES.values()), "c" * 64)
SHAPE = gen.shape_from_config(QWEN3_4B_CONFIG)
TABLE = lab.LAB_GEMV_ENTRIES


def _manifest(picks: dict[str, str], *passes: gen.Pass, gemv: tuple[str, ...] = gen.GEMV_GEMMS,
              fuse: bool = False) -> dict[str, Any]:
    plan = gen.Plan(feed="device", gemv=gemv, fuse=fuse, picks={**gen.GEMV_PICK, **picks}, table=dict(TABLE),
                    passes=passes)
    m = gen.generate(SHAPE, HASHES, ENTRIES, model="t", plan=plan)
    load_manifest(json.dumps(m))
    return m


def test_streaming_gemv_launch_is_sized_for_its_ring() -> None:
    """A streaming GEMV runs min(n, GEMV_TMA_BLOCKS) blocks with the ring's shared memory; a row too
    long for the ring is refused when the manifest is generated, not at run time."""
    assert gen.gemv_launch("kern_gemv_bf16_tma", 6144, 2560, table=TABLE) == (gen.GEMV_TMA_BLOCKS, 512,
                                                                             gen.GEMV_TMA_SMEM)
    assert gen.gemv_launch("kern_gemv_bf16_tma", 37, 40, table=TABLE) == (37, 512, gen.GEMV_TMA_SMEM)
    assert gen.gemv_launch("kern_gemv_bf16_tma_silu", 9728, 2560, table=TABLE)[2] == gen.GEMV_TMA_SMEM
    # A one-row stage of depth k takes 2k bytes and k / 2 bytes of partials (2.5k); the SiLU form 5k.
    longest = gen.GEMV_TMA_SMEM * 2 // 5 // 8 * 8
    gen.gemv_launch("kern_gemv_bf16_tma", 10, longest, table=TABLE)
    gen.gemv_launch("kern_gemv_bf16_tma_silu", 10, longest // 2 // 8 * 8, table=TABLE)
    with pytest.raises(gen.GenError, match="exceed"):
        gen.gemv_launch("kern_gemv_bf16_tma", 10, longest + 8, table=TABLE)
    with pytest.raises(gen.GenError, match="exceed"):
        gen.gemv_launch("kern_gemv_bf16_tma_silu", 10, longest // 2 // 8 * 8 + 8, table=TABLE)
    m = _manifest({"qkv": "kern_gemv_bf16_tma", "gate_up": "kern_gemv_bf16_tma_silu"})
    qkv = m["ops"]["gemv_tma_6144x2560"]["impl"]["launches"][0]
    assert qkv["grid"] == [gen.GEMV_TMA_BLOCKS, 1, 1] and qkv["shared_mem"] == gen.GEMV_TMA_SMEM
    decode = [c["op"] for c in m["programs"]["decode"]["calls"]]
    assert "gemv_tma_silu_9728x2560" in decode and "silu_mul" not in decode


def test_prefetched_silu_launch_holds_gate_and_up_rows() -> None:
    """`_p4_silu`: a column is its gate and its up row (4k bytes); a row beyond a block's shared
    memory is refused."""
    assert gen.gemv_launch("kern_gemv_bf16_p4_silu", 9728, 2560, table=TABLE) == (3243, 128, 3 * 2 * 5120)
    gen.gemv_launch("kern_gemv_bf16_p4_silu", 10, gen.GEMV_P4_MAX_ROW // 4, table=TABLE)
    with pytest.raises(gen.GenError, match="exceed a block's shared memory"):
        gen.gemv_launch("kern_gemv_bf16_p4_silu", 10, gen.GEMV_P4_MAX_ROW // 4 + 8, table=TABLE)


def test_alt_picks_override_the_product_picks() -> None:
    m = _manifest({"down": "kern_gemv_bf16_s8", "gate_up": "kern_gemv_bf16"})
    decode = {c["label"]: c for c in m["programs"]["decode"]["calls"]}
    assert decode["l0.down"]["op"] == "gemv_s8_2560x9728"
    assert m["ops"]["gemv_s8_2560x9728"]["impl"]["launches"][0]["block"] == [256, 1, 1]
    assert decode["l0.gate_up"]["op"] == "gemv_19456x2560" and "l0.silu_mul" in decode
    assert {la["module"] for op in m["ops"].values() for la in op["impl"]["launches"]
            if la["entry"] in ("kern_gemv_bf16", "kern_gemv_bf16_s8")} == {"gemv_alt"}


def test_deferred_fold_of_a_prefetched_pick_runs_on_its_launch() -> None:
    """With DEFER (the product's fold plus DEFER_P4), a prefetched gate_up pick folds into its
    deferred form on `_p4_silu`'s own launch, and qkv's band pick into the product's band."""
    m = _manifest({"gate_up": "kern_gemv_bf16_p4_silu"}, DEFER, gen.PDL, fuse=True)
    (launch,) = m["ops"]["gemv_p4_silu_d_9728x2560"]["impl"]["launches"]
    grid, _threads, smem = gen.gemv_launch("kern_gemv_bf16_p4_silu", 9728, 2560, table=TABLE)
    assert (launch["entry"], launch["module"], launch["grid"], launch["shared_mem"]) == (
        "kern_gemv_bf16_p4_silu_d", "gemv_defer_p4", [grid, 1, 1], smem)
    assert m["ops"]["gemv_b4_d_6144x2560"]["impl"]["launches"][0]["module"] == "gemv_defer"
    # The product's fold knows no prefetched form: the same pick folds into the SiLU band.
    plain = _manifest({"gate_up": "kern_gemv_bf16_p4_silu"}, gen.DEFER_NORMS, gen.PDL, fuse=True)
    assert "gemv_b4_silu_d_9728x2560" in plain["ops"] and "gemv_p4_silu_d_9728x2560" not in plain["ops"]
