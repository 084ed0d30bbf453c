"""The host side of tools/lab/time_rows_step.py (call kinds and their sums), on the CPU."""

from __future__ import annotations

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
