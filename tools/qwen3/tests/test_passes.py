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




def _gemm_launches(m: dict[str, Any], program: str) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """(n, k) -> the launches of the op each GEMM call of `program` names."""
    out: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for c in m["programs"][program]["calls"]:
        if c["op"].startswith("gemm"):
            out[(c["args"][4]["i32"], c["args"][5]["i32"])] = m["ops"][c["op"]]["impl"]["launches"]
    return out


def test_gemm_algos_pin_the_var_m_gemms_by_range_and_cover_every_m() -> None:
    """Each 4B GEMM of the prefill (m = tokens) and the batched step (m = rows) gets an op whose
    launches' `when` ranges cover 1..the var's max once each, pinned as the table says; the one-row
    step's cuBLASLt GEMMs (m the tokens var, 1 there) share the prefill's ops."""
    m = manifest(QWEN3_4B_CONFIG, feed="device", rows=64, gemm_algos="h200")
    verify_manifest(m)
    table = gen.GEMM_ALGO_TABLES["h200"]
    for program, var, top in (("prefill", "tokens", gen.DEFAULT_CHUNK), ("decode_rows", "rows", 64)):
        ops = {c["op"] for c in m["programs"][program]["calls"] if c["op"].startswith("gemm")}
        assert ops and all(op.endswith(f"_{var}") for op in ops)
        for (n, k), launches in _gemm_launches(m, program).items():
            covered = [v for la in launches for v in range(la["when"]["min"], la["when"]["max"] + 1)]
            assert covered == list(range(1, top + 1)), (program, n, k)
            assert all(la["when"]["var"] == var and la["entry"] == "extern:cublaslt_bf16_tn" for la in launches)
            runs = [r for r in table[(n, k)] if r[0] <= top]
            assert [la["when"]["min"] for la in launches] == [r[0] for r in runs]
            for la, (_, algo) in zip(launches, runs, strict=True):
                assert ("algo" in la) == (algo is not None)
                if algo is not None:
                    assert la["algo"]["id"] == algo[0] and la["algo"]["tile"] == algo[1]
    pinned = manifest(QWEN3_4B_CONFIG, feed="device", gemm_algos="h200")
    step = {c["op"] for c in pinned["programs"]["decode"]["calls"] if "gemm" in c["op"]}
    assert step == {c["op"] for c in pinned["programs"]["prefill"]["calls"] if "gemm" in c["op"]} | {
        "gemm_151936x2560_tokens"}
    assert "gemm" not in pinned["ops"]


def test_gemm_algos_leave_shapes_the_table_does_not_list() -> None:
    from kern_qwen3 import QWEN3_TINY_CONFIG

    assert manifest(QWEN3_TINY_CONFIG, feed="device", gemm_algos="h200") == manifest(QWEN3_TINY_CONFIG, feed="device")


def test_gemm_algo_tables_are_checked() -> None:
    from kern_qwen3 import gemm_algos

    with pytest.raises(gen.GenError, match="no gemm algo table 'h100'; tables: h200"):
        gen.GemmAlgos("h100")
    with pytest.raises(gen.GenError, match="must start at m 1 and ascend"):
        gemm_algos._check_runs("t", {(8, 8): ((2, None),)})  # pyright: ignore[reportPrivateUsage]
    with pytest.raises(gen.GenError, match="must start at m 1 and ascend"):
        gemm_algos._check_runs("t", {(8, 8): ((1, None), (9, None), (9, None))})  # pyright: ignore[reportPrivateUsage]
