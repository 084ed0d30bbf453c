"""kern_lab.entries against the lab's sources: gemv_alt.cu's table and gemv_defer_p4.cu's forms."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.gemv_source import source_table

import kern_lab as lab
import kern_qwen3 as gen

TOOLS = Path(__file__).resolve().parents[2]
ALT = TOOLS / "lab" / "kernels-src" / "gemv_alt.cu"


def test_alt_entries_table_matches_gemv_alt_cu() -> None:
    """ALT_ENTRIES is the launch shape each GEMV entry of gemv_alt.cu declares; the GEMV_* macros
    are built at kern_gemv_bf16's row (4, 1, 4, 1) and the streaming stage cap is the one
    kern_qwen3 sizes launches with."""
    text = ALT.read_text()
    assert source_table(text) == dict(lab.ALT_ENTRIES)
    defines = dict(re.findall(r"^#define (GEMV_\w+) (\d+)$", text, re.MULTILINE))
    assert {m: int(defines[m]) for m in ("GEMV_WARPS", "GEMV_RPW", "GEMV_UNROLL", "GEMV_SPLIT")} == {
        "GEMV_WARPS": 4, "GEMV_RPW": 1, "GEMV_UNROLL": 4, "GEMV_SPLIT": 1}
    assert int(defines["GEMV_TMA_CAP"]) == gen.GEMV_TMA_STAGE_CAP


def test_lab_tables_name_lab_entries_beside_the_products() -> None:
    """The lab's GEMV and deferred entries live in the lab's modules, the product's stay where
    they are, and no name is in both tables."""
    modules = lab.lab_entry_modules(lab_src=TOOLS / "lab" / "kernels-src", product_src=TOOLS / "kernels-src")
    assert not set(lab.ALT_ENTRIES) & set(gen.GEMV_ENTRIES)
    assert {modules[e] for e in lab.ALT_ENTRIES} == {"gemv_alt"} and modules["kern_gemv_bf16_acc"] == "gemv_alt"
    assert {modules[e] for e in lab.DEFER_P4.values()} == {"gemv_defer_p4"}
    assert {modules[e] for e in gen.GEMV_ENTRIES} == {"gemv"}
    assert set(lab.DEFER_P4) <= set(lab.LAB_GEMV_ENTRIES)
    assert all(lab.LAB_GEMV_ENTRIES[e].layout is gen.Layout.PREFETCH for e in lab.DEFER_P4)
