"""kern_qwen3.passes: PDL and the deferred norm fold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.qwen3_options import (
    manifest,
    verify_manifest,
)

import kern_qwen3 as gen
from kern_qwen3 import QWEN3_4B_CONFIG

TOOLS = Path(__file__).resolve().parents[2]


def test_pdl_marks_every_decode_launch_and_nothing_else() -> None:
    m = manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True)
    verify_manifest(m)

    def launches(program: str) -> list[dict[str, Any]]:
        return [la for c in m["programs"][program]["calls"] for la in m["ops"][c["op"]]["impl"]["launches"]]

    step = launches("decode")
    assert step[0]["entry"] == "kern_embed" and "pdl" not in step[0]
    assert all(la.get("pdl") is True for la in step[1:])
    assert not any("pdl" in la for p in ("prefill", "load", "start") for la in launches(p))
    ops = {c["op"] for c in m["programs"]["decode"]["calls"]}
    assert {"embed", "rmsnorm.pdl", "add_rmsnorm.pdl", "qk_norm_rope_kv"} <= ops
    with pytest.raises(gen.GenError, match="pdl needs every decode GEMM"):
        manifest(QWEN3_4B_CONFIG, feed="device", gemv=["o", "gate_up", "lm_head"], pdl=True)


@pytest.mark.parametrize("feed", ["host", "device"])
def test_nothing_before_the_attention_writes_what_it_reads_before_its_pdl_wait(feed: str) -> None:
    """kern_attn_decode_rows reads seq_len and the block table before its PDL wait, and that code may
    overlap any launch back to the step's first (the only launch without PDL). So no call before an
    attention may write those buffers: in the decode step only the advance, after the argmax, does."""
    m = manifest(QWEN3_4B_CONFIG, feed=feed, gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True)
    calls = m["programs"]["decode"]["calls"]

    def written(call: dict[str, Any]) -> set[str]:
        params = m["ops"][call["op"]]["params"]
        return {a["buf"] for p, a in zip(params, call["args"], strict=True)
                if "buf" in a and p.split()[0] in ("out", "inout")}  # fmt: skip

    attn = [i for i, c in enumerate(calls) if c["label"].endswith(".attn")]
    assert len(attn) == 36
    for i in attn:
        _qkv, _kv, table, seq_len, *_ = calls[i]["args"]
        before = set().union(*(written(c) for c in calls[:i]))
        assert not before & {table["buf"], seq_len["buf"]}, calls[i]["label"]
    writers = [c["label"] for c in calls if {"block_table", "step_len"} & written(c)]
    assert writers == (["advance"] if feed == "device" else [])


def test_defer_norm_folds_into_the_deferred_bands() -> None:
    """fold_norm + defer_norm: qkv and gate_up run gemv_defer.cu's entries on one wave of
    GEMV_DEFER_BLOCKS blocks per SM (no dynamic shared memory), with the fold's arguments; it needs
    fold_norm and a hidden size the registers hold."""
    m = manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True, fold_norm=True,
                  defer_norm=True)
    verify_manifest(m)
    base = manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True)
    decode = {c["label"]: c for c in m["programs"]["decode"]["calls"]}
    was = {c["label"]: c for c in base["programs"]["decode"]["calls"]}
    norms = {f"l{i}.post_norm" for i in range(36)} | {f"l{i}.next_norm" for i in range(35)}
    assert decode.keys() == was.keys() - norms  # every norm before qkv and gate_up folds in
    for label, op, entry, n in (("l3.qkv", "gemv_b4_d_6144x2560", "kern_gemv_bf16_b4_d", 6144),
                                ("l3.gate_up", "gemv_b4_silu_d_9728x2560", "kern_gemv_bf16_b4_silu_d", 9728)):
        assert decode[label]["op"] == op and len(decode[label]["args"]) == 6
        (launch,) = m["ops"][op]["impl"]["launches"]
        per_block = -(-n // (gen.GEMV_SMS * gen.GEMV_DEFER_BLOCKS))
        assert gen.defer_launch(n) == (-(-n // per_block), 128, 0)
        assert gen.defer_launch(n, 2)[0] == -(-n // -(-n // (gen.GEMV_SMS * 2))) <= gen.GEMV_SMS * 2
        assert (launch["entry"], launch["grid"], launch["block"]) == (entry, [gen.defer_launch(n)[0], 1, 1], [128, 1, 1])
        assert "shared_mem" not in launch and launch["pdl"] is True
        assert launch["args"][6:] == [{"i32": 1}, {"i32": n}, {"i32": 2560}, {"i32": n}, {"f32": 1e-6}]
    # The product's fold has no prefetched forms: every pick folds into the bands.
    assert not gen.DEFER_NORMS.prefetched
    assert f"constexpr int DEFER_MAXP = {gen.DEFER_MAX_K // 1024};" in (TOOLS / "kernels-src" / "gemv_defer.cuh").read_text()
    text = (TOOLS / "kernels-src" / "gemv_defer.cu").read_text()
    assert text.count(f"__launch_bounds__(128, {gen.GEMV_DEFER_BLOCKS})") == 2
    with pytest.raises(gen.GenError, match="needs --fold-norm too"):
        manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), defer_norm=True)
    with pytest.raises(gen.GenError, match="holds at most 4096"):
        manifest({**QWEN3_4B_CONFIG, "hidden_size": 5120}, feed="device", gemv=list(gen.GEMV_GEMMS), fold_norm=True,
                  defer_norm=True)


