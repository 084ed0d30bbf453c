"""kern_qwen3.generate: manifests for a tiny Qwen3 and the 4B shape, checked against the verifier,
the shapes, the Hugging Face tensor names and the kernel sources' signatures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.qwen3_options import (
    FAKE_ENTRIES,
    FAKE_HASHES,
    assert_abi,
    c_params,
    manifest,
    verify_manifest,
)
from helpers.qwen3_options import generate as _generate

import kern_qwen3 as gen
from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG, qwen3_tensor_shapes

TOOLS = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("feed", ["host", "device"])
@pytest.mark.parametrize("config", [QWEN3_TINY_CONFIG, QWEN3_4B_CONFIG], ids=["tiny", "4b"])
def test_manifest_verifies(config: dict[str, Any], feed: str) -> None:
    verify_manifest(manifest(config, feed=feed))


def test_device_feed_reads_carries_seeded_by_start() -> None:
    m = manifest(QWEN3_TINY_CONFIG, feed="device")
    decode = m["programs"]["decode"]["calls"]
    read = {a["buf"] for c in decode for a in c["args"] if "buf" in a}
    assert {"step_ids", "step_pos", "step_slot", "step_len"} <= read
    assert not {"ids", "positions", "slots", "seq_len"} & read
    assert decode[-1]["op"] == "decode_advance"
    start = m["programs"]["start"]["calls"]
    assert [(c["args"][0]["buf"], c["args"][1]["buf"]) for c in start] == [
        ("ids", "step_ids"), ("positions", "step_pos"), ("slots", "step_slot"), ("seq_len", "step_len")]
    host = manifest(QWEN3_TINY_CONFIG, feed="host")
    assert "start" not in host["programs"] and "decode_advance" not in host["ops"]
    assert "step_ids" not in host["buffers"]
    with pytest.raises(gen.GenError, match="feed"):
        manifest(QWEN3_TINY_CONFIG, feed="both")


def test_untied_manifest_verifies_and_reads_lm_head() -> None:
    m = manifest({**QWEN3_TINY_CONFIG, "tie_word_embeddings": False})
    verify_manifest(m)
    head = next(c for c in m["programs"]["decode"]["calls"] if c["label"] == "lm_head")
    assert head["args"][1] == {"buf": "lm_head"}
    assert m["buffers"]["lm_head"]["bind"] == [{"tensor": "lm_head.weight"}]


@pytest.mark.parametrize(("config", "layers"), [(QWEN3_TINY_CONFIG, 2), (QWEN3_4B_CONFIG, 36)])
def test_call_counts(config: dict[str, Any], layers: int) -> None:
    progs = manifest(config, feed="device")["programs"]
    # embed + first norm; per layer 4 attention + 6 MLP calls; lm_head, argmax, advance.
    assert len(progs["decode"]["calls"]) == 2 + 10 * layers + 3
    assert len(manifest(config, feed="host")["programs"]["decode"]["calls"]) == 2 + 10 * layers + 2
    # prefill stops after the last layer's KV write: its attention output is never read.
    assert len(progs["prefill"]["calls"]) == 2 + 10 * (layers - 1) + 3
    assert progs["prefill"]["calls"][-1]["label"] == f"l{layers - 1}.kv_write"
    assert [c["op"] for c in progs["load"]["calls"]] == ["rope_table"]
    assert progs["decode"]["graph"] is True and "graph" not in progs["prefill"]


def test_4b_decode_reads_8_04_gb_of_weights() -> None:
    m = manifest(QWEN3_4B_CONFIG)
    h, d, inter, vocab = 2560, 128, 9728, 151936
    per_layer = (32 + 16) * d * h + h * 32 * d + 2 * inter * h + h * inter + 2 * h + 2 * d
    expected = 2 * (36 * per_layer + vocab * h + h)
    assert gen.decode_weight_bytes(m) == expected
    assert round(expected / 1e9, 2) == 8.04
    shapes = gen.decode_gemm_shapes(m)
    assert len(shapes) == 36 * 4 + 1
    assert shapes[:4] == [("l0.qkv", 1, 6144, h), ("l0.o", 1, h, 4096), ("l0.gate_up", 1, 2 * inter, h),
                          ("l0.down", 1, h, inter)]
    assert shapes[-1] == ("embed", 1, vocab, h)


def test_weights_bind_every_checkpoint_tensor_once() -> None:
    for config in (QWEN3_TINY_CONFIG, {**QWEN3_TINY_CONFIG, "tie_word_embeddings": False}):
        m = manifest(config)
        bound = [seg["tensor"] for b in m["buffers"].values() if b["kind"] == "weight" for seg in b["bind"]]
        shapes = qwen3_tensor_shapes(config)
        assert sorted(bound) == sorted(shapes)
        for b in (b for b in m["buffers"].values() if b["kind"] == "weight"):
            rows = sum(shapes[seg["tensor"]][0] for seg in b["bind"])
            cols = {shapes[seg["tensor"]][1:] for seg in b["bind"]}
            assert (rows, *cols.pop()) == tuple(b["shape"]) and not cols


def test_qkv_and_gate_up_concatenate_in_order() -> None:
    b = manifest(QWEN3_4B_CONFIG)["buffers"]
    p = "model.layers.7"
    assert [s["tensor"] for s in b["l7.qkv"]["bind"]] == [f"{p}.self_attn.{x}_proj.weight" for x in "qkv"]
    assert [s["tensor"] for s in b["l7.gate_up"]["bind"]] == [f"{p}.mlp.gate_proj.weight",
                                                              f"{p}.mlp.up_proj.weight"]
    assert b["l7.qkv"]["shape"] == [6144, 2560] and b["l7.gate_up"]["shape"] == [19456, 2560]


def test_kv_layout_offsets_and_strides() -> None:
    m = manifest(QWEN3_4B_CONFIG)
    assert m["states"]["kv"] == {"bytes_per_token": 36 * 2 * 8 * 128 * 2, "slices": 36}
    writes = [c for c in m["programs"]["decode"]["calls"] if c["op"] == "kv_write"]
    assert [c["args"][1].get("offset", 0) for c in writes] == [i * 2 * 16 * 8 * 128 * 2 for i in range(36)]
    assert writes[0]["args"][-1] == {"i64": 36 * 2 * 16 * 8 * 128}
    # the per-layer offsets stay inside one page
    assert writes[-1]["args"][1]["offset"] + 2 * 16 * 8 * 128 * 2 == 16 * m["states"]["kv"]["bytes_per_token"]


@pytest.mark.parametrize("options", [{}, {"gemv": list(gen.GEMV_GEMMS), "fuse": True, "pdl": True, "fold_norm": True,
                                          "defer_norm": True, "rows": 8},
                                     {"precision": "f32"}])
def test_every_kv_argument_touches_only_its_own_layer_s_slice(options: dict[str, Any]) -> None:
    """The promise `slices` makes: a call of layer l reaches the kv pages only in slice l."""
    m = manifest(QWEN3_4B_CONFIG, feed="device", **options)
    kv = m["states"]["kv"]
    assert kv["slices"] == 36
    slice_bytes = 16 * kv["bytes_per_token"] // 36
    seen = 0
    for program in m["programs"].values():
        for call in program["calls"]:
            for arg in call["args"]:
                if arg.get("state") == "kv":
                    layer = int(call["label"].split(".")[0].removeprefix("l").removeprefix("head_l"))
                    assert arg.get("offset", 0) // slice_bytes == layer, call["label"]
                    seen += 1
    assert seen >= 2 * 36


def test_inputs_outputs_and_vars() -> None:
    m = manifest(QWEN3_4B_CONFIG, chunk=1024)
    b = m["buffers"]
    assert m["vars"] == {"tokens": {"max": 1024}}
    assert {k: (v["dtype"], v["shape"]) for k, v in b.items() if v["kind"] == "input"} == {
        "ids": ("i64", ["tokens"]), "positions": ("i64", ["tokens"]), "slots": ("i64", ["tokens"]),
        "seq_len": ("i32", [1]), "block_table": ("i32", [40960 // 16 + 1]), "head_row": ("i64", [1]),
    }
    assert {k: (v["dtype"], v["shape"]) for k, v in b.items() if v["kind"] == "output"} == {
        "logits": ("bf16", [1, 151936]), "next_token": ("i64", [1]),
    }
    assert b["rope_cos"]["shape"] == [40960, 64]
    assert b["ids"]["domain"] == {"min": 0, "max": 151935}
    assert b["block_table"]["domain"] == {"index_into": "kv", "stride": 16}
    assert b["slots"]["domain"] == {"index_into": "kv"}
    assert b["head_row"] == {"dtype": "i64", "shape": [1], "kind": "input", "fill": "span_at",
                             "domain": {"index_into": "h"}}


def test_kernel_errors() -> None:
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    partial = {k: v for k, v in FAKE_ENTRIES.items() if k != "kern_argmax_final"}
    with pytest.raises(gen.KernelsError, match="kern_argmax_final"):
        _generate(shape, FAKE_HASHES, partial, model="t")
    with pytest.raises(gen.KernelsError, match="qwen3_attn"):
        _generate(shape, {"qwen3_core": "a" * 64}, FAKE_ENTRIES, model="t")
    with pytest.raises(gen.GenError, match="chunk"):
        _generate(shape, FAKE_HASHES, FAKE_ENTRIES, model="t", chunk=0)


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"head_dim": 96}, "head_dim 96"),
        ({"num_attention_heads": 24, "num_key_value_heads": 2}, "12 query heads"),
        ({"hidden_size": 260}, "hidden_size 260"),
        ({"intermediate_size": 770}, "intermediate_size 770"),
    ],
)
def test_shapes_our_kernels_cannot_run_are_refused(change: dict[str, int], word: str) -> None:
    with pytest.raises(gen.KernelsError, match=word):
        manifest({**QWEN3_TINY_CONFIG, **change})


def test_manifest_abi_matches_kernel_sources() -> None:
    src = TOOLS / "kernels-src"
    entries = gen.entry_modules(src)
    feed = "device" if all(e in entries for e in gen.DEVICE_FEED_ENTRIES) else "host"
    hashes = dict.fromkeys(set(entries.values()), "c" * 64)
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    fast = _generate(shape, hashes, entries, model="t", feed=feed, gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True)
    plain = _generate(shape, hashes, entries, model="t", feed=feed)
    fold = _generate(shape, hashes, entries, model="t", feed=feed, gemv=list(gen.GEMV_GEMMS), fold_norm=True,
                     defer_norm=True)
    fp8 = _generate(shape, hashes, entries, model="t", feed=feed, gemv=["lm_head"], fuse=True, pdl=True,
                    weights="bf16-to-fp8")
    ops = plain["ops"] | fast["ops"] | fold["ops"] | fp8["ops"]
    dyn = _generate(shape, hashes, entries, model="t", feed=feed, weights="fp8-dynamic")
    ops |= dyn["ops"]
    assert {op for op in ops if op.startswith("gemv_e4m3_row")} == {
        "gemv_e4m3_row_1024x256", "gemv_e4m3_row_256x512", "gemv_e4m3_row_1536x256", "gemv_e4m3_row_256x768"}
    assert {op for op in ops if op.startswith("quant_e4m3")} == {
        "quant_e4m3_1024x256", "quant_e4m3_256x512", "quant_e4m3_1536x256", "quant_e4m3_256x768"}
    assert {op for op in ops if op.startswith("gemv")} == {
        "gemv_b4_1024x256", "gemv_s4_256x512", "gemv_silu_768x256", "gemv_p4_256x768", "gemv_p4_4096x256",
        "gemv_b4_d_1024x256", "gemv_b4_silu_d_768x256", "gemv_e4m3_1024x256", "gemv_e4m3_256x512",
        "gemv_e4m3_1536x256", "gemv_e4m3_256x768", "gemv_e4m3_row_1024x256", "gemv_e4m3_row_256x512",
        "gemv_e4m3_row_1536x256", "gemv_e4m3_row_256x768"}
    assert {op for op in ops if op.startswith("gemm_e4m3")} == {
        f"gemm_e4m3{form}_{nk}" for form in ("", "_row") for nk in ("1024x256", "256x512", "1536x256", "256x768")}
    assert_abi(ops, c_params(src))


def test_examples_are_what_the_generator_writes() -> None:
    """examples/ are regenerated artifacts: same structure as a fresh generation (hashes aside)."""
    root = TOOLS.parent
    fast: dict[str, Any] = {"gemv": list(gen.GEMV_GEMMS), "fuse": True, "pdl": True, "fold_norm": True,
                            "defer_norm": True}
    shipped_sets = [("qwen3-4b", QWEN3_4B_CONFIG, {}), ("qwen3-tiny", QWEN3_TINY_CONFIG, {}),
                    ("qwen3-4b-gemv", QWEN3_4B_CONFIG, {"gemv": list(gen.GEMV_DEFAULT)}),
                    ("qwen3-4b-fast", QWEN3_4B_CONFIG, {**fast, "gemm_algos": "h200"}),
                    ("qwen3-4b-f32", QWEN3_4B_CONFIG, {"precision": "f32"}),
                    ("qwen3-4b-batch", QWEN3_4B_CONFIG, {**fast, "gemm_algos": "h200", "rows": 64}),
                    ("qwen3-tiny-batch", QWEN3_TINY_CONFIG, {"rows": 8}),
                    ("qwen3-4b-fp8", QWEN3_4B_CONFIG, {"weights": "qwen-fp8", "gemv": ["lm_head"], "fuse": True,
                                                       "pdl": True, "gemm_algos": "h200"}),
                    ("qwen3-tiny-fp8", QWEN3_TINY_CONFIG, {"weights": "qwen-fp8"}),
                    ("qwen3-4b-fp8-from-bf16", QWEN3_4B_CONFIG, {"weights": "bf16-to-fp8", "gemv": ["lm_head"],
                                                                 "fuse": True, "pdl": True, "gemm_algos": "h200"}),
                    ("qwen3-4b-fp8-dynamic", QWEN3_4B_CONFIG, {"weights": "fp8-dynamic", "gemv": ["lm_head"],
                                                               "fuse": True, "pdl": True, "gemm_algos": "h200"})]
    for name, config, kw in shipped_sets:
        shipped = json.loads((root / "examples" / f"{name}.json").read_text())
        entries = gen.entry_modules(TOOLS / "kernels-src")
        # NOTE: the hashes of the modules the manifest pins, and no other, generate it
        hashes = {m: v["sha256"] for m, v in shipped["modules"].items()}
        fresh = _generate(gen.shape_from_config(config), hashes, entries, model=name, feed="device", **kw)
        assert shipped == fresh


def test_decode_gemms_can_run_as_our_gemv() -> None:
    m = manifest(QWEN3_4B_CONFIG, feed="device", gemv=["o", "gate_up", "lm_head"])
    verify_manifest(m)
    decode = {c["label"]: c for c in m["programs"]["decode"]["calls"]}
    assert decode["l3.o"]["op"] == "gemv_s4_2560x4096" and decode["l3.qkv"]["op"] == "gemm"
    assert decode["lm_head"] == {"label": "lm_head", "op": "gemv_p4_151936x2560",
                                 "args": [{"buf": "x"}, {"buf": "embed"}, {"buf": "logits"}]}
    assert m["ops"]["gemv_s4_2560x4096"]["impl"]["launches"][0]["grid"] == [2560, 1, 1]
    # gate_up runs the SiLU-and-mul GEMV: it reads the whole [2 * inter, hidden] weight, writes act.
    assert decode["l3.gate_up"]["args"] == [{"buf": "x"}, {"buf": "l3.gate_up"}, {"buf": "act"}]
    assert "l3.silu_mul" not in decode
    launch = m["ops"]["gemv_silu_9728x2560"]["impl"]["launches"][0]
    assert launch["entry"] == "kern_gemv_bf16_silu" and launch["grid"] == [2432, 1, 1] and launch["block"] == [128, 1, 1]
    assert launch["args"][3:] == [{"i32": 1}, {"i32": 9728}, {"i32": 2560}, {"i32": 9728}]
    assert all(c["op"] == "gemm" for c in m["programs"]["prefill"]["calls"] if c["label"].endswith((".o", ".down")))
    assert gen.decode_gemm_shapes(m) == gen.decode_gemm_shapes(manifest(QWEN3_4B_CONFIG, feed="device"))
    assert gen.decode_weight_bytes(m) == gen.decode_weight_bytes(manifest(QWEN3_4B_CONFIG, feed="device"))
    with pytest.raises(gen.GenError, match="choose from"):
        manifest(QWEN3_TINY_CONFIG, gemv=["attn"])
    every = manifest(QWEN3_TINY_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS))
    verify_manifest(every)
    assert not any(c["op"] == "gemm" for c in every["programs"]["decode"]["calls"])


def test_gemv_picks_follow_the_entry_table() -> None:
    m = manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS))
    for label, op, entry, grid in [("l0.qkv", "gemv_b4_6144x2560", "kern_gemv_bf16_b4", 878),
                                   ("l0.o", "gemv_s4_2560x4096", "kern_gemv_bf16_s4", 2560),
                                   ("l0.down", "gemv_p4_2560x9728", "kern_gemv_bf16_p4", 2560),
                                   ("lm_head", "gemv_p4_151936x2560", "kern_gemv_bf16_p4", 25323)]:
        call = next(c for c in m["programs"]["decode"]["calls"] if c["label"] == label)
        launch = m["ops"][call["op"]]["impl"]["launches"][0]
        assert (call["op"], launch["entry"], launch["grid"][0]) == (op, entry, grid)


def test_fused_step_has_one_attention_launch_and_no_kv_write() -> None:
    m = manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True)
    decode = m["programs"]["decode"]["calls"]
    # per layer: qkv, qk_norm_rope_kv, attn, o, post_norm, gate_up (+ silu), down, next_norm
    assert len(decode) == 2 + 36 * 8 + 3
    assert [c["label"] for c in decode[2:10]] == [
        "l0.qkv", "l0.qk_norm_rope_kv", "l0.attn", "l0.o", "l0.post_norm", "l0.gate_up", "l0.down", "l0.next_norm"]
    attn = m["ops"][decode[4]["op"]]
    (launch,) = attn["impl"]["launches"]
    assert (launch["entry"], launch["grid"], launch["block"], launch["shared_mem"]) == (
        "kern_attn_decode_one", [8, gen.DECODE_SPLITS, 1], [128, 1, 1], gen.decode_rows_smem(128))
    assert launch["args"][13:15] == [{"i32": m["buffers"]["block_table"]["shape"][0]}, {"i32": gen.DECODE_SPLITS}]
    assert attn["impl"]["scratch"]["part_o"]["shape"] == [gen.DECODE_SPLITS, 32 * 128]
    assert decode[4]["args"][-1] == {"buf": "attn_count"}
    assert m["buffers"]["attn_count"] == {"dtype": "i32", "shape": [8], "kind": "carry"}
    load = m["programs"]["load"]["calls"]
    assert load[-1] == {"label": "attn_count", "op": "zero_i32", "args": [{"buf": "attn_count"}, {"i32": 8}]}
    prefill = [c["label"] for c in m["programs"]["prefill"]["calls"]]
    assert prefill[-2:] == ["l35.qkv", "l35.qk_norm_rope_kv"] and not any("kv_write" in p for p in prefill)
    rows_op = m["programs"]["prefill"]["calls"][-1]["op"]
    assert rows_op == "qk_norm_rope_kv_rows" and decode[3]["op"] == "qk_norm_rope_kv"
    (rows_launch,) = m["ops"][rows_op]["impl"]["launches"]
    assert (rows_launch["entry"], rows_launch["grid"], rows_launch["block"]) == (
        "kern_qk_norm_rope_kv_rows", ["tokens", 6, 1], [256, 1, 1])
    kv = decode[3]["args"][6]
    assert kv == {"state": "kv"} and decode[3]["args"][-1] == {"i64": 36 * 2 * 16 * 8 * 128}


def test_gemv_pick_overrides_the_table() -> None:
    every = list(gen.GEMV_GEMMS)
    m = manifest(QWEN3_4B_CONFIG, feed="device", gemv=every, gemv_pick={"down": "kern_gemv_bf16_b4",
                                                                         "gate_up": "kern_gemv_bf16_s4"})
    verify_manifest(m)
    decode = {c["label"]: c for c in m["programs"]["decode"]["calls"]}
    assert decode["l0.down"]["op"] == "gemv_b4_2560x9728"
    assert m["ops"]["gemv_b4_2560x9728"]["impl"]["launches"][0]["grid"] == [gen.gemv_launch(
        "kern_gemv_bf16_b4", 2560, 9728)[0], 1, 1]
    assert decode["l0.gate_up"]["op"] == "gemv_s4_19456x2560" and "l0.silu_mul" in decode
    assert decode["l0.o"]["op"] == f"gemv{gen.GEMV_PICK['o'].removeprefix('kern_gemv_bf16')}_2560x4096"
    for bad in ({"attn": "kern_gemv_bf16_s4"}, {"o": "kern_gemv_fast"}, {"o": "kern_gemv_bf16_silu"},
                {"o": "kern_gemv_bf16_s8"}):
        with pytest.raises(gen.GenError, match="picks: "):
            manifest(QWEN3_4B_CONFIG, feed="device", gemv=every, gemv_pick=bad)


# ------------------------------------------------------------------------------ --capture

def test_the_decode_attention_constants_are_the_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator's copies of the decode attention entries' block shape and limits are the
    headers': kern_attn_decode_rows (the batched step) has no cluster shape, so any split count
    builds a batched manifest; kern_attn_decode_one (the fused one-row step) runs in clusters of 8
    blocks along y (the `__cluster_dims__` in attention_one.cu), so another split count is refused
    before a fused manifest exists."""
    src = TOOLS / "kernels-src"
    rows = (src / "attention.cuh").read_text() + (src / "attention.cu").read_text()
    one = (src / "attention_cluster.cuh").read_text() + (src / "attention_one.cu").read_text()
    assert "__cluster_dims__" not in rows
    assert f"constexpr int DEC_CLUSTER = {gen.DECODE_CLUSTER};" in one
    assert "__cluster_dims__(1, DEC_CLUSTER, 1)\nkern_attn_decode_one(" in one
    for name, value in (("ROWS_WARPS", gen.DECODE_ROWS_WARPS), ("ROWS_STAGES", gen.DECODE_ROWS_STAGES)):
        # NOTE: a lab build may set these before including the header; the product takes the defaults
        assert f"#ifndef KERN_{name}\n#define KERN_{name} {value}\n#endif" in rows
        assert f"constexpr int {name} = KERN_{name};" in rows
    assert f"constexpr int ROWS_MAX_GROUP = {gen.DECODE_ROWS_MAX_GROUP};" in rows
    assert "return ROWS_WARPS * ROWS_STAGES * (d / 8) * 32 * 16;" in rows
    assert gen.decode_rows_smem(128) == 96 * 1024 and gen.decode_rows_smem(64) == 48 * 1024
    assert gen.DECODE_SPLITS % gen.DECODE_CLUSTER == 0
    monkeypatch.setattr("kern_qwen3.ops.DECODE_SPLITS", 12)
    monkeypatch.setattr("kern_qwen3._finish.DECODE_SPLITS", 12)
    m = manifest(QWEN3_TINY_CONFIG, feed="device", rows=4)
    verify_manifest(m)
    grids = [la["grid"] for op in m["ops"].values() for la in op["impl"].get("launches", [])
             if la.get("entry") == "kern_attn_decode_rows"]
    assert grids and all(g[1] == 12 for g in grids)
    for kw in ({"fuse": True}, {"fuse": True, "rows": 4}):
        with pytest.raises(gen.KernelsError, match="DECODE_SPLITS 12"):
            manifest(QWEN3_TINY_CONFIG, feed="device", **kw)


