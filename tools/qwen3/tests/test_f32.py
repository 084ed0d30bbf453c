"""kern_qwen3.f32: the reference-precision manifest."""

from __future__ import annotations

import json
import math
import re
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
from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG

TOOLS = Path(__file__).resolve().parents[2]


def test_f32_literals_are_floats() -> None:
    text = json.dumps(manifest({**QWEN3_TINY_CONFIG, "rope_theta": 10000}))
    assert '"f32": 10000.0' in text and '"f32": 10000}' not in text


@pytest.mark.parametrize("feed", ["host", "device"])
@pytest.mark.parametrize("config", [QWEN3_TINY_CONFIG, QWEN3_4B_CONFIG], ids=["tiny", "4b"])
def test_f32_manifest_verifies(config: dict[str, Any], feed: str) -> None:
    verify_manifest(manifest(config, feed=feed, precision="f32"))


def test_f32_manifest_keeps_weights_bf16_and_everything_else_f32() -> None:
    m = manifest(QWEN3_4B_CONFIG, feed="device", precision="f32")
    b = m["buffers"]
    assert {n: v for n, v in b.items() if v["kind"] == "weight"} == {
        n: v for n, v in manifest(QWEN3_4B_CONFIG)["buffers"].items() if v["kind"] == "weight"}
    floats = {n: v["dtype"] for n, v in b.items() if v["kind"] != "weight" and v["dtype"] in ("bf16", "f32")}
    assert floats == dict.fromkeys(("rope_cos", "rope_sin", "logits", "h", "x", "y", "qkv", "attn", "gu", "act"),
                                   "f32")
    assert {n: b[n]["dtype"] for n in ("ids", "positions", "slots", "seq_len", "block_table", "next_token")} == {
        "ids": "i64", "positions": "i64", "slots": "i64", "seq_len": "i32", "block_table": "i32", "next_token": "i64"}
    assert m["states"]["kv"] == {"bytes_per_token": 36 * 2 * 8 * 128 * 4, "slices": 36}
    writes = [c for c in m["programs"]["decode"]["calls"] if c["op"] == "qk_norm_rope_kv"]
    assert [c["args"][6].get("offset", 0) for c in writes] == [i * 2 * 16 * 8 * 128 * 4 for i in range(36)]
    assert writes[0]["args"][-1] == {"i64": 36 * 2 * 16 * 8 * 128}  # page stride in elements
    assert writes[-1]["args"][6]["offset"] + 2 * 16 * 8 * 128 * 4 == 16 * m["states"]["kv"]["bytes_per_token"]
    launches = [la for op in m["ops"].values() for la in op["impl"]["launches"]]
    assert {la["entry"] for la in launches} == {*gen.F32_ENTRIES, *gen.DEVICE_FEED_ENTRIES}
    assert not any("pdl" in la or "carveout" in la for la in launches)
    assert set(m["modules"]) == {"qwen3_core", "qwen3_attn"}  # FAKE_ENTRIES' two fake modules


@pytest.mark.parametrize("feed", ["host", "device"])
def test_f32_programs_run_the_f32_ops_in_the_bf16_order(feed: str) -> None:
    m = manifest(QWEN3_TINY_CONFIG, feed=feed, precision="f32")
    progs = m["programs"]
    layer = ["qkv", "qk_norm_rope_kv", "attn", "o", "post_norm", "gate_up", "silu_mul", "down", "next_norm"]
    labels = [c["label"] for c in progs["decode"]["calls"]]
    tail = ["lm_head", "argmax", *(["advance"] if feed == "device" else [])]
    assert labels == ["embed", "l0.in_norm", *(f"l{i}.{x}" for i in range(2) for x in layer), *tail]
    # prefill stops after the last layer's KV write; its GEMMs tile any rows, decode's run the GEMV
    assert [c["label"] for c in progs["prefill"]["calls"]][-2:] == ["l1.qkv", "l1.qk_norm_rope_kv"]
    assert {c["op"] for c in progs["prefill"]["calls"] if c["label"].endswith("qkv")} == {"gemm_f32_1024x256"}
    assert progs["decode"]["calls"][-len(tail)]["op"] == "gemv_f32_4096x256"
    gemm = m["ops"]["gemm_f32_1024x256"]["impl"]["launches"][0]
    assert (gemm["entry"], gemm["grid"]) == ("kern_f32_gemm", [16, {"ceil_div": ["tokens", 64]}, 1])
    gemv = m["ops"]["gemv_f32_4096x256"]["impl"]["launches"][0]
    assert (gemv["entry"], gemv["grid"]) == ("kern_f32_gemv", [512, 1, 1])
    assert [c["op"] for c in progs["load"]["calls"]] == ["rope_table"]
    assert m["ops"]["rope_table"]["impl"]["launches"][0]["entry"] == "kern_f32_rope_table"
    assert progs["decode"]["graph"] is True and ("start" in progs) == (feed == "device")


def test_f32_manifest_abi_matches_kernel_sources() -> None:
    src = TOOLS / "kernels-src"
    entries = gen.entry_modules(src)
    assert entries["kern_f32_attn"] == "qwen3_f32" and entries["kern_argmax_final"] == "sampling"
    hashes = dict.fromkeys(set(entries.values()), "c" * 64)
    m = _generate(gen.shape_from_config(QWEN3_TINY_CONFIG), hashes, entries, model="t", feed="device",
                     precision="f32")
    assert set(m["modules"]) == {"qwen3_f32", "sampling"}
    assert_abi(m["ops"], c_params(src))


