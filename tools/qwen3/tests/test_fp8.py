"""kern_qwen3's FP8-weight manifests (`weights="qwen-fp8"`): what the rewrite binds and launches,
what the plan refuses, and that the checkpoint the provider writes for them fits them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.qwen3_options import manifest, plan_of, verify_manifest

import kern_qwen3 as gen
from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG
from kern_qwen3.provider import QWEN3, fp8_layout

FAST_FP8: dict[str, Any] = {"weights": "qwen-fp8", "gemv": ["lm_head"], "fuse": True, "pdl": True,
                            "feed": "device"}


@pytest.mark.parametrize("kw", [{"weights": "qwen-fp8"}, FAST_FP8], ids=["plain", "fast"])
@pytest.mark.parametrize("config", [QWEN3_TINY_CONFIG, QWEN3_4B_CONFIG], ids=["tiny", "4b"])
def test_fp8_manifest_verifies(config: dict[str, Any], kw: dict[str, Any]) -> None:
    verify_manifest(manifest(config, **kw))


def test_linears_are_e4m3_with_block_scales_bound_beside_them() -> None:
    s = gen.shape_from_config(QWEN3_4B_CONFIG)
    m = manifest(QWEN3_4B_CONFIG, weights="qwen-fp8")
    b = m["buffers"]
    p = "model.layers.3"
    assert b["l3.qkv"]["dtype"] == "fp8e4m3" and b["l3.qkv"]["shape"] == [s.qkv_rows, s.hidden]
    assert b["l3.qkv.scale"] == {
        "dtype": "f32", "shape": [s.qkv_rows // 128, s.hidden // 128], "kind": "weight",
        "bind": [{"tensor": f"{p}.self_attn.{x}_proj.weight_scale_inv"} for x in "qkv"]}
    assert b["l3.gate_up.scale"]["shape"] == [2 * s.inter // 128, s.hidden // 128]
    assert b["l3.down.scale"]["shape"] == [s.hidden // 128, s.inter // 128]
    assert b["l3.o.scale"]["bind"] == [{"tensor": f"{p}.self_attn.o_proj.weight_scale_inv"}]
    for name in ("embed", "final_norm", "l3.in_norm", "l3.q_norm", "l3.post_norm"):
        assert b[name]["dtype"] == "bf16", name
    fp8 = {n for n, v in b.items() if v["dtype"] == "fp8e4m3"}
    assert fp8 == {f"l{i}.{g}" for i in range(s.layers) for g in gen.FP8_GEMMS}


def test_decode_runs_the_fp8_gemv_and_prefill_dequantises_before_the_bf16_gemm() -> None:
    m = manifest(QWEN3_TINY_CONFIG, **FAST_FP8)
    decode = {c["label"]: c for c in m["programs"]["decode"]["calls"]}
    prefill = {c["label"]: c for c in m["programs"]["prefill"]["calls"]}
    qkv = decode["l0.qkv"]
    assert qkv["op"] == "gemv_e4m3_1024x256"
    assert [a["buf"] for a in qkv["args"]] == ["x", "l0.qkv", "l0.qkv.scale", "qkv"]
    launch = m["ops"]["gemv_e4m3_1024x256"]["impl"]["launches"][0]
    assert launch["entry"] == "kern_gemv_e4m3_b128" and launch["grid"] == [256, 1, 1] and launch["pdl"] is True
    assert decode["lm_head"]["op"].startswith("gemv_p4")  # bf16, as the checkpoint has it
    op = m["ops"][prefill["l0.gate_up"]["op"]]
    assert prefill["l0.gate_up"]["op"] == "gemm_e4m3_1536x256"
    assert op["impl"]["scratch"] == {"w": {"dtype": "bf16", "shape": [1536, 256]}}
    dequant, gemm = op["impl"]["launches"]
    assert dequant["entry"] == "kern_dequant_e4m3_b128" and dequant["grid"] == [1536 * 256 // 16 // 256, 1, 1]
    assert gemm["entry"] == "extern:cublaslt_bf16_tn" and gemm["args"][1] == {"scratch": "w"}
    assert prefill["l0.gate_up"]["args"][4] == {"var": "tokens"}
    head = [c["op"] for c in m["programs"]["head"]["calls"]]
    assert "gemv_e4m3_256x512" in head and not any(o.startswith("gemm") for o in head)


def test_decode_reads_about_half_the_bytes_of_bf16() -> None:
    bf16 = gen.decode_weight_bytes(manifest(QWEN3_4B_CONFIG, feed="device", gemv=["lm_head"], fuse=True))
    fp8 = gen.decode_weight_bytes(manifest(QWEN3_4B_CONFIG, **FAST_FP8))
    s = gen.shape_from_config(QWEN3_4B_CONFIG)
    linears = s.layers * sum(n * k for n, k in (
        (s.qkv_rows, s.hidden), (s.hidden, s.heads * s.head_dim), (2 * s.inter, s.hidden), (s.hidden, s.inter)))
    scales = s.layers * 4 * sum(-(-n // 128) * -(-k // 128) for n, k in (
        (s.qkv_rows, s.hidden), (s.hidden, s.heads * s.head_dim), (2 * s.inter, s.hidden), (s.hidden, s.inter)))
    assert bf16 - fp8 == linears - scales
    assert 0.5 < fp8 / bf16 < 0.6


@pytest.mark.parametrize(("kw", "words"), [
    ({"gemv": ["qkv", "lm_head"]}, "qkv run as the FP8 GEMV"),
    ({"rows": 8, "feed": "device"}, "batched step over FP8 weights is not built"),
    ({"gemv": list(gen.GEMV_GEMMS)}, "o, qkv run as the FP8 GEMV"),
    ({"precision": "f32"}, "drop weights"),
    ({"weights": "fp8-e5m2"}, "weights must be one of bf16, qwen-fp8, fp8-dynamic, bf16-to-fp8"),
])
def test_bad_fp8_plans_are_refused(kw: dict[str, Any], words: str) -> None:
    options = {"weights": "qwen-fp8", **kw}
    with pytest.raises(gen.GenError, match=words) as info:
        plan_of(**options)
    assert "\n" not in str(info.value)


def test_the_norm_fold_and_tp_are_refused_over_fp8() -> None:
    with pytest.raises(gen.GenError, match="drop --fold-norm --defer-norm"):
        plan_of(weights="qwen-fp8", fold_norm=True, defer_norm=True)
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    from helpers.qwen3_options import FAKE_ENTRIES, FAKE_HASHES

    with pytest.raises(gen.GenError, match=r"FP8 weights .* not split by rank"):
        gen.generate_tp(shape, FAKE_HASHES, FAKE_ENTRIES, model="t", tp=2, plan=plan_of(weights="qwen-fp8"))


@pytest.mark.parametrize(("change", "words"), [
    ({"intermediate_size": 704}, r"gate_up: FP8 weights need each tensor's rows a multiple of 128.*\[704, 704\]"),
    ({"num_key_value_heads": 1, "head_dim": 64, "num_attention_heads": 4}, r"qkv: .*\[256, 64, 64\]"),
])
def test_shapes_block_scales_cannot_cover_are_refused(change: dict[str, int], words: str) -> None:
    with pytest.raises(gen.GenError, match=words):
        manifest({**QWEN3_TINY_CONFIG, **change}, weights="qwen-fp8")


def test_the_provider_writes_the_checkpoint_an_fp8_manifest_binds(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERN_CACHE_DIR", str(tmp_path))
    root = Path(__file__).resolve().parents[3]
    shipped = json.loads((root / "examples" / "qwen3-tiny-fp8.json").read_text())
    assert fp8_layout(shipped) == "qwen-fp8"
    path, what, written = QWEN3.random_checkpoint(shipped, None)
    assert written and what == "Qwen3 tiny FP8 (qwen-fp8)"
    names = set()
    for f in path.glob("*.safetensors"):
        raw = f.read_bytes()
        header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
        names |= {n for n in header if n != "__metadata__"}
    bound = {seg["tensor"] for b in shipped["buffers"].values() for seg in b.get("bind", ())}
    assert bound <= names


@pytest.mark.parametrize("config", [QWEN3_TINY_CONFIG, QWEN3_4B_CONFIG], ids=["tiny", "4b"])
def test_a_bf16_checkpoint_quantised_at_load(config: dict[str, Any]) -> None:
    """`bf16-to-fp8`: the e4m3 and scale buffers unbound, written by one derive program per layer
    from `.bf16` sources bound to the checkpoint's bf16 tensors; the steps as `qwen-fp8`'s."""
    s = gen.shape_from_config(config)
    m = manifest(config, **{**FAST_FP8, "weights": "bf16-to-fp8"})
    verify_manifest(m)
    stored = manifest(config, **FAST_FP8)
    assert m["programs"]["decode"] == stored["programs"]["decode"]
    assert m["programs"]["prefill"] == stored["programs"]["prefill"]
    b = m["buffers"]
    assert b["l1.o"] == {"dtype": "fp8e4m3", "shape": [s.hidden, s.heads * s.head_dim], "kind": "weight"}
    assert b["l1.o.scale"] == {"dtype": "f32", "shape": [s.hidden // 128, s.heads * s.head_dim // 128],
                               "kind": "weight"}
    assert b["l1.o.bf16"] == {**stored["buffers"]["l1.o"], "dtype": "bf16", "kind": "source"}
    derive = sorted(n for n, p in m["programs"].items() if p.get("derive"))
    assert derive == sorted(f"quantise.l{i}" for i in range(s.layers))
    calls = m["programs"]["quantise.l1"]["calls"]
    assert [c["label"] for c in calls] == [f"l1.{g}.quant" for g in gen.FP8_GEMMS]
    assert [a["buf"] for a in calls[0]["args"]] == ["l1.qkv.bf16", "l1.qkv", "l1.qkv.scale"]
    launch = m["ops"][calls[0]["op"]]["impl"]["launches"][0]
    assert launch["entry"] == gen.QUANT_ENTRY and launch["grid"] == [-(-s.hidden // 128), s.qkv_rows // 128, 1]
    assert fp8_layout(m) is None  # its checkpoint is bf16


def test_the_provider_writes_a_bf16_checkpoint_for_the_load_time_quantiser(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERN_CACHE_DIR", str(tmp_path))
    m = manifest(QWEN3_TINY_CONFIG, weights="bf16-to-fp8")
    m["model"] = "qwen3-tiny-fp8q"
    path, what, _ = QWEN3.random_checkpoint(m, None)
    assert what == "Qwen3 tiny" and "quantization_config" not in json.loads((path / "config.json").read_text())


def test_a_compressed_tensors_fp8_dynamic_checkpoint_binds_its_row_scales() -> None:
    s = gen.shape_from_config(QWEN3_4B_CONFIG)
    m = manifest(QWEN3_4B_CONFIG, **{**FAST_FP8, "weights": "fp8-dynamic"})
    verify_manifest(m)
    b = m["buffers"]
    p = "model.layers.5"
    assert b["l5.qkv"]["dtype"] == "fp8e4m3"
    assert b["l5.qkv.scale"] == {"dtype": "f32", "shape": [s.qkv_rows, 1], "kind": "weight",
                                 "bind": [{"tensor": f"{p}.self_attn.{x}_proj.weight_scale"} for x in "qkv"]}
    assert b["l5.gate_up.scale"]["shape"] == [2 * s.inter, 1]
    decode = {c["label"]: c["op"] for c in m["programs"]["decode"]["calls"]}
    prefill = {c["label"]: c["op"] for c in m["programs"]["prefill"]["calls"]}
    assert decode["l5.down"] == f"gemv_e4m3_row_{s.hidden}x{s.inter}"
    assert prefill["l5.down"] == f"gemm_e4m3_row_{s.hidden}x{s.inter}"
    assert m["ops"][decode["l5.down"]]["impl"]["launches"][0]["entry"] == "kern_gemv_e4m3_row"
    assert m["ops"][prefill["l5.down"]]["impl"]["launches"][0]["entry"] == "kern_dequant_e4m3_row"
    assert fp8_layout(m) == "fp8-dynamic"


def test_row_scales_take_rows_block_scales_cannot() -> None:
    odd = {**QWEN3_TINY_CONFIG, "intermediate_size": 704}
    verify_manifest(manifest(odd, weights="fp8-dynamic"))
    with pytest.raises(gen.GenError, match="rows a multiple of 128"):
        manifest(odd, weights="qwen-fp8")