def test_fused_attention_holds_at_most_16_query_heads_per_kv_head() -> None:
    """kern_attn_decode_rows' two head tiles of 8 (the fused step's and the batched step's); the
    unfused pair takes wider groups."""
    wide = {**QWEN3_4B_CONFIG, "num_attention_heads": 64, "num_key_value_heads": 2}
    manifest(wide, feed="device")
    for kw in ({"fuse": True}, {"rows": 4}):
        with pytest.raises(gen.KernelsError, match="32 query heads per kv head in kern_attn_decode_rows"):
            manifest(wide, feed="device", **kw)
    manifest({**QWEN3_4B_CONFIG, "num_attention_heads": 64, "num_key_value_heads": 4}, feed="device", fuse=True)


# --------------------------------------------------------------------------------------------
# Reference precision (`precision="f32"`).


# --------------------------------------------------------------------------------------------
# The batched decode step (`rows`).


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("config", [QWEN3_TINY_CONFIG, QWEN3_4B_CONFIG], ids=["tiny", "4b"])
def test_rows_add_the_batched_step_and_keep_the_one_row_step(config: dict[str, Any], fuse: bool) -> None:
    kw: dict[str, Any] = {"feed": "device", "fuse": fuse}
    one, many = manifest(config, **kw), manifest(config, rows=16, **kw)
    verify_manifest(many)
    for prog in ("decode", "prefill", "start"):
        assert many["programs"][prog] == one["programs"][prog]
    assert many["vars"] == {**one["vars"], "rows": {"max": 16}}
    rows = many["programs"]["decode_rows"]
    assert rows["batch"] == {"groups": 16, "rows": 1} and rows["graph"]
    read = {a["buf"] for c in rows["calls"] for a in c["args"] if "buf" in a}
    assert {"row_ids", "row_pos", "row_slot", "row_len", "block_table"} <= read
    assert not {"ids", "positions", "slots", "seq_len", "step_ids", "logits"} & read
    assert {a["var"] for c in rows["calls"] for a in c["args"] if "var" in a} == {"rows"}
    ops = {c["op"] for c in rows["calls"]}
    assert not {"gemv", "attn_decode", "attn_decode_fused"} & ops and "attn_decode_rows" in ops
    assert all(c["op"] == "gemm" for c in rows["calls"] if c["label"].endswith((".qkv", ".o", ".down", "lm_head")))
    assert [c["op"] for c in rows["calls"][-3:]] == ["gemm", "sample_rows", "rows_advance"]
    assert many["ops"]["embed.rows"]["impl"]["launches"][0]["grid"] == ["rows", 1, 1]
    attn = many["ops"]["attn_decode_rows"]["impl"]["launches"][0]
    assert attn["entry"] == "kern_attn_decode_rows" and attn["grid"] == [config["num_key_value_heads"], gen.DECODE_SPLITS, "rows"]
    assert many["buffers"]["block_table"]["shape"] == [16, one["buffers"]["block_table"]["shape"][0]]
    assert {many["buffers"][b]["fill"] for b in ("row_valid", "row_sampling", "row_seed", "row_logprobs", "row_top")} \
        == {"valid", "sampling", "seed", "logprobs", "top_tokens"}
    assert many["programs"]["load"]["calls"][-1]["args"] == [{"buf": "row_count"}, {"i32": 16 * config["num_key_value_heads"]}]
    assert [c["op"] for c in many["programs"]["seed_rows"]["calls"]] == ["rows_seed"]