@pytest.mark.parametrize(
    ("option", "flag"),
    [({"gemv": ["o"]}, "gemv"), ({"fuse": True}, "fuse"),
     ({"gemv": list(gen.GEMV_GEMMS), "pdl": True}, "gemv, pdl"),
     ({"gemv": list(gen.GEMV_GEMMS), "fold_norm": True, "defer_norm": True}, "gemv, defer_norm")],
)
def test_f32_refuses_the_bf16_speed_options(option: dict[str, Any], flag: str) -> None:
    with pytest.raises(gen.GenError, match=f"precision f32 .* drop .*{flag}") as info:
        manifest(QWEN3_TINY_CONFIG, precision="f32", **option)
    assert "\n" not in str(info.value)
    manifest(QWEN3_TINY_CONFIG, **option)  # the same options build at bf16


def test_unknown_precision_and_missing_f32_kernels_are_refused() -> None:
    with pytest.raises(gen.GenError, match="precision must be one of bf16, f32, got 'fp8'"):
        manifest(QWEN3_TINY_CONFIG, precision="fp8")
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    partial = {k: v for k, v in FAKE_ENTRIES.items() if k != "kern_f32_attn"}
    with pytest.raises(gen.KernelsError, match=r"kern_f32_attn: precision f32 needs qwen3_f32\.cu"):
        _generate(shape, FAKE_HASHES, partial, model="t", precision="f32")
    with pytest.raises(gen.KernelsError, match="qwen3_core"):
        _generate(shape, {"qwen3_attn": "b" * 64}, FAKE_ENTRIES, model="t", precision="f32")
    with pytest.raises(gen.GenError, match="chunk"):
        _generate(shape, FAKE_HASHES, FAKE_ENTRIES, model="t", chunk=0, precision="f32")


def test_f32_programs_compile_in_the_runtime_on_the_host() -> None:
    """kern_runtime stages every launch of the f32 manifest (f32 buffers, the f32 state's byte
    offsets, grids over `tokens`) with stand-in addresses, no GPU."""
    from kern_manifest import parse_manifest
    from kern_runtime._program import Resources, compile_program

    doc = manifest(QWEN3_TINY_CONFIG, feed="device", precision="f32")
    m = parse_manifest(json.dumps(doc))
    buffers = {n: (0x10000000 * (i + 1), b.nbytes(m.var_max)) for i, (n, b) in enumerate(m.buffers.items())}
    funcs = {(op, i): f"{op}#{i}" for op, o in m.ops.items() for i in range(len(o.impl.launches))}
    scratch = {op: {s: 0x7000000000 + 4096 * j for j, s in enumerate(o.impl.scratch or {})} for op, o in m.ops.items()}
    kv = 0x8000000000
    res = Resources(m, buffers, {"kv": (kv, 1 << 30)}, scratch, funcs, None, {}, "stream")
    prefill = {s.label: s.run.record for s in compile_program(res, "prefill", {"tokens": 97})}  # type: ignore[attr-defined]
    assert prefill["l0.qkv"].grid == (16, 2, 1) and prefill["l1.qk_norm_rope_kv"].grid == (97, 8, 1)
    assert prefill["l1.qk_norm_rope_kv"].args.slot(6) == (kv + 2 * 16 * 2 * 128 * 4).to_bytes(8, "little")
    decode = [(s.label, s.run.record) for s in compile_program(res, "decode", {"tokens": 1})]  # type: ignore[attr-defined]
    grids = {label: rec.grid for label, rec in decode}
    assert grids["l0.attn"] == (1, 4, 1) and grids["lm_head"] == (512, 1, 1) and grids["l0.gate_up"] == (192, 1, 1)
    assert [label for label, _ in decode].count("argmax") == 2
    assert len(compile_program(res, "load", {})) == 1 and len(compile_program(res, "start", {})) == 4


def test_f32_launch_constants_match_qwen3_f32_cu() -> None:
    text = (TOOLS / "kernels-src" / "qwen3_f32.cu").read_text()
    defines = {name: int(v) for name, v in re.findall(r"#define (F32_\w+) (\d+)", text)}
    assert defines["F32_GEMM_BM"] == defines["F32_GEMM_BN"] == gen.F32_GEMM_TILE
    assert defines["F32_GEMV_WARPS"] == gen.F32_GEMV_COLS
    assert defines["F32_ATT_WARPS"] * 32 == gen.F32_ATTN_THREADS
    m = manifest(QWEN3_4B_CONFIG, precision="f32")
    blocks = {la["entry"]: la["block"][0] for op in m["ops"].values() for la in op["impl"]["launches"]}
    # every entry's __launch_bounds__ admits the block the generator launches
    limits: dict[str, int] = {}
    for expr, entry in re.findall(r"__launch_bounds__\(([^)]*)\)\s*(kern_\w+)", text):
        factors = [defines[f] if f in defines else int(f) for f in (x.strip() for x in expr.split("*"))]
        limits[entry] = math.prod(factors)
    assert set(limits) == {e for e in gen.F32_ENTRIES if e.startswith("kern_f32_")}
    # NOTE: the GEMM (16 x 16 threads), GEMV (8 warps), attention (8 warps), SiLU and argmax (256-thread
    # strides) index by a fixed block, so a smaller one would leave work undone; q/k norm takes
    # head_dim / 2 (64 for the 4B), the row kernels any multiple of 32: every block is its bound.
    assert {e: blocks[e] for e in limits if e != "kern_f32_rope_table"} == {
        e: n for e, n in limits.items() if e != "kern_f32_rope_table"}
    assert blocks["kern_f32_rope_table"] <= limits["kern_f32_rope_table"]
