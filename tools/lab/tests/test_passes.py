"""The lab's generator passes on the Qwen3-4B shape: what each rewrites, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kern_lab as lab
import kern_qwen3 as gen
from kern_lab.variants import lab_variants
from kern_manifest import load_manifest
from kern_qwen3 import QWEN3_4B_CONFIG

TOOLS = Path(__file__).resolve().parents[2]
ENTRIES = lab.lab_entry_modules(lab_src=TOOLS / "lab" / "kernels-src", product_src=TOOLS / "kernels-src")
HASHES = dict.fromkeys(set(ENTRIES.values()), "c" * 64)
SHAPE = gen.shape_from_config(QWEN3_4B_CONFIG)
EVERY = gen.GEMV_GEMMS


def _manifest(*passes: gen.Pass, gemv: tuple[str, ...] = EVERY, fuse: bool = True,
              picks: dict[str, str] | None = None, shape: gen.Qwen3Shape = SHAPE) -> dict[str, Any]:
    plan = gen.Plan(feed="device", gemv=gemv, fuse=fuse, picks={**gen.GEMV_PICK, **(picks or {})},
                    table=dict(lab.LAB_GEMV_ENTRIES), passes=passes)
    m = gen.generate(shape, HASHES, ENTRIES, model="t", plan=plan)
    load_manifest(json.dumps(m))
    return m


def test_every_lab_variant_generates_a_manifest_the_verifier_accepts() -> None:
    variants = lab_variants({"o": "kern_gemv_bf16"})
    assert len(variants) == 51 and "picked" in variants and "picked" not in lab_variants()
    for name, variant in variants.items():
        m = gen.generate(SHAPE, HASHES, ENTRIES, model=name, plan=variant("device"))
        load_manifest(json.dumps(m))


def test_prologue_fold_runs_the_norms_in_the_following_gemvs_with_a_ping_pong_residual() -> None:
    m = _manifest(lab.FoldNorms(), gen.PDL)
    decode = m["programs"]["decode"]["calls"]
    labels = [c["label"] for c in decode]
    assert len(decode) == 2 + 36 * 8 + 3 - 71  # post_norm x36 and next_norm x35 folded
    assert [lb for lb in labels if lb.endswith("_norm")] == ["l0.in_norm", "l35.next_norm"]
    residuals = [(c["label"], c["args"][0]["buf"], c["args"][3]["buf"]) for c in decode
                 if c["op"].startswith(("gemv_b4_n", "gemv_b4_silu_n"))]
    assert residuals[:3] == [("l0.gate_up", "h", "h2"), ("l1.qkv", "h2", "h"), ("l1.gate_up", "h", "h2")]
    assert len(residuals) == 71 and all(residuals[j][2] == residuals[j + 1][1] for j in range(70))
    qkv = decode[labels.index("l3.qkv")]
    assert [a["buf"] for a in qkv["args"]] == ["h2", "y", "l3.in_norm", "h", "l3.qkv", "qkv"]
    launch = m["ops"][qkv["op"]]["impl"]["launches"][0]
    assert (launch["entry"], launch["grid"][0], launch["shared_mem"]) == ("kern_gemv_bf16_b4_n", 878, 4 * 2560)
    assert launch["pdl"] is True and "h2" in m["buffers"]
    ring = _manifest(lab.FoldNorms(), gen.PDL, picks=dict(lab.variants.RING_PICK))
    assert any(c["op"].startswith("gemv_r4_n_") for c in ring["programs"]["decode"]["calls"])
    with pytest.raises(gen.GenError, match="needs both as our GEMV"):
        _manifest(lab.FoldNorms(), gemv=("o", "gate_up", "lm_head"))
    with pytest.raises(gen.GenError, match="needs gate_up on a SiLU entry"):
        _manifest(lab.FoldNorms(), picks={"gate_up": "kern_gemv_bf16"})


def test_norm_tail_runs_the_norms_in_the_gemvs_before_them() -> None:
    m = _manifest(lab.NormTail(), gen.PDL, picks={"gate_up": "kern_gemv_bf16_p4_silu"})
    decode = m["programs"]["decode"]["calls"]
    labels = [c["label"] for c in decode]
    assert len(decode) == 2 + 36 * 8 + 3 - 72 and [lb for lb in labels if lb.endswith("_norm")] == ["l0.in_norm"]
    tails = [(c["label"], c["args"][3]["buf"], c["args"][5]["buf"]) for c in decode if "_an_" in c["op"]]
    assert tails[:3] == [("l0.o", "h", "h2"), ("l0.down", "h2", "h"), ("l1.o", "h", "h2")] and len(tails) == 72
    assert all(tails[j][2] == tails[j + 1][1] for j in range(71))
    by = {c["label"]: c for c in decode}
    assert [a["buf"] for a in by["l3.o"]["args"]] == ["attn", "l3.o", "y", "h", "l3.post_norm", "h2", "x", "norm_count"]
    assert lab.tail_launch("kern_gemv_bf16_s4", 2560, 4096) == (2560, 128, 4 * 2560)
    assert lab.tail_launch("kern_gemv_bf16_p4", 16384, 512) == (16384 // 64, 128, 65536)
    tail_text = (TOOLS / "lab" / "kernels-src" / "gemv_tail.cu").read_text()
    assert f"constexpr int TAIL_GROUP = {lab.TAIL_GROUP};" in tail_text
    assert f"constexpr int TAIL_STRIDE = {lab.TAIL_STRIDE};" in tail_text
    count = lab.tail_counters(2560)
    assert count == 1 + 32 * 40 and m["buffers"]["norm_count"] == {"dtype": "i32", "shape": [count], "kind": "carry"}
    assert {"label": "norm_count", "op": "zero_i32", "args": [{"buf": "norm_count"}, {"i32": count}]} in \
        m["programs"]["load"]["calls"]
    plain = _manifest(lab.NormTail(), fuse=False)
    assert "zero_i32" in plain["ops"] and "attn_count" not in plain["buffers"]
    with pytest.raises(gen.GenError, match="needs both as our GEMV"):
        _manifest(lab.NormTail(), gemv=("o", "gate_up"))
    with pytest.raises(gen.GenError, match="entry with a tail"):
        _manifest(lab.NormTail(), picks={"o": "kern_gemv_bf16_b4"})


def test_qkn_folds_q_k_norm_into_the_decode_attention() -> None:
    m = _manifest(lab.Qkn(), gen.PDL)
    decode = m["programs"]["decode"]["calls"]
    assert len(decode) == 2 + 36 * 7 + 3 and [c["label"] for c in decode[2:4]] == ["l0.qkv", "l0.attn"]
    assert [a.get("buf", a.get("state")) for a in decode[3]["args"]] == [
        "qkv", "l0.q_norm", "l0.k_norm", "step_pos", "rope_cos", "rope_sin", "kv", "step_slot", "block_table",
        "step_len", "attn", "attn_count"]
    (launch,) = m["ops"]["attn_decode_qkn"]["impl"]["launches"]
    assert (launch["entry"], launch["grid"], launch["pdl"]) == ("kern_attn_decode_qkn", [8, gen.DECODE_SPLITS, 1], True)
    assert any(c["op"] == "qk_norm_rope_kv_rows" for c in m["programs"]["prefill"]["calls"])
    with pytest.raises(gen.GenError, match="needs fuse"):
        _manifest(lab.Qkn(), fuse=False)
    wide = gen.shape_from_config({**QWEN3_4B_CONFIG, "num_attention_heads": 64, "num_key_value_heads": 1})
    with pytest.raises(gen.GenError, match="at most 32 query heads per kv head"):
        _manifest(lab.Qkn(), shape=wide)
    text = (TOOLS / "lab" / "kernels-src" / "attention_qkn.cu").read_text()
    assert f"constexpr int QKN_MAX_GROUP = {lab.QKN_MAX_GROUP};" in text


def test_splits_and_wide_attention_resize_the_fused_attention() -> None:
    plain = _manifest(gen.DEFER_NORMS, gen.PDL)
    for splits, wide in ((lab.DECODE_SPLITS_WIDE, True), (64, False)):
        m = _manifest(gen.DEFER_NORMS, lab.Splits(splits, wide=wide), gen.PDL)
        op, was = m["ops"]["attn_decode_fused"], plain["ops"]["attn_decode_fused"]
        (launch,), (old,) = op["impl"]["launches"], was["impl"]["launches"]
        entry = "kern_attn_decode_wide" if wide else "kern_attn_decode"
        assert old["entry"] == "kern_attn_decode_one" and "shared_mem" not in launch
        assert (launch["entry"], launch["grid"], launch["args"][13]) == (entry, [8, splits, 1], {"i32": splits})
        # kern_attn_decode's args: the rows entry's but its table stride (the 14th)
        assert launch["args"][:13] == old["args"][:13] and launch["args"][14:] == old["args"][15:]
        assert launch["params"] == [*old["params"][:13], *old["params"][14:]]
        assert op["impl"]["scratch"] == {"part_o": {"dtype": "f32", "shape": [splits, 32 * 128]},
                                         "part_lse": {"dtype": "f32", "shape": [splits, 32]}}
        assert m["programs"] == plain["programs"]
    with pytest.raises(gen.GenError, match="needs fuse"):
        _manifest(lab.Splits(), fuse=False)
    with pytest.raises(gen.GenError, match="multiple of 8"):
        _manifest(lab.Splits(12, wide=False))


def test_rows_plan_puts_the_one_row_step_on_the_rows_entry() -> None:
    """RowsPlan swaps the fused attention's entry for kern_attn_decode_rows and changes nothing else
    (the two entries take the same arguments, grid and shared memory); it needs fuse and refuses an
    attention another pass rewrote."""
    plain = _manifest(gen.DEFER_NORMS, gen.PDL)
    m = _manifest(gen.DEFER_NORMS, lab.RowsPlan(), gen.PDL)
    (launch,), (old,) = m["ops"]["attn_decode_fused"]["impl"]["launches"], plain["ops"]["attn_decode_fused"]["impl"]["launches"]
    assert old["entry"] == "kern_attn_decode_one" and launch["entry"] == "kern_attn_decode_rows"
    assert launch["module"] == ENTRIES["kern_attn_decode_rows"]
    assert {k: v for k, v in launch.items() if k not in ("entry", "module")} == \
        {k: v for k, v in old.items() if k not in ("entry", "module")}
    assert m["programs"] == plain["programs"]
    with pytest.raises(gen.GenError, match="needs fuse"):
        _manifest(lab.RowsPlan(), fuse=False)
    with pytest.raises(gen.GenError, match="not kern_attn_decode_one"):
        _manifest(gen.DEFER_NORMS, lab.Splits(), lab.RowsPlan(), gen.PDL)


def test_late_trigger_launches_the_late_attention_entries() -> None:
    for passes, entry in (((), "kern_attn_decode_late"), ((lab.Splits(),), "kern_attn_decode_wide_late")):
        m = _manifest(gen.DEFER_NORMS, *passes, lab.LateTrigger(), gen.PDL)
        plain = _manifest(gen.DEFER_NORMS, *passes, gen.PDL)
        (launch,) = m["ops"]["attn_decode_fused"]["impl"]["launches"]
        (want,) = plain["ops"]["attn_decode_fused"]["impl"]["launches"]
        if want["entry"] == "kern_attn_decode_one":  # the late form is kern_attn_decode's
            want = {k: v for k, v in want.items() if k != "shared_mem"}
            want["params"] = [*want["params"][:13], *want["params"][14:]]
            want["args"] = [*want["args"][:13], *want["args"][14:]]
        assert launch == want | {"entry": entry, "module": ENTRIES[entry]} and launch["pdl"] is True
        assert m["programs"] == plain["programs"]


def test_pdl_off_launches_the_named_gemms_without_pdl_and_nothing_else() -> None:
    m = _manifest(gen.PDL, lab.PdlOff(("gate_up",)))
    decode = m["programs"]["decode"]["calls"]
    for c in decode[1:]:
        pdl = [la.get("pdl") for la in m["ops"][c["op"]]["impl"]["launches"]]
        assert pdl == ([None] if c["label"].endswith(".gate_up") else [True] * len(pdl)), c["label"]
    assert sum(c["op"] == "gemv_silu_9728x2560.nopdl" for c in decode) == 36
    assert "gemv_silu_9728x2560" not in m["ops"]
    with pytest.raises(gen.GenError, match="pdl_off"):
        _manifest(gen.PDL, lab.PdlOff(("attn",)))


def test_carveout_goes_on_every_kernel_launch() -> None:
    m = _manifest(gen.PDL, lab.Carveout(100))
    launches = [la for op in m["ops"].values() for la in op["impl"]["launches"]]
    assert all(la["carveout"] == 100 for la in launches if "module" in la)
    for bad in (-1, 101):
        with pytest.raises(gen.GenError, match="carveout"):
            _manifest(lab.Carveout(bad))


def test_defer_grid_variants_launch_the_deferred_bands_at_fewer_blocks_per_sm() -> None:
    variants = lab_variants()

    def grids(name: str) -> dict[str, int]:
        m = gen.generate(SHAPE, HASHES, ENTRIES, model="t", plan=variants[name]("device"))
        return {op: m["ops"][op]["impl"]["launches"][0]["grid"][0] for op in m["ops"] if op.startswith("gemv_")}

    fast, two = grids("late"), grids("defer2")
    assert fast["gemv_b4_silu_d_9728x2560"] == 512 and fast["gemv_b4_d_6144x2560"] == 512
    # 9728 columns over 264 slots: 37 per block, 263 blocks; 6144: 24 per block, 256 blocks.
    assert two["gemv_b4_silu_d_9728x2560"] == 263 and two["gemv_b4_d_6144x2560"] == 256


def test_ring_variants_size_their_wave_and_stages() -> None:
    one, three = (lab.ring_table(1, 131072), lab.ring_table(3, 40960))
    assert gen.gemv_launch("kern_gemv_bf16_r4", 6144, 2560, table=one)[0] == -(-6144 // -(-6144 // 132))
    assert gen.gemv_launch("kern_gemv_bf16_r4", 6144, 2560, table=three)[0] == -(-6144 // -(-6144 // 396))
    ring_text = (TOOLS / "lab" / "kernels-src" / "gemv_ring.cu").read_text()
    assert f"constexpr int RING_MAX_STAGES = {gen.GEMV_RING_MAX_STAGES};" in ring_text