def test_rows_ops_match_the_kernel_signatures() -> None:
    src = TOOLS / "kernels-src"
    entries = gen.entry_modules(src)
    hashes = dict.fromkeys(set(entries.values()), "c" * 64)
    m = _generate(gen.shape_from_config(QWEN3_4B_CONFIG), hashes, entries, model="t", feed="device", fuse=True,
                  rows=8)
    assert_abi(m["ops"], c_params(src))


@pytest.mark.parametrize(("kw", "words"), [
    ({"rows": 1}, "rows 1 must be an integer >= 2"),
    ({"rows": True}, "rows True must be an integer >= 2"),
    ({"rows": 4, "feed": "host"}, "rows needs feed device"),
    ({"rows": 4, "feed": "device", "precision": "f32"}, "rows needs feed device and precision bf16"),
    ({"rows": 64, "feed": "device", "chunk": 32}, "rows 64 exceeds the chunk 32"),
])
def test_bad_rows_are_refused(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(gen.GenError, match=words) as info:
        gen.Plan(**kw)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------------------------
# The head program.

_FAST: dict[str, Any] = {"gemv": list(gen.GEMV_GEMMS), "fuse": True, "pdl": True, "fold_norm": True,
                         "defer_norm": True}


@pytest.mark.parametrize(("kw", "tail"), [
    ({"feed": "device"}, ["l1.attn", "l1.o", "l1.post_norm", "l1.gate_up", "l1.silu_mul", "l1.down", "l1.next_norm",
                          "lm_head", "argmax", "advance"]),
    ({"feed": "host"}, ["l1.attn", "l1.o", "l1.post_norm", "l1.gate_up", "l1.silu_mul", "l1.down", "l1.next_norm",
                        "lm_head", "argmax"]),
    ({"feed": "device", "gemv": list(gen.GEMV_DEFAULT)},
     ["l1.attn", "l1.o", "l1.post_norm", "l1.gate_up", "l1.down", "l1.next_norm", "lm_head", "argmax", "advance"]),
    ({"feed": "device", **_FAST}, ["l1.attn", "l1.o", "l1.gate_up", "l1.down", "l1.next_norm", "lm_head", "argmax",
                                   "advance"]),
    ({"feed": "device", **_FAST, "rows": 8}, ["l1.attn", "l1.o", "l1.gate_up", "l1.down", "l1.next_norm", "lm_head",
                                              "argmax", "advance"]),
], ids=["plain", "host", "gemv", "fast", "batch"])
def test_the_head_continues_the_decode_program_from_the_last_attention(kw: dict[str, Any], tail: list[str]) -> None:
    """The head: the start copies (device-fed), the two row gathers, then the decode program's own
    calls from the last layer's attention on, reading the one-row copies of h and qkv."""
    m = manifest(QWEN3_TINY_CONFIG, **kw)
    verify_manifest(m)
    head, decode = m["programs"]["head"], m["programs"]["decode"]["calls"]
    assert head["batch"] == {"groups": 1, "rows": 1} and head["graph"] is True
    seed = ["start.ids", "start.positions", "start.slots", "start.seq_len"] if kw["feed"] == "device" else []
    assert [c["label"] for c in head["calls"]] == [*seed, "head.h", "head.qkv", *tail]
    gathers = head["calls"][len(seed):len(seed) + 2]
    assert [(c["op"], [a.get("buf", a) for a in c["args"]]) for c in gathers] == [
        ("embed", ["head_row", "h", "head_h", {"i32": 256}]), ("embed", ["head_row", "qkv", "head_qkv", {"i32": 1024}])]
    names = {"h": "head_h", "qkv": "head_qkv"}
    want = [{**c, "args": [{**a, "buf": names[a["buf"]]} if a.get("buf") in names else a for a in c["args"]]}
            for c in decode[-len(tail):]]
    assert head["calls"][-len(tail):] == want
    assert head["calls"][len(seed) + 2]["args"][0] == {"buf": "head_qkv"}
    b = m["buffers"]
    assert (b["h"]["kind"], b["qkv"]["kind"]) == ("carry", "carry")
    assert b["head_h"] == {"dtype": "bf16", "shape": [1, 256], "kind": "workspace"}
    assert b["head_qkv"] == {"dtype": "bf16", "shape": [1, 1024], "kind": "workspace"}
    assert b["head_row"]["fill"] == "span_at" and b["head_row"]["domain"] == {"index_into": "h"}
    if kw.get("pdl"):
        assert all(m["ops"][c["op"]]["impl"]["launches"][0].get("pdl") for c in head["calls"][len(seed) + 2:])
        assert not any(m["ops"][c["op"]]["impl"]["launches"][0].get("pdl") for c in head["calls"][:len(seed) + 2])


def test_the_head_reads_what_the_chunk_program_left() -> None:
    """The head reads h and qkv before writing them: as workspaces (dead between runs) the verifier
    refuses it, which is why they are carries."""
    from kern_manifest import ManifestRejected

    m = manifest(QWEN3_TINY_CONFIG, feed="device")
    m["buffers"]["h"]["kind"] = "workspace"
    with pytest.raises(ManifestRejected) as info:
        verify_manifest(m)
    assert any("reads workspace 'h' before this program writes it" in p.line() for p in info.value.problems)


def test_no_head_where_it_does_not_apply() -> None:
    """No head in f32 and tensor-parallel manifests, with `Plan(head=False)`, or when the decode
    program's last attention is not one the head continues from (a rewrite fused the q/k norm into
    it); the rest of the manifest is what it was."""
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    f32 = _generate(shape, FAKE_HASHES, FAKE_ENTRIES, model="t", feed="device", precision="f32")
    assert "head" not in f32["programs"] and "head_row" not in f32["buffers"]
    tp = gen.generate_tp(gen.shape_from_config(QWEN3_4B_CONFIG), FAKE_HASHES, FAKE_ENTRIES, model="t", tp=2,
                         plan=gen.Plan(feed="device"))
    assert "head" not in tp["programs"] and tp["buffers"]["h"]["kind"] == "workspace"
    off = gen.generate(shape, FAKE_HASHES, FAKE_ENTRIES, model="t", plan=gen.Plan(feed="device", head=False))
    on = manifest(QWEN3_TINY_CONFIG, feed="device")
    assert "head" not in off["programs"] and off["programs"] == {k: v for k, v in on["programs"].items() if k != "head"}
    decode = [dict(c) for c in on["programs"]["decode"]["calls"]]
    assert gen.head_calls(shape, decode, "device") is not None
    attn = next(i for i, c in enumerate(decode) if c["label"] == "l1.attn")
    decode[attn] = {**decode[attn], "op": "attn_decode_qkn"}
    assert gen.head_calls(shape, decode, "device") is None
    assert gen.head_calls(shape, [c for c in decode if c["label"] != "l1.attn"], "device") is None
