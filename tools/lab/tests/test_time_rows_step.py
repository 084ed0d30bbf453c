"""The host side of tools/lab/time_rows_step.py (call kinds and their sums) and of
tools/lab/rows_variants.py (its manifests and table), on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import time_rows_step as trs


def test_kind_drops_the_layer_and_keeps_other_labels() -> None:
    assert trs.kind("l7.qkv") == "qkv" and trs.kind("l35.attn") == "attn"
    assert trs.kind("lm_head") == "lm_head" and trs.kind("embed") == "embed"
    assert trs.kind("l0") == "l0" and trs.kind("lx.qkv") == "lx.qkv"


def test_by_kind_counts_and_sums_in_us_largest_first() -> None:
    calls = [("l0.qkv", 0.010), ("l1.qkv", 0.012), ("l0.attn", 0.050), ("lm_head", 0.180)]
    got = trs.by_kind(calls)
    assert list(got) == ["lm_head", "attn", "qkv"]
    assert got["qkv"][0] == 2 and abs(got["qkv"][1] - 22.0) < 1e-9
    table = trs.table("t", got)
    assert "| qkv | 2 | 11.00 | 22.0 |" in table and "sum 252.0 us" in table


def test_rows_variants_writes_the_product_manifest_and_one_per_build(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """tools/lab/rows_variants.py's manifests: `batch` is the shipped batch example's plan, each build
    its batched attention on that entry (the kernel builds faked with fixed hashes)."""
    import rows_variants as rv

    import kern_lab
    import kern_mining.build

    monkeypatch.setattr(kern_mining.build, "build_kernels",
                        lambda src, out, **kw: {m: (out / f"{m}.cubin", "a" * 64) for m in
                                                ("attention", "gemv", "gemv_defer", "prefill", "qwen3_core",
                                                 "sampling", "sampling_rows", "qwen3_f32")})
    modules = sorted(set(kern_lab.lab_entry_modules().values()) - {"attention", "gemv", "gemv_defer", "prefill",
                                                                    "qwen3_core", "sampling", "sampling_rows",
                                                                    "qwen3_f32"})
    monkeypatch.setattr(kern_lab, "build_lab_kernels", lambda out, **kw: {m: (out / f"{m}.cubin", "b" * 64)
                                                                           for m in modules})
    paths = rv.manifests(tmp_path, ["kern_attn_decode_rows_flat8"], one_row=False)
    assert sorted(paths) == ["batch", "flat8"]
    flat = json.loads(paths["flat8"].read_text())
    (launch,) = flat["ops"]["attn_decode_rows"]["impl"]["launches"]
    assert launch["entry"] == "kern_attn_decode_rows_flat8" and launch["module"] == "attention_rows_flat8"
    base = json.loads(paths["batch"].read_text())
    assert base["ops"]["attn_decode_rows"]["impl"]["launches"][0]["entry"] == "kern_attn_decode_rows"


def test_rows_variants_table_lines_up_the_manifests() -> None:
    import rows_variants as rv

    results = {"batch": [{"name": "rows64_ms@128", "value": 7.65, "unit": "ms"},
                         {"name": "rows64_in_turn_ms@128", "value": 8.0, "unit": "ms"}],
               "flat8": [{"name": "rows64_ms@128", "value": 5.5, "unit": "ms"}]}
    text = rv.table(results)
    assert "| rows64_ms@128 | 7.650 | 5.500 |" in text and "in_turn" not in text
